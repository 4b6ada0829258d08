"""The steps of one load run around the planner and the runner: the --setting names and
values checked before any table is made, the settings and engine threads each job
reads with, the files refused before loading (failed, in the ledger), and at the end
the report summed up (with a note where --incremental-by keeps every version of an
updated row) and the run's record written. Apart from api.py so the public
API's module holds the API and the order of a run's steps, not each step's detail.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chload.commit.ledger import FAILED, FileEvent, RunRecord
from chload.core import plan as planner, run as runner
from chload.core.run import Event, FileResult, Listener
from chload.errors import ChloadError, TerminalError, UsageError
from chload.schema import (
    Column,
    bare_type,
    quote_ident,
    quote_str,
    settings_sql,
    split_top_level,
    unquote_ident,
)
from chload.sources.base import SourceFile
from chload.sources.run import RunSources
from chload.targets.base import Target

if TYPE_CHECKING:
    from chload.api import LoadReport, LoadSpec

# A file whose header (or JSON keys) names a column the table lacks fails, as the
# sample's columns are checked (schema.match_columns), instead of loading without it:
# chDB skips unknown fields by default (18.16 does not). A --setting overrides it.
_READ_STRICT = (("input_format_skip_unknown_fields", "0"),)


def _job_settings(spec: LoadSpec) -> tuple[tuple[str, str], ...]:
    """The user's settings and chload's read defaults they do not set (no name twice:
    in one SETTINGS clause the engine keeps the first)."""
    given = {name for name, _ in spec.settings}
    return (*spec.settings, *(s for s in _READ_STRICT if s[0] not in given))


def _threads_per_file(workers: int, jobs: int) -> int:
    """Engine threads per file: the cores shared among the files loading at once (the
    engine's default, parallel parsing in every file, spends more CPU for the same wall
    time); a lone file gets every core."""
    return max(1, (os.cpu_count() or 2) // max(1, min(workers, jobs)))


def _refuse(target: Target, table: planner.TableName,
            refused: Sequence[tuple[SourceFile, str]], run_id: str,
            listener: Listener) -> list[FileResult]:
    """Files refused before loading (planner.check_headers): failed, in the ledger too."""
    if refused:
        target.ledger.record([FileEvent(table.display, f.uri, f.identity, f.size, f.mtime_ns,
                                        FAILED, error=why, run_id=run_id) for f, why in refused])
    for f, why in refused:
        listener(Event("fail", f.uri, error=why))
    return [FileResult(f.uri, "failed", error=why) for f, why in refused]


def _check_settings(target: Target, settings: Sequence[tuple[str, str]]) -> None:
    """Each --setting a name the engine knows, with a value it takes, before any table
    is created (else every file failed on it, after an empty table was made).

    A server target applies a setting on the server if the server knows it, else in the
    loader's engine (a push): either may know it, and the one that does checks the value.
    """
    if not settings:
        return
    names = {name for name, _ in settings}
    engines = [target.rows]
    if target.infer_rows != target.rows:  # a server: then its loader's engine (chDB)
        engines.append(target.infer_rows)
    known: dict[str, Any] = {}
    for ask in engines:
        wanted = sorted(names - set(known))
        if wanted:
            listed = ", ".join(quote_str(n) for n in wanted)
            known.update((row["name"], ask) for row in ask(
                f"SELECT name FROM system.settings WHERE name IN ({listed})"))
    for name, value in settings:
        if name not in known:
            raise UsageError(f"--setting {name}: {target.display} has no such setting (see "
                             "SELECT name FROM system.settings); nothing was loaded")
        try:
            known[name](f"SELECT 1 AS ok SETTINGS {settings_sql([(name, value)])}")
        except TerminalError as exc:
            reason = exc.reason
            raise UsageError(f"--setting {name}={value}: {reason}; nothing was loaded") from exc


def _finish(target: Target, run: RunRecord) -> None:
    """The last two ledger writes at once: `loaded` events still buffered (flush) and
    the run's record (one round trip less at the end of every load)."""
    runner.on_threads(lambda write: write(), [target.flush,
                                              lambda: target.ledger.record_run(run)], 2)


# What each of the last writes failing leaves, said after its error.
UNWRITTEN_LOADED = ("the ledger's last writes (`loaded` events) did not reach the server; "
                    "what this run committed stands, and the next run settles their "
                    "entries (nothing loads twice)")
_UNWRITTEN = {"flush": UNWRITTEN_LOADED,
              "record": "this run's record was not written (chload history will not list it)"}


def _finish_reported(target: Target, report: LoadReport, run: RunRecord) -> None:
    """`_finish`, where an error of the last writes (a server gone mid-load) goes into
    `report.errors` once this run committed anything: raised instead, it would say the
    run loaded nothing (exit 2), while committed units stand. Nothing committed: raised."""
    failed: dict[str, ChloadError] = {}

    def write(step: tuple[str, Callable[[], None]]) -> None:
        try:
            step[1]()
        except ChloadError as exc:
            failed[step[0]] = exc

    runner.on_threads(write, [("flush", target.flush),
                              ("record", lambda: target.ledger.record_run(run))], 2)
    if failed and not _committed_any(target, report):
        raise next(iter(failed.values()))
    report.errors += [f"{exc}: {_UNWRITTEN[step]}" for step, exc in failed.items()]


def _committed_any(target: Target, report: LoadReport) -> bool:
    """Did this run commit anything: a unit, or a share of one on some shard of a
    cluster (a unit is loaded only once every shard has its share)?"""
    return report.files_loaded > 0 or any(s["rows"] for s in target.shard_report())


