"""New columns on a cluster (--on-new-column add): the local table on every shard first,
then the Distributed table on the target server (a Distributed column whose local
column is missing would fail every read) and on each other shard's server that has one
of that name, and no unit loads until every replica of every shard shows them in
system.columns: a Replicated table's other replicas take the
ALTER through ZooKeeper, so a bounded wait, and one line if it runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from chload.errors import SchemaError
from chload.schema import Column, quote_str, split_table
from chload.targets.cluster.layout import Replica, _Ahead, at_once
from chload.targets.server.http import TargetURL
from chload.targets.server.target import ServerTarget

if TYPE_CHECKING:
    from chload.targets.cluster.target import ClusterTarget

WAIT_SECONDS = 60.0  # for every replica to show the columns
POLL_SECONDS = 0.5


def add_columns(cluster: ClusterTarget, columns: Sequence[Column]) -> list[str]:
    """Add `columns` where they are missing: each shard's local table (at once), then
    the Distributed table; return the names this call added anywhere."""
    added = at_once([(lambda s=s: s.target.add_columns(  # type: ignore[misc]
        cluster.local, columns)) for s in cluster.shards])
    cluster.entry.add_columns(cluster.table, columns)
    at_once([(lambda s=s: _distributed_there(s.target, cluster.table, columns))  # type: ignore[misc]
             for s in cluster.shards if s.target.url.base != cluster.entry.url.base])
    await_columns(cluster, [c.name for c in columns])
    ours = {name for names in added for name in names}
    return [c.name for c in columns if c.name in ours]


def _distributed_there(server: ServerTarget, table: str, columns: Sequence[Column]) -> None:
    """The Distributed table of the same name on another shard's server (often made ON
    CLUSTER on every server), where there is one, gets the columns too."""
    database, name = split_table(table)
    if server.rows(f"SELECT 1 FROM system.tables WHERE database = {quote_str(database)} AND "
                   f"name = {quote_str(name)} AND engine = 'Distributed'"):
        server.add_columns(table, columns)


def await_columns(cluster: ClusterTarget, names: Sequence[str],
                  timeout: float = WAIT_SECONDS,
                  sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once every shard's server and every other replica (cluster.replicas) shows
    `names` in the local table; a SchemaError naming the first that does not, after
    `timeout` seconds."""
    database, table = split_table(cluster.local)
    sql = (f"SELECT name FROM system.columns WHERE database = {quote_str(database)} AND "
           f"table = {quote_str(table)}")
    asks: list[tuple[str, Callable[[], list[dict] | None]]] = [
        (s.name, lambda s=s: s.target.rows(sql)) for s in cluster.shards]  # type: ignore[misc]
    asks += [(label, lambda url=url: _Ahead(url, sql).wait())  # type: ignore[misc]
             for label, url in cluster.replicas]
    deadline = time.monotonic() + timeout
    while True:
        answers = at_once([ask for _, ask in asks])
        lacking = [label for (label, _), rows in zip(asks, answers, strict=True)
                   if rows is None or not set(names) <= {r["name"] for r in rows}]
        if not lacking:
            return
        if time.monotonic() >= deadline:
            raise SchemaError(
                f"table {cluster.table_display}: column {', '.join(names)} added, but "
                f"{lacking[0]} does not show it in {database}.{table} after {timeout:.0f} s "
                "(a replica behind on its replication queue, or down); nothing was loaded: "
                "run the load again once every replica shows it (system.columns)")
        sleep(POLL_SECONDS)


def other_replicas(layout: Sequence[Replica], opened: Sequence[Replica],
                   url_of: Callable[[Replica], TargetURL]) -> list[tuple[str, TargetURL]]:
    """(label, URL) of each replica of the layout that no shard target was opened on."""
    taken = {(r.shard, r.number) for r in opened}
    return [(f"shard {r.shard} replica {r.number} ({r.name})", url_of(r)) for r in layout
            if (r.shard, r.number) not in taken]
