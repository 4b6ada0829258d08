"""The cluster's ledger: what a Distributed table's shards say of its units.

Each shard keeps its own ledger (`chload.files` on that shard, under the local table's
name), written by its own committer; this view answers the loader's questions about
the Distributed table from them (targets/cluster.py: a unit is loaded when every shard
it goes to has it, at one identity), while the run history and failures before any
shard was reached stay on the target server's ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from chload.ledger import FAILED, FileEvent, Ledger, TableState
from chload.schema import split_table
from chload.targets.cluster_layout import at_once

if TYPE_CHECKING:
    from chload.targets.cluster import ClusterTarget


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
        states = at_once([lambda s=s: s.target.ledger.table_state(*local)  # type: ignore[misc]
                          for s in c.shards])
        return TableState(all(s.exists for s in states), "", sum(s.rows for s in states))

    def loaded(self, target_table: str) -> dict[str, FileEvent]:
        """uri -> event (rows summed over shards) of the units every shard it goes to
        has loaded at one identity; read once per run and kept for `_pending`."""
        c = self.cluster
        if not self._ours(target_table):
            return super().loaded(target_table)
        found_on = at_once([(lambda s=s: s.target.ledger.loaded(  # type: ignore[misc]
            s.local_display)) for s in c.shards])
        c.known.by_shard = {s.number: f for s, f in zip(c.shards, found_on, strict=True)}
        found: dict[str, FileEvent] = {}
        uris = {u for events in c.known.by_shard.values() for u in events}
        for uri in uris:
            events = [c.known.by_shard[s.number].get(uri) for s in c.responsible(uri)]
            if any(e is None for e in events) or len({e.identity for e in events if e}) > 1:
                continue
            first = [e for e in events if e is not None]
            found[uri] = replace(first[0], target_table=target_table,
                                 rows=sum(e.rows for e in first))
        return found

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
