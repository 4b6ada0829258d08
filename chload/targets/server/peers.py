"""Does a cluster of this server hold, on its other servers, a Distributed table of a name
this server lacks? Then `--target` names the wrong server of the cluster: a load would
create a plain table here and put every row in it. ServerTarget.for_table says so in a
note of the report; with --shard (cluster/open.py) the load is refused.

Asked only when the table does not exist here (the first load into it), through the
cluster's own connections (`cluster()` uses the credentials of its configuration, so no
password of the loader's goes into a query). Any failure, or a server of no cluster,
answers "none": a warning is not worth a failed load.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chload.errors import ChloadError
from chload.schema import display_table, quote_str, split_table

Rows = Callable[[str], list[dict]]
MOST_CLUSTERS = 8  # clusters asked at most (a default configuration lists test clusters)


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """A Distributed table of the name on the servers of `cluster`; its engine clause."""

    cluster: str
    engine: str


def clusters_of(rows: Rows) -> list[str]:
    """The clusters of this server with another server in them ([] on any failure)."""
    try:
        found = rows("SELECT DISTINCT cluster FROM system.clusters WHERE NOT is_local "
                     f"ORDER BY cluster LIMIT {MOST_CLUSTERS}")
    except ChloadError:
        return []
    return [r["cluster"] for r in found]


def distributed_elsewhere(rows: Rows, table: str, clusters: Sequence[str]) -> list[Elsewhere]:
    """The Distributed tables named `table` on the servers of `clusters`, one per cluster,
    in one query (an unreachable server skipped); [] when none, or on any failure."""
    if not clusters:
        return []
    database, name = split_table(table)
    where = (f"database = {quote_str(database)} AND name = {quote_str(name)} AND "
             "engine = 'Distributed'")
    sql = " UNION ALL ".join(
        f"SELECT {quote_str(c)} AS cluster, engine_full FROM cluster({quote_str(c)}, "
        f"system, tables) WHERE {where}" for c in clusters[:MOST_CLUSTERS])
    try:
        found = rows(f"{sql} SETTINGS skip_unavailable_shards = 1")
    except ChloadError:
        return []
    seen: dict[str, Elsewhere] = {}
    for row in found:
        seen.setdefault(row["cluster"], Elsewhere(row["cluster"], row["engine_full"]))
    return list(seen.values())


def said(found: Sequence[Elsewhere]) -> str:
    """`cluster c (Distributed(c, db, t_local, key))`, for each cluster found."""
    return ", ".join(f"cluster {e.cluster} ({e.engine})" for e in found)


def creating_note(table: str, server: str, found: Sequence[Elsewhere]) -> str:
    """The report's note when chload creates `table` here while peers hold it Distributed."""
    shown = display_table(table)
    return (f"table {shown} was not on {server}: chload makes it there, a plain table, for "
            f"the rows of this load, while other servers of {said(found)} hold a "
            f"Distributed table {shown}; to load through that one, point --target at one of "
            "them (and drop the one made here)")
