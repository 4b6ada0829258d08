"""Which tables of a target follow a source, for `chload sources`: the streams in the
target's own ledger, and those of its Distributed tables, whose units each shard's ledger
holds under the local table's name (a unit counts once every shard has it, as the follow
itself reads it: table.committed_end). A shard's own rows of such a follow (the local
table's, on a server that is also a shard) are the cluster's, not a follow of their own.

    clusters(target, shards, env)   the Distributed tables with the change columns, each
                                    opened through its cluster (closed after), and one
                                    entry per table whose shards cannot be reached
    streams(target, clusters, prefix)   each follow: Followed(table, stream, end, where)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chload.commit.ledger import COMMITTING, FILES, LOADED
from chload.errors import ChloadError
from chload.schema import display_table, quote_ident, quote_str
from chload.sources.changes import table as changes_table

if TYPE_CHECKING:
    from chload.targets.base import Target

_DISTRIBUTED_FOLLOWS = (
    "SELECT database, table FROM system.columns WHERE name IN ({names}) AND (database, "
    "table) IN (SELECT database, name FROM system.tables WHERE engine = 'Distributed') "
    "GROUP BY database, table HAVING count() = 2 ORDER BY database, table")


@dataclass(frozen=True)
class Followed:
    """One follow: its table, stream, committed end (None: not known, `error` says why)
    and the target whose ledger holds its units (the server, or the table's cluster)."""

    table: str
    stream: str
    end: int | None
    where: Target
    error: str = ""


@contextlib.contextmanager
def clusters(target: Target, shards: Sequence[tuple[str, str]], env: Mapping[str, str],
             ) -> Iterator[tuple[list[Target], list[dict[str, Any]]]]:
    """The cluster of each Distributed table of `target` that has the change columns
    (open until the end), and an entry {table, error} per one that cannot be opened."""
    if target.engine_name == "chdb":
        yield [], []  # (embedded: no Distributed table)
        return
    names = ", ".join(quote_str(n) for n in (changes_table.VERSION, changes_table.DELETED))
    found = target.rows(_DISTRIBUTED_FOLLOWS.format(names=names))
    opened: list[Target] = []
    failed: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        for row in found:
            sql = f"{quote_ident(str(row['database']))}.{quote_ident(str(row['table']))}"
            try:
                opened.append(stack.enter_context(target.for_table(sql, shards, "auto", env)))
            except ChloadError as exc:
                failed.append({"table": display_table(sql), "error": str(exc)})
        yield opened, failed


def streams(target: Target, clusters: Sequence[Target], prefix: str) -> list[Followed]:
    """Every follow whose stream name starts with `prefix`: those of the target's own
    ledger, less its shards' rows of a cluster's follow; then each cluster's."""
    locals_ = {display_table(str(getattr(c, "local", ""))) for c in clusters}
    out = [Followed(t, s, e, target) for t, s, e in changes_table.followed_streams(target, prefix)
           if t not in locals_]
    for cluster in clusters:
        display = str(getattr(cluster, "table_display", ""))
        names = sorted({e.uri.rpartition("/")[0] for e in cluster.ledger.latest(display)
                        if e.uri.startswith(prefix) and e.state in (COMMITTING, LOADED)})
        for stream in names:
            try:
                end = changes_table.committed_end(cluster, display, stream)
            except ChloadError as exc:
                out.append(Followed(display, stream, None, cluster, str(exc)))
                continue
            if end is not None:
                out.append(Followed(display, stream, end, cluster))
    return out


def last_commit_ns(where: Target, table: str, stream: str) -> int:
    """When the follow last committed: its units' latest event (a cluster's, over its
    shards' ledgers)."""
    if getattr(where, "dist", None) is not None:
        return max((e.seq for e in where.ledger.latest(table)
                    if e.uri.startswith(stream + "/")), default=0)
    rows = where.rows(f"SELECT max(seq) AS s FROM {FILES} WHERE target_table = "
                      f"{quote_str(table)} AND startsWith(uri, {quote_str(stream + '/')})")
    return int(rows[0]["s"]) if rows else 0
