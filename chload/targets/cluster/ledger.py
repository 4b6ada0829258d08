"""The cluster's ledger: what a Distributed table's shards say of its units.

Each shard keeps its own ledger (`chload.files` on that shard, under the local table's
name), written by its own committer; this view answers the loader's questions about the
Distributed table from them, while the run history and failures before any shard was
reached stay on the target server's ledger.

Invariants: a unit is loaded when every shard it goes to has it, at one identity; each
shard records the layout its units were routed by (target_table `<local> layout`, state
`layout`) before a load whose layout differs, and a changed layout is refused where
loaded rows could move. docs/target-cluster.md ("The sharding layout is recorded") says
why and which changes are refused.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from chload.commit.known import KnownUnits
from chload.commit.ledger import FAILED, FileEvent, Ledger, TableState, own_history
from chload.errors import UsageError
from chload.schema import split_table
from chload.sources.base import SourceFile
from chload.targets.base import Loaded, LoadJob
from chload.targets.cluster.layout import Shard, at_once

if TYPE_CHECKING:
    from chload.targets.cluster.target import ClusterTarget

T = TypeVar("T")
LAYOUT = "layout"  # the state of a shard's layout record


class ClusterLedger(Ledger):
    """The cluster's ledger: a unit is loaded when every shard it goes to says so in
    its own ledger (`chload.files` on that shard, under the local table's name). Run
    history and failures before any shard was reached stay on the target server."""

    def __init__(self, cluster: ClusterTarget) -> None:
        super().__init__(cluster.entry)
        self.cluster = cluster

    def _ours(self, target_table: str) -> bool:
        return target_table == self.cluster.table_display

    def table_state(self, database: str, name: str) -> TableState:
        c = self.cluster
        if not self._ours(f"{database}.{name}"):
            return super().table_state(database, name)
        local = split_table(c.local)
        states = at_once([lambda s=s: self._ahead(s, 0, lambda: s.target.ledger.table_state(
            *local)) for s in c.shards])  # type: ignore[misc]
        return TableState(all(s.exists for s in states), "", sum(s.rows for s in states))

    def loaded(self, target_table: str) -> dict[str, FileEvent]:
        """uri -> event (rows summed over shards) of the units every shard it goes to
        has loaded at one identity; read once per run and kept for `_pending`."""
        c = self.cluster
        if not self._ours(target_table):
            return super().loaded(target_table)
        n = len(c.shards)
        found_on = at_once([(lambda s=s: self._ahead(s, 1, lambda: s.target.ledger.loaded(
            s.local_display))) for s in c.shards] + [(lambda s=s: self._ahead(
                s, 2, lambda: s.target.ledger.latest(f"{s.local_display} {LAYOUT}",
                                                     [LAYOUT]))) for s in c.shards])
        c.known.by_shard = {s.number: f for s, f in zip(c.shards, found_on[:n], strict=True)}
        c.relayout = check_layout(c, {s.number: f[-1].identity if f else None
                                      for s, f in zip(c.shards, found_on[n:], strict=True)})
        found: dict[str, FileEvent] = {}
        uris = {u for events in c.known.by_shard.values() for u in events}
        for uri in uris:
            events: list[FileEvent | None] = [c.known.by_shard[s.number].get(uri)
                                              for s in c.responsible(uri)]
            if c.by_file:  # a whole unit: loaded wherever it is (weights may have moved)
                events = [next(e for e in (c.known.by_shard[s.number].get(uri)
                                           for s in c.shards) if e is not None)]
            if any(e is None for e in events) or len({e.identity for e in events if e}) > 1:
                continue
            first = [e for e in events if e is not None]
            found[uri] = replace(first[0], target_table=target_table,
                                 rows=sum(e.rows for e in first))
        return found

    def known(self, target_table: str, table: TableState) -> tuple[KnownUnits, str]:
        """`loaded` (gathered from the shards, kept for `_pending` and the layout check),
        as the planner's keys."""
        if not self._ours(target_table):
            return super().known(target_table, table)
        own, why = own_history(table, self.loaded(target_table))
        return KnownUnits.of_events(own), why

    def loaded_since(self, target_table: str, table: TableState, since_ns: int,
                     own_run: str, own_since_ns: int) -> array | None:
        """None for the Distributed table: `known` gathers it from the shards each time
        (and keeps what `_pending` and the layout check need)."""
        if not self._ours(target_table):
            return super().loaded_since(target_table, table, since_ns, own_run, own_since_ns)
        return None

    def _ahead(self, shard: Shard, i: int, ask: Callable[[], T]) -> T:
        """The shard's answer read ahead at recovery (ClusterTarget._recover), once;
        else (or if reading it failed) asked now."""
        ahead = self.cluster.read_ahead.get(shard.number)
        if ahead is not None and ahead[i] is not None and not isinstance(ahead[i],
                                                                         BaseException):
            found, ahead[i] = ahead[i], None
            return found
        return ask()

    def latest(self, target_table: str, states: Sequence[str] | None = None) -> list[FileEvent]:
        """Each unit's latest event on each shard, named `<table> shard N` (the per-shard
        rows of `chload files`), then the target server's failures before any shard."""
        c = self.cluster
        if not self._ours(target_table):
            return super().latest(target_table, states)
        out: list[FileEvent] = []
        for shard in c.shards:
            out += [replace(e, target_table=f"{target_table} shard {shard.number}")
                    for e in shard.target.ledger.latest(shard.local_display, states)]
        out += [e for e in super().latest(target_table, states) if e.state == FAILED]
        return sorted(out, key=lambda e: (e.uri, e.target_table))


def layout_of(c: ClusterTarget) -> str:
    """The layout units are routed by, as stored in a shard's layout record."""
    return json.dumps({"cluster": c.dist.cluster, "key": c.dist.key or "",
                       "by": "file" if c.by_file else "row",
                       "shards": {str(s.number): s.weight for s in c.shards}}, sort_keys=True)


def _describe(layout: dict) -> str:
    weights = "/".join(str(w) for _, w in sorted(layout["shards"].items(), key=lambda i: int(i[0])))
    return f"key {layout['key'] or '-'} by {layout['by']}, shards weighted {weights}"


def check_layout(c: ClusterTarget, recorded: dict[int, str | None]) -> list[int]:
    """Refuse a load whose layout differs from the one loaded units were routed by,
    where that could move rows (module docstring); return the shards whose layout
    record is to be written (missing or old) before loading."""
    current = layout_of(c)
    old_text = next((r for r in recorded.values() if r is not None and r != current), None)
    stale = [n for n, r in recorded.items() if r != current]
    if old_text is None:
        return stale
    old, new = json.loads(old_text), json.loads(current)
    has = {n: set(events) for n, events in c.known.by_shard.items()}
    loaded = set().union(*has.values())
    changed = f"({_describe(old)}, now {_describe(new)})"
    if loaded and (old["shards"].keys() != new["shards"].keys()
                   or (old["by"], new["by"]) == ("file", "row")):
        raise UsageError(
            f"table {c.table_display}: its sharding changed since units were loaded "
            f"{changed}: their rows stay where the old layout put them and a load now "
            "could place them twice; restore the old layout, or load into a fresh table")
    if old["by"] == "row":
        for uri in sorted(loaded):
            lacking = sorted(n for n in has if uri not in has[n])
            if lacking:
                raise UsageError(
                    f"table {c.table_display}: its sharding changed {changed} since {uri} "
                    f"was loaded on shards {_listed(n for n in sorted(has) if n not in lacking)}"
                    f" but not {_listed(lacking)}: routing it again now would "
                    "move rows; finish it with the old layout, or drop its rows on every "
                    "shard and load it with --force")
    return stale


def _listed(numbers: Iterable[int]) -> str:
    return ", ".join(str(n) for n in numbers)


def adding_up(by_file: dict[str, dict[int, int]] | None,
               shares: dict[int, tuple[int, list[str]]]) -> dict[str, dict[int, int]] | None:
    """`by_file` if, for every shard, its files' rows add up to its stage's."""
    if by_file is None:
        return None
    for number, (rows, _) in shares.items():
        if sum(per.get(number, 0) for per in by_file.values()) != rows:
            return None
    return by_file


def file_shares(job: LoadJob, shard: int, rows: int, read: int, done: list[Loaded],
                 by_file: dict[str, dict[int, int]] | None) -> list[tuple[SourceFile, int, int]]:
    """(file, its rows on `shard`, its bytes in proportion) for each file of the job:
    one file has the shard's `rows` and `read`."""
    if len(job.files) == 1:
        return [(job.file, rows, read)]
    if by_file is None:
        return [(f, 0, read) for f in job.files]
    out = []
    for f, d in zip(job.files, done, strict=True):
        mine = by_file.get(f.uri, {}).get(shard, 0)
        out.append((f, mine, d.bytes * mine // max(1, d.rows)))
    return out
