"""Drawing for the CLI: the progress bar, the summary, the ledger and history tables.

Only the CLI imports this module. rich is imported only for a terminal; piped output
is plain tab-separated text that scripts can read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from chload.api import Concurrency, FileCheck, LoadReport, ShardLoad
from chload.commit.ledger import FileEvent
from chload.core.run import Event, Poll


class ProgressView:
    """A rich progress bar on stderr: files done/total, bytes, rows, rows/s, ETA.

    The bar advances by bytes (as listed), so the ETA follows the work left even when
    files differ in size. A unit's bytes count up to its listed size at most: the
    engine's own count of what it read can be larger (chDB reading S3 objects), and a bar
    past its total would show no time left while a fifth of the load remains.
    """

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]loading"), BarColumn(), TextColumn("{task.fields[files]}"),
            DownloadColumn(), TextColumn("{task.fields[rows]} rows"),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
            _left_column(self), console=self._console, transient=True,
        )
        self._task = self._progress.add_task("load", total=None, files="0/? files", rows="0",
                                             rate="")
        self._unit = "file"  # a database's range, a Kafka batch: the plan event says
        self._files_total = 0
        self._files_done = 0
        self._rows = 0
        self._lag: dict[str, int] = {}  # a Kafka load: messages due per partition
        self._started = time.monotonic()
        self.eta = TimeLeft()

    def __enter__(self) -> ProgressView:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def on_event(self, event: Event) -> None:
        if event.kind == "plan":
            self._files_total = event.files_total
            self._unit = event.unit or self._unit
            self.eta.plan(event.bytes_total)
            self._progress.update(self._task, total=event.bytes_total or None)
        elif event.kind == "start":
            self.eta.start(event.uri, event.bytes)
        elif event.kind == "progress":  # parsed (not yet committed): moves the bar
            self._rows += event.rows
            self._progress.advance(self._task, self.eta.advance(event.uri, event.bytes))
        elif event.kind in ("done", "skip"):
            self._files_done += 1
            self._progress.advance(self._task, self.eta.finish(event.uri))
        elif event.kind == "fail":
            self._files_done += 1
            self._progress.advance(self._task, self.eta.finish(event.uri))
            self._console.print(f"[red]failed[/red] {event.error}", highlight=False)
        elif event.kind == "lag":
            self._lag[event.uri] = event.rows
        else:
            return
        rate = self._rows / max(time.monotonic() - self._started, 1e-6)
        lag = f", lag {sum(self._lag.values()):,}" if self._lag else ""
        done = f"{self._files_done}/{_count(self._files_total, self._unit)}"
        self._progress.update(self._task, files=done,
                              rows=f"{self._rows:,}", rate=f"{rate:,.0f} rows/s{lag}")


class TimeLeft:
    """The bar's bytes and its ETA: the work left at the rate since the plan, the work
    done counting the units under way.

    Units report their bytes when parsed, a whole file or group of files at once: into
    a server several long units are under way at once, and the bytes done lag the work
    done by about half of them. rich's estimate (the speed between its first and
    last samples of the last 30 s) took a burst of units' bytes over the moments between
    two bursts. Here a unit under way counts the share of its listed size that its age
    is of the time units have taken per byte so far, at most half (as much as units under
    way have done on average in a steady run; more let units slowed by a busy machine
    count as nearly done, and the ETA fell far short). A unit announced with its listed size (a
    `start` event's bytes) is credited at most that size, all of it once it ends (done,
    skipped or failed: no work of it is left).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._planned_at: float | None = None
        self._total = 0
        self._credited = 0
        self._took = [0.0, 0]  # seconds and bytes of the units credited whole so far
        # uri: [listed size, reported, credited, started at]
        self._units: dict[str, list[float]] = {}

    def plan(self, total: int) -> None:
        self._planned_at, self._total = self._clock(), total

    def start(self, uri: str, size: int) -> None:
        self._units[uri] = [size, 0, 0, self._clock()]

    def advance(self, uri: str, read: int) -> int:
        """Bytes to move the bar by for `read` bytes reported of `uri`."""
        unit = self._units.get(uri)
        if unit is None or unit[0] <= 0:
            return self._credit(read)
        unit[1] += read
        return self._credit_unit(unit, min(unit[0], max(0, unit[1])))

    def finish(self, uri: str) -> int:
        """`uri` ended: the rest of its listed size (a unit of a batch: none)."""
        unit = self._units.pop(uri, None)
        return self._credit_unit(unit, unit[0]) if unit and unit[0] > 0 else 0

    def _credit_unit(self, unit: list[float], credited: float) -> int:
        moved = int(credited - unit[2])
        if unit[2] <= 0 < moved and credited >= unit[0]:  # reported whole: its time
            self._took[0] += self._clock() - unit[3]
            self._took[1] += int(unit[0])
        unit[2] = credited
        return self._credit(moved)

    def _credit(self, moved: int) -> int:
        self._credited += moved
        return moved

    def _under_way(self, now: float) -> float:
        """The work done of units not yet credited: the share of each one's size that
        its age is of its expected time (seconds per byte so far), at most half."""
        seconds, size = self._took
        if not size:
            return 0.0
        per_byte = seconds / size
        return sum(u[0] * min(0.5, (now - u[3]) / (u[0] * per_byte))
                   for u in self._units.values() if u[0] > 0 and u[2] <= 0 < per_byte)

    def seconds(self) -> float | None:
        """The time left, or None before anything was credited (or without a total)."""
        if not self._total or self._credited <= 0 or self._planned_at is None:
            return None
        now = self._clock()
        done = min(self._total, self._credited + self._under_way(now))
        spent = now - self._planned_at
        if spent <= 0 or done <= 0:
            return None
        return max(0.0, (self._total - done) * spent / done)


