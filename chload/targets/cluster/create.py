"""A followed table made on a cluster (`--cluster NAME`): a local table on every shard and a
Distributed table over them on the target server, sharded by a hash of the key.

Why the key's hash: every version of one key (its copy, each update, its delete) must land
on one shard, so that `FINAL` on that shard's ReplacingMergeTree keeps its latest; a
hash of the key columns only (`cityHash64(id)`) sends them all to one shard, whatever the
other columns hold. Shards of several replicas need Replicated tables (ZooKeeper paths
chosen by the user): refused here, in one line, before anything is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from chload.errors import ChloadError, UsageError
from chload.schema import Column, display_table, quote_ident, split_table
from chload.targets.cluster.layout import (
    Described,
    Distributed,
    at_once,
    describe,
    layout_from,
    open_shards,
    parse_shard_map,
)
from chload.targets.server.capabilities import server_columns
from chload.targets.server.target import ServerTarget

LOCAL_SUFFIX = "_local"


def sharding_key(key: Sequence[str]) -> str:
    """The Distributed table's key for a table ordered by `key`: a hash of those columns."""
    return f"cityHash64({', '.join(quote_ident(k) for k in key)})"


def create_on_cluster(entry: ServerTarget, table: str, cluster: str, columns: Sequence[Column],
                      key: Sequence[str], engine: str, shards: Sequence[tuple[str, str]],
                      env: Mapping[str, str]) -> None:
    """`<table>_local` (`engine`, ordered by `key`) on one replica of every shard of
    `cluster`, then `table` on `entry`: Distributed(cluster, db, <table>_local,
    cityHash64(key))."""
    database, name = split_table(table)
    shown = display_table(table)
    dist = Distributed(cluster, database, name + LOCAL_SUFFIX, sharding_key(key))
    described = describe(entry, table)
    if described.columns is not None:  # (made meanwhile: checked as any existing table)
        return
    layout = layout_from(entry, Described(dist, described.replicas, None), table)
    several = sorted({r.shard for r in layout if sum(x.shard == r.shard for x in layout) > 1})
    if several:
        raise UsageError(
            f"--cluster {cluster}: shard {several[0]} has several replicas, whose tables must "
            f"be Replicated (ZooKeeper paths of your choosing): create {shown}'s local tables "
            f"(ReplicatedReplacingMergeTree(..., _version) ORDER BY the key) and a Distributed "
            f"table {shown} sharded by {dist.key} first; nothing was loaded")
    opened = open_shards(entry, table, dist, parse_shard_map(shards), dict(env), layout)
    order = ", ".join(quote_ident(k) for k in key)
    try:
        at_once([lambda s=s: s.target.create_table(  # type: ignore[misc]
            dist.local, columns, order if len(key) == 1 else f"({order})", None, engine)
            for s in opened])
    finally:
        for shard in opened:
            with contextlib.suppress(ChloadError):
                shard.target.close()
    stored = server_columns(columns, entry.caps, f"table {shown}")
    body = ", ".join(c.sql for c in stored)
    entry.command(f"CREATE TABLE IF NOT EXISTS {table} ({body}) ENGINE = Distributed("
                  f"{quote_ident(cluster)}, {quote_ident(database)}, "
                  f"{quote_ident(dist.table)}, {dist.key})")
