"""Opening a cluster target: `for_table` turns a server target and a table name into
the ClusterTarget of that table's shards when it is Distributed (cluster/target.py), or the
server target itself; a Distributed table chload cannot load as asked is one line here,
before any row.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence

from chload.errors import ChloadError, UsageError
from chload.schema import display_table
from chload.targets.base import Target
from chload.targets.cluster.columns import other_replicas
from chload.targets.cluster.layout import (
    Described,
    check_locals,
    describe,
    endpoint,
    layout_from,
    open_shards,
    parse_shard_map,
)
from chload.targets.cluster.target import ClusterTarget
from chload.targets.server import peers
from chload.targets.server.target import ServerTarget

SHARD_BY = ("auto", "file")
_RANDOM = re.compile(r"\brand(64|Constant)?\s*\(", re.IGNORECASE)


def _not_distributed(target: ServerTarget, table: str, described: Described) -> str:
    """Why --shard is refused for `table`: not Distributed, or (no such table on the
    target server) Distributed on the other servers of its cluster (server/peers.py)."""
    shown = display_table(table)
    if described.columns is not None:
        return f"--shard: table {shown} is not Distributed"
    clusters = sorted({r["a"] for r in described.replicas if r["f"].endswith(" 0")})
    found = peers.distributed_elsewhere(target.rows, table, clusters)
    if found:
        return (f"--shard: table {shown} does not exist on {target.url.display}, but other "
                f"servers of {peers.said(found)} hold a Distributed table {shown}: point "
                "--target at one of them; nothing was loaded")
    return (f"--shard: table {shown} does not exist on {target.url.display}; --shard is for "
            "a Distributed table there: create it first, or load without --shard; nothing "
            "was loaded")


@contextlib.contextmanager
def for_table(target: Target, table: str, shard_map: Sequence[tuple[str, str]] = (),
              shard_by: str = "auto", env: dict[str, str] | None = None,
              ) -> Iterator[Target]:
    """`target`, or the ClusterTarget of its Distributed `table` (closed at the end; the
    server target itself stays its opener's)."""
    given = parse_shard_map(shard_map)
    if shard_by not in SHARD_BY:
        raise UsageError(f"--shard-by {shard_by}: use auto or file")
    if not isinstance(target, ServerTarget):
        if given:
            raise UsageError("--shard: only for a Distributed table on a server target")
        yield target
        return
    described = describe(target, table)
    dist = described.dist
    if dist is None:
        if given:
            raise UsageError(_not_distributed(target, table, described))
        yield target
        return
    layout = layout_from(target, described, table)
    shards = open_shards(target, table, dist, given, env or {}, layout)
    try:
        check_locals(shards, dist, table)
        for shard in shards:
            several = sum(r.shard == shard.number for r in layout) > 1
            if several and not shard.engine.startswith("Replicated"):
                raise UsageError(
                    f"table {display_table(table)}: shard {shard.number} has several replicas "
                    f"but its local table is {shard.engine.split('(')[0]}; chload loads one "
                    "replica per shard (internal_replication): use Replicated*MergeTree")
        by_file = shard_by == "file" or not dist.key or bool(_RANDOM.search(dist.key))
        cluster = ClusterTarget(target, table, dist, shards, by_file)
        cluster.columns_read = described.columns
        cluster.replicas = other_replicas(layout, [s.replica for s in shards], lambda r: endpoint(
            r, target.url, given, env or {}))
    except BaseException:
        for shard in shards:
            with contextlib.suppress(ChloadError):
                shard.target.close()
        raise
    try:
        yield cluster
    finally:
        cluster.close()