def _summarize(report: LoadReport, results: list[FileResult], plan: planner.Plan,
               seconds: float) -> None:
    report.files = results  # (files the plan skipped are counted, not listed)
    report.files_total = len(results) + plan.skipped
    report.files_loaded = sum(r.status == "loaded" for r in results)
    report.files_skipped = sum(r.status == "skipped" for r in results) + plan.skipped
    report.files_failed = sum(r.status == "failed" for r in results)
    report.files_changed = sum(r.changed for r in results)
    report.rows_loaded = sum(r.rows for r in results if r.status == "loaded")
    report.rows_rejected = sum(r.rejected for r in results if r.status == "loaded")
    report.bytes_read = sum(r.bytes for r in results)
    report.seconds = seconds
    report.created_table = plan.created_table


def _run_record(spec: LoadSpec, report: LoadReport, started_ns: int,
                sources: RunSources) -> RunRecord:
    status = "ok" if report.ok else "failed" if not report.files_loaded else "partial"
    return RunRecord(
        report.run_id, report.table, " ".join(sources.display(s) for s in spec.sources),
        started_ns,
        time.time_ns(),
        report.files_total, report.files_loaded, report.files_skipped, report.files_failed,
        report.rows_loaded, report.rows_rejected, report.bytes_read, report.seconds, status,
        os.uname().nodename,  # as socket.gethostname(), without importing socket
        json.dumps(report.concurrency, separators=(",", ":")) if report.concurrency else "",
        json.dumps(report.schema_changes, separators=(",", ":")) if report.schema_changes
        else "",
    )


# Engines that keep every row they are given: an updated row loaded again stays beside
# its older versions (the Replacing/Collapsing/... MergeTrees collapse them).
_KEEP_EVERY_ROW = {"MergeTree", "Log", "TinyLog", "StripeLog", "Memory"}


def versions_note(target: Target, table: planner.TableName, column: str,
                  key: str | None) -> str:
    """For `--incremental-by column` into `table` (a database source whose primary key
    is `key`): '' when no row can be loaded twice (the column is the key itself) or the
    table collapses versions; else a note saying every version stays, with the CREATE
    of a table that keeps the latest. A Distributed table: of its local table, on each
    shard."""
    if key is None or key.strip("`") == column:
        return ""
    found = _engine(target, table.database, table.name)
    where, shards = table, ""
    if found and found[0] == "Distributed":
        args = [a.strip("'") for a in split_top_level(_args(found[1]))]
        if len(args) < 3:
            return ""
        where, shards = planner.TableName(_name(args[1]), _name(args[2])), " on each shard"
        found = _engine(target, where.database, where.name)
    if not found or found[0].removeprefix("Replicated") not in _KEEP_EVERY_ROW:
        return ""
    columns = target.table_columns(where.sql) or []
    engine = _replacing(found, column, columns, target.engine_name)
    versioned = f" --version {column}" if engine.endswith(f"{quote_ident(column)})") else ""
    upsert = "" if shards else (f"load into a new table with --upsert-key "
                                f"{re.sub(r'[`() ]', '', key)}{versioned}, or ")
    body = ", ".join(Column(c.name, bare_type(c.type) if c.name == column else c.type).sql
                     for c in columns)
    return (f"{where.display} is a {found[0]}, which keeps every row: a row updated at the "
            f"source is loaded again by --incremental-by {column}, and its older versions "
            f"stay. To keep the latest version only, {upsert}drop this table (the next load "
            "loads every row again; SELECT ... FINAL reads one version of each) and create it"
            f"{shards} as: CREATE TABLE {where.sql} ({body}) ENGINE = {engine} ORDER BY {key}")


def _engine(target: Target, database: str, name: str) -> tuple[str, str] | None:
    """The table's engine and its full clause (system.tables), None if not found."""
    found = target.rows(f"SELECT engine, engine_full FROM system.tables WHERE database = "
                        f"{quote_str(database)} AND name = {quote_str(name)}")
    return (found[0]["engine"], found[0]["engine_full"]) if found else None


def _args(clause: str) -> str:
    """The arguments of an engine clause: `a, b` of `Engine(a, b) ORDER BY ...`."""
    start = clause.find("(")
    depth, end = 0, start
    for end in range(start, len(clause)):
        depth += {"(": 1, ")": -1}.get(clause[end], 0)
        if depth == 0:
            break
    return clause[start + 1:end] if start >= 0 else ""


def _name(arg: str) -> str:
    return unquote_ident(arg) if arg[:1] in ("`", '"') else arg


def _replacing(found: tuple[str, str], column: str, columns: Sequence[Column],
               engine_name: str) -> str:
    """ReplacingMergeTree (Replicated with the same path and replica) whose version is
    `column` where its type may be one (18.16: UInt*, Date, DateTime; the embedded
    engine: any number or date too); without one, the row loaded last stays, which
    --incremental-by loads in order."""
    typ = next((bare_type(c.type) for c in columns if c.name == column), "")
    version = bool(re.match(r"U?Int|Date", typ)) if engine_name == "chdb" else \
        bool(re.match(r"UInt|Date", typ))
    replicated = found[0].startswith("Replicated")  # its path and replica name, kept
    args = split_top_level(_args(found[1]))[:2] if replicated else []
    args += [quote_ident(column)] if version else []
    return f"{'Replicated' if replicated else ''}ReplacingMergeTree({', '.join(args)})"
