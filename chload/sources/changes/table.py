"""The table a change stream writes, and where the stream stands: shared by every source.

A followed table is the source's columns plus two: `_version UInt64`, the change's
position in the source's log (a PostgreSQL LSN; 0 for rows of the first copy, which
every change follows), and `_is_deleted UInt8` (1: the key was deleted at that
position). Its engine is `ReplacingMergeTree(_version, _is_deleted)` where the engine
takes the second argument (ClickHouse 23.2 and later, chDB), else
`ReplacingMergeTree(_version)`, ordered by the source's primary key: the current rows
are `SELECT ... FINAL WHERE NOT _is_deleted` on both (docs/sources-changes.md).

A change stream's units are ranges of positions `(after, end]`, named in the ledger
`<stream>/<after>-<end - 1>` (so its committed end is the last name's + 1, as a Kafka
partition's), whole transactions only, committed through the committer as any unit;
the source's own position is moved to `end` only after the commit.

The interface (small on purpose, so that every source of changes shares it):

    VERSION, DELETED                       the two column names
    change_columns(columns)                the source's columns + the two
    engine_clause(target)                  ReplacingMergeTree(...) this target takes
    key_of(source_key, upsert_key, where)  the key, or the one line refusing --follow
    ensure_table(target, table, columns, key)   create it (on --cluster: on every shard and
                                           a Distributed table), or check an existing one
    check_cluster_table(target, table, display, cluster)   --cluster into an existing
                                           plain table: the one line refusing it
    check_sharding(target, display, key)   a Distributed table whose key scatters a key's
                                           versions over shards: the one line refusing it
    unit_uri(stream, after, end) / unit_end(uri)
    committed_end(target, table, stream)   the stream's end in the ledger (None: none)
    resume_point(target, table, stream)    that end, and into a cluster the unit some
                                           shards have and others lack (None: none)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from chload.commit.ledger import COMMITTING, FILES, LOADED
from chload.errors import UsageError
from chload.schema import Column, quote_ident, quote_str
from chload.sources.base import partly_committed

if TYPE_CHECKING:
    from chload.targets.base import Target

VERSION = "_version"
DELETED = "_is_deleted"
# the first server version whose ReplacingMergeTree takes an is_deleted column
_IS_DELETED_SINCE = (23, 2)


def change_columns(columns: Sequence[Column]) -> list[Column]:
    """The followed table's columns: the source's, then `_version` and `_is_deleted`."""
    own = [c for c in columns if c.name not in (VERSION, DELETED)]
    # DEFAULT 0: a copied row has neither (core/plan.py takes such columns as optional)
    return [*own, Column(VERSION, "UInt64 DEFAULT 0", "DEFAULT"),
            Column(DELETED, "UInt8 DEFAULT 0", "DEFAULT")]


def takes_is_deleted(engine_name: str) -> bool:
    """Whether ReplacingMergeTree takes `_is_deleted` as its second argument (FINAL then
    leaves deleted keys out by itself)."""
    if engine_name == "chdb":
        return True
    found = re.match(r"(\d+)\.(\d+)", engine_name or "")
    if found is None:
        return False
    return (int(found.group(1)), int(found.group(2))) >= _IS_DELETED_SINCE


def engine_clause(target: Target) -> str:
    args = [VERSION, DELETED] if takes_is_deleted(target.engine_name) else [VERSION]
    return f"ReplacingMergeTree({', '.join(quote_ident(a) for a in args)})"


def key_of(source_key: Sequence[str], upsert_key: str | None, where: str,
           or_else: str = ", or pass --upsert-key COLUMNS with REPLICA IDENTITY FULL"
           ) -> tuple[str, ...]:
    """The columns a followed table is ordered by: --upsert-key's, else the source's
    primary key; a table with neither is refused in one line (`or_else`: the source's
    other way out, '' for none)."""
    if upsert_key:
        return tuple(k.strip().strip('`"') for k in upsert_key.split(",") if k.strip())
    if not source_key:
        raise UsageError(f"{where}: --follow needs a primary key to apply updates and deletes "
                         "by, and the table has no primary key; add one (ALTER TABLE ... ADD "
                         f"PRIMARY KEY){or_else}")
    return tuple(source_key)


def ensure_table(target: Target, table_sql: str, display: str, columns: Sequence[Column],
                 key: Sequence[str], cluster: str | None = None,
                 shards: Sequence[tuple[str, str]] = (),
                 env: Mapping[str, str] | None = None) -> bool:
    """Create the followed table if missing (True; with `cluster`, a local table on every
    shard of that cluster and a Distributed table sharded by a hash of `key`:
    targets/cluster/create.py), else check it has the two columns and a ReplacingMergeTree
    engine, and, a Distributed table, a sharding key of `key` only (one line saying what
    to do if not; False)."""
    existing = target.table_columns(table_sql)
    if existing is None and cluster:
        make = getattr(target, "create_on_cluster", None)  # (a server target's)
        if make is None:
            raise UsageError(f"--cluster {cluster}: a table is made on a cluster through a "
                             "server of it: pass --target http(s)://HOST:PORT/DB; nothing "
                             "was loaded")
        make(table_sql, cluster, change_columns(columns), key, engine_clause(target), shards,
             env or {})
        return True
    if existing is None:
        order = ", ".join(quote_ident(k) for k in key)
        target.create_table(table_sql, change_columns(columns),
                            order if len(key) == 1 else f"({order})", None,
                            engine_clause(target))
        return True
    names = {c.name for c in existing}
    engines = target.table_engines(table_sql)
    if VERSION not in names or DELETED not in names or not all(
            "ReplacingMergeTree" in e for _, e in engines):
        raise UsageError(f"table {display}: a followed table is a ReplacingMergeTree with "
                         f"columns {VERSION} and {DELETED}, and this one is not; follow into "
                         "a new table (or drop this one); nothing was loaded")
    check_cluster_table(target, table_sql, display, cluster)
    check_sharding(target, display, key)
    return False


def check_cluster_table(target: Target, table_sql: str, display: str,
                        cluster: str | None) -> None:
    """With --cluster, an existing table must be Distributed (a cluster target's `dist`,
    or its engine on a server): a plain one is refused in one line, before anything is
    read or made."""
    if not cluster or getattr(target, "dist", None) is not None:
        return
    if any(e.startswith("Distributed") for _, e in target.table_engines(table_sql)):
        return
    raise UsageError(f"--cluster {cluster}: table {display} exists and is not a "
                     "Distributed table; follow into a new --table (or leave out "
                     "--cluster); nothing was loaded")


_RANDOM = re.compile(r"\brand(64|Constant)?\s*\(", re.IGNORECASE)
_NAMES = re.compile(r"`([^`]+)`|\"([^\"]+)\"|\b([A-Za-z_][A-Za-z0-9_]*)\b(?!\s*\()")


def key_names(expression: str) -> set[str]:
    """The column names a sharding expression reads (function names and string
    literals left out)."""
    bare = re.sub(r"'(?:[^'\\]|\\.)*'", "''", expression)
    return {next(g for g in m.groups() if g is not None) for m in _NAMES.finditer(bare)}


def check_sharding(target: Target, display: str, key: Sequence[str]) -> None:
    """Into a Distributed table (a cluster target: its `dist` and `by_file`), every version
    of one key must land on one shard, where FINAL replaces the older ones: its sharding
    key must read the followed key's columns only, and rows must be routed by it (not
    whole units by file). Else one line naming the table, its key and what to do."""
    dist = getattr(target, "dist", None)
    if dist is None:
        return
    sharding = dist.key or "none"
    names = ", ".join(key)
    if dist.key and not _RANDOM.search(dist.key) and key_names(dist.key) <= set(key):
        if not getattr(target, "by_file", False):
            return
        raise UsageError(f"table {display}: --shard-by file would send a key's versions to "
                         "different shards; leave it out (rows go by the sharding key "
                         f"{sharding}); nothing was loaded")
    raise UsageError(
        f"table {display}: a Distributed table with sharding key {sharding}, which is not a "
        f"function of the followed key ({names}) alone: the versions of one key would land "
        "on different shards and never replace each other; follow into a Distributed table "
        f"sharded by the key (e.g. cityHash64({names})), or into a new --table with "
        "--cluster NAME; nothing was loaded")


def truncate(target: Target, table_sql: str) -> None:
    """The followed table emptied (a copy taken again); a Distributed table's on every
    shard (its `shards`, each with its local table)."""
    shards = getattr(target, "shards", None)
    if shards is None:
        target.command(f"TRUNCATE TABLE {table_sql}")
        return
    for shard in shards:
        shard.target.command(f"TRUNCATE TABLE {target.local}")  # type: ignore[attr-defined]


def where_followed(target: Target) -> str:
    """The target as a follow's slot is named after: a cluster's by its entry server (the
    server holding the Distributed table), so a run names the same slot whether it looks
    through the cluster or through that server."""
    return str(getattr(target, "entry", target).display)


def unit_uri(stream: str, after: int, end: int) -> str:
    return f"{stream}/{after}-{end - 1}"


def unit_end(uri: str) -> int:
    return int(uri.rpartition("-")[2]) + 1


def committed_end(target: Target, table_display: str, stream: str) -> int | None:
    """The stream's committed end: the greatest end of its units whose latest event is
    `committing` (settled by `recover` before this is asked) or `loaded`; None when the
    ledger has none. Into a cluster, of the units every shard has (`resume_point`)."""
    return resume_point(target, table_display, stream)[0]


def resume_point(target: Target, table_display: str,
                 stream: str) -> tuple[int | None, tuple[int, int] | None]:
    """Where the stream goes on from: its committed end (`committed_end`), and, into a
    cluster, the unit `(first, last)` some shards have committed and others lack (a run
    killed between two shards' commits: `_cluster_point`), which the follow reads again,
    that range exactly, and commits on the shards lacking it before any other."""
    if getattr(target, "dist", None) is not None:
        return _cluster_point(target, table_display, stream)
    rows = target.rows(
        f"SELECT uri FROM (SELECT uri, argMax(state, seq) AS s FROM {FILES} WHERE "
        f"target_table = {quote_str(table_display)} AND startsWith(uri, "
        f"{quote_str(stream + '/')}) GROUP BY uri) WHERE s IN "
        f"({quote_str(COMMITTING)}, {quote_str(LOADED)})")
    ends = [unit_end(str(r["uri"])) for r in rows]
    return (max(ends) if ends else None), None


def _cluster_point(target: Target, table_display: str,
                   stream: str) -> tuple[int | None, tuple[int, int] | None]:
    """The end of the units every shard has committed (the cluster's ledger: each
    shard's events, as `<table> shard N`; a routed unit is recorded on every shard, with
    0 rows where none of its rows went), and the unit beyond it that some shards have
    (sources/base.py `partly_committed`, as a Kafka partition's). A follow commits a unit on every
    shard before it reads the next, so such a unit starts at that end and is the only
    one: any other (a ledger edited by hand?) stops the follow in one line, nothing
    applied."""
    on: dict[str, set[str]] = {}
    for event in target.ledger.latest(table_display):
        if event.uri.startswith(stream + "/") and event.state in (COMMITTING, LOADED):
            on.setdefault(event.uri, set()).add(event.target_table)
    every = len(getattr(target, "shards", ())) or 1
    complete = {uri for uri, where in on.items() if len(where) >= every}
    ends = [unit_end(uri) for uri in complete]
    end = max(ends) if ends else None
    partly = sorted((unit_end(uri), uri) for uri in on
                    if uri not in complete and unit_end(uri) > (end or 0))
    pending = partly_committed([uri for _, uri in partly], complete).get(stream)
    if partly and (len(partly) > 1 or pending is None or pending[0] != (end or 0)):
        uri = partly[-1][1]
        raise UsageError(
            f"table {table_display}: changes {uri.rpartition('/')[2]} were committed on "
            f"{', '.join(sorted(on[uri]))} only, beyond the changes every shard has (up to "
            f"{end or 0}); the follow cannot go on from there: drop the follow (chload "
            "sources --drop) and the table, then follow again")
    return end, pending


def followed_streams(target: Target, prefix: str) -> list[tuple[str, str, int]]:
    """(target table, stream, committed end) of every stream whose name starts with
    `prefix` in the ledger (`chload sources`)."""
    rows = target.rows(
        f"SELECT target_table, uri FROM (SELECT target_table, uri, argMax(state, seq) AS s "
        f"FROM {FILES} WHERE startsWith(uri, {quote_str(prefix)}) GROUP BY target_table, "
        f"uri) WHERE s IN ({quote_str(COMMITTING)}, {quote_str(LOADED)})")
    ends: dict[tuple[str, str], int] = {}
    for r in rows:
        stream = str(r["uri"]).rpartition("/")[0]
        key = (str(r["target_table"]), stream)
        ends[key] = max(ends.get(key, 0), unit_end(str(r["uri"])))
    return [(t, s, e) for (t, s), e in sorted(ends.items())]