def _left_column(view: ProgressView) -> Any:
    """A rich column showing the view's ETA (h:mm:ss, or -:--:-- before any estimate)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class TimeLeftColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            left = view.eta.seconds()
            if left is None:
                return Text("-:--:--", style="progress.remaining")
            minutes, secs = divmod(int(left + 0.5), 60)
            hours, minutes = divmod(minutes, 60)
            return Text(f"{hours}:{minutes:02d}:{secs:02d}", style="progress.remaining")

    return TimeLeftColumn()


def print_summary(report: LoadReport) -> None:
    parts = [f"{report.files_loaded} loaded", f"{report.files_skipped} skipped"]
    if report.files_failed:
        parts.append(f"{report.files_failed} failed")
    if report.rows_rejected:
        parts.append(f"{report.rows_rejected:,} rows rejected (chload errors --table "
                     f"{report.table})")
    if report.files_changed:
        parts.append(f"{report.files_changed} changed since last load")
    print(f"{report.table}: {_count(report.files_total, report.unit)}: {', '.join(parts)}; "
          f"{report.rows_loaded:,} rows, {_size(report.bytes_read)} in {report.seconds:.2f} s"
          f" ({report.rows_per_second:,.0f} rows/s)")
    if report.listing_calls:
        print(f"  listed in {report.listing_calls:,} request"
              f"{'s' if report.listing_calls != 1 else ''}")
    if report.table_reset:
        print(f"  {report.table_reset}")
    for change in report.schema_changes:
        print(f"  added column {change['column']} {change['type']} to {change['table']} "
              f"(first in {change['unit']})")
    for note in report.notes:
        print(f"  note: {note}")
    sat = report.saturation
    if sat and report.files_loaded:
        busy, used = sat["disk_util_pct"], sat["cpu_util_pct"]
        disk = f", disk {sat['disk']} {busy:.0f}% busy" if busy is not None else ""
        cpu = f"{used:.0f}%" if used is not None else "?"
        print(f"  saturation: CPU {cpu} of {sat['cores']} cores{disk}; "
              f"limit: {sat['bottleneck']}{_streams(report.concurrency)}")
    committed = report.files_loaded or any(s["rows"] for s in report.shards)
    for shard in report.shards if committed else []:  # (shares of units not yet whole too)
        print(f"  {_shard_line(shard)}")
    if len(report.shards) > 1 and report.files_loaded:
        slowest = max(report.shards, key=lambda s: s["seconds"])
        print(f"  slowest shard: {slowest['shard']} ({slowest['seconds']:.2f} s committing)")
    print_failures(report)


def poll_line(poll: Poll) -> str:
    """One poll of a load that follows files, in one line: what it loaded and listed,
    files left for the next poll, and each file found changed since it was loaded."""
    calls = "1 listing call" if poll.listing_calls == 1 else \
        f"{poll.listing_calls} listing calls"
    parts = [f"{poll.files} new {'file' if poll.files == 1 else 'files'}",
             f"{poll.rows:,} {'row' if poll.rows == 1 else 'rows'}", calls,
             f"{poll.seconds:.2f} s"]
    if poll.waiting:
        parts.append(f"{poll.waiting} still being written (next poll)")
    if poll.failed:
        parts.append(f"{poll.failed} failed")
    if poll.changed:
        parts.append(f"changed since loaded, not loaded again (--force loads them): "
                     f"{_few(poll.changed)}")
    if poll.reloaded:
        parts.append(f"changed since loaded, loaded again (--force): {_few(poll.reloaded)}")
    if poll.error:
        parts.append(f"error (next poll tries again): {poll.error}")
    return f"poll {poll.number}: {', '.join(parts)}"


def _few(uris: Sequence[str], shown: int = 3) -> str:
    more = f" and {len(uris) - shown} more" if len(uris) > shown else ""
    return ", ".join(uris[:shown]) + more


def _count(n: int, unit: str) -> str:
    """`3 files`, `1 range`, `2 batches`: units as their source names them."""
    if n == 1:
        return f"1 {unit}"
    return f"{n} {unit}es" if unit.endswith(("ch", "sh", "s", "x")) else f"{n} {unit}s"


def _shard_line(shard: ShardLoad) -> str:
    """A shard's rows, and what its server did meanwhile (targets/cluster/shard_load.py)."""
    line = (f"shard {shard['shard']} ({shard['replica']}): {shard['rows']:,} rows, "
            f"{shard['seconds']:.2f} s committing")
    server = shard["server"]
    cpu, pct = server.get("cpu_s"), server.get("cpu_util_pct")
    if cpu is None:
        return line + "; its server's counters: not read"
    line += f"; server CPU {cpu:.2f} s ({pct or 0:.0f}% of {server.get('cores')} cores)"
    wait = server.get("cpu_wait_pct")
    if wait is not None:
        line += f", waited for a CPU {wait:.0f}% of its run time"
    if server.get("merges_running"):
        line += f", {server['merges_running']} merges running"
    return line + f"; limit: {server.get('bottleneck', 'unknown')}"


