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
    ensure_table(target, table, columns, key)   create it, or check an existing one
    unit_uri(stream, after, end) / unit_end(uri)
    committed_end(target, table, stream)   the stream's end in the ledger (None: none)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from chload.commit.ledger import COMMITTING, FILES, LOADED
from chload.errors import UsageError
from chload.schema import Column, quote_ident, quote_str

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
                 key: Sequence[str]) -> bool:
    """Create the followed table if missing (True), else check it has the two columns and
    a ReplacingMergeTree engine (one line saying what to do if not; False)."""
    existing = target.table_columns(table_sql)
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
    return False


def unit_uri(stream: str, after: int, end: int) -> str:
    return f"{stream}/{after}-{end - 1}"


def unit_end(uri: str) -> int:
    return int(uri.rpartition("-")[2]) + 1


def committed_end(target: Target, table_display: str, stream: str) -> int | None:
    """The stream's committed end: the greatest end of its units whose latest event is
    `committing` (settled by `recover` before this is asked) or `loaded`; None when the
    ledger has none."""
    rows = target.rows(
        f"SELECT uri FROM (SELECT uri, argMax(state, seq) AS s FROM {FILES} WHERE "
        f"target_table = {quote_str(table_display)} AND startsWith(uri, "
        f"{quote_str(stream + '/')}) GROUP BY uri) WHERE s IN "
        f"({quote_str(COMMITTING)}, {quote_str(LOADED)})")
    ends = [unit_end(str(r["uri"])) for r in rows]
    return max(ends) if ends else None


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