def _streams(c: Concurrency | None) -> str:
    """The streams' part of the saturation line: how many, and what bounded them."""
    if not c:
        return ""
    if c["mode"] == "fixed":
        return f"; streams: {c['final']} ({c['bound']})"
    n = len(c["changes"])
    moved = (f"{c['start']} -> {c['final']} (from {c['lowest']} to {c['highest']}, "
             f"{n} change{'s' if n > 1 else ''})" if n else f"{c['final']}")
    return f"; streams: auto, {moved}, bound: {c['bound']}"


def print_failures(report: LoadReport) -> None:
    """One line per failed file, and per error of the run's last writes, on stderr
    (--quiet too: an exit status alone says not which file, nor what to do)."""
    for result in report.files:
        if result.status == "failed":
            print(f"  failed: {result.error}", file=sys.stderr)
    for error in report.errors:
        print(f"  error: {error}", file=sys.stderr)


def print_files(table: str, events: Sequence[FileEvent]) -> None:
    if not events:
        print(f"no files recorded for {table}", file=sys.stderr)
        return
    header = ["file", "state", "rows", "bytes", "loaded_at", "error"]
    rows = [[e.uri, e.state, str(e.rows), str(e.size), _when(e.seq), e.error] for e in events]
    if any(" shard " in e.target_table for e in events):  # a cluster: a row per shard
        header.insert(1, "shard")
        for row, e in zip(rows, events, strict=True):
            row.insert(1, e.target_table.rpartition(" shard ")[2] if " shard " in
                       e.target_table else "-")
    _table(f"files of {table}", header, rows)


def print_history(runs: Sequence[dict[str, Any]]) -> None:
    header = ["started", "table", "loaded", "skipped", "failed", "rows", "seconds", "rows/s",
              "streams", "columns added", "sources"]
    rows = [[_when(int(r["started_ns"])), r["target_table"], str(r["files_loaded"]),
             str(r["files_skipped"]), str(r["files_failed"]), str(r["rows_loaded"]),
             f"{float(r['seconds']):.2f}",
             f"{int(r['rows_loaded']) / max(float(r['seconds']), 1e-9):,.0f}",
             _run_streams(str(r.get("concurrency") or "")),
             _added(str(r.get("schema_changes") or "")), r["sources"]]
            for r in runs]
    _table("load history", header, rows)


def _added(recorded: str) -> str:
    """The columns a run added (--on-new-column add), `c, d`; `-` if none."""
    if not recorded:
        return "-"
    import json

    return ", ".join(c["column"] for c in json.loads(recorded)) or "-"


def _run_streams(recorded: str) -> str:
    """A run's streams in a word: `8`, or `auto 8->4 (3 changes)` (chload history --json
    has each change and its reason)."""
    if not recorded:
        return "-"
    import json

    c = json.loads(recorded)
    if c["mode"] == "fixed" or not c["changes"]:
        return f"{c['mode']} {c['final']}"
    n = len(c["changes"])
    return f"auto {c['start']}->{c['final']} ({n} change{'s' if n > 1 else ''})"


def print_rejects(table: str, rows: Sequence[dict[str, Any]]) -> None:
    _table(f"rejected rows of {table}", ["file", "line", "error", "raw"],
           [[r["file"], str(r["line"]), r["error"], r["raw"][:200]] for r in rows])


def print_checks(checks: Sequence[FileCheck]) -> None:
    rows = []
    for c in checks:
        first = c.first_errors[0] if c.first_errors else None
        detail = c.failure or (f"line {first['line']}: {first['error']}" if first else "")
        verdict = "unreadable" if c.failure else "would load" if c.within_budget else "would fail"
        rows.append([c.uri, str(c.rows), str(c.errors), verdict,
                     detail.replace("\n", " ")[:300]])
    _table("validation (nothing was written)",
           ["file", "rows ok", "rows bad", "verdict", "first error"], rows)


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    if not sys.stdout.isatty():
        print("\t".join(header))
        for row in rows:
            print("\t".join(cell.replace("\t", " ").replace("\n", " ") for cell in row))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for name in header:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):  # decimal, as the progress bar shows them
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
