"""Where a MySQL change stands in the binlog, and its followed table (table.py's shape).

The table holds the source's columns plus `_version` (the change's binlog position,
`position`: a snapshot's rows have 0, older than any change) and `_is_deleted` (1 for
a deleted row), as ReplacingMergeTree(_version[, _is_deleted]) ordered by the source's
primary key: the current rows are `FINAL WHERE NOT _is_deleted` (where the engine takes
`is_deleted`, FINAL alone leaves deleted rows out).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from chload.errors import UsageError
from chload.schema import Column
from chload.sources.changes import table

if TYPE_CHECKING:
    from chload.targets.base import Target

VERSION, DELETED = table.VERSION, table.DELETED
CHANGE_COLUMNS = (Column(VERSION, "UInt64"), Column(DELETED, "UInt8"))
_POS_BITS = 32  # a binlog file is at most 1 GiB (max_binlog_size): its offsets fit


def position(log_file: str, pos: int) -> int:
    """A binlog position as one number that grows along the log: the file's sequence
    number (binlog.000012: 12) above its offset."""
    found = re.search(r"\.(\d+)$", log_file)
    if found is None:
        raise UsageError(f"binlog file {log_file}: no sequence number in its name")
    return (int(found.group(1)) << _POS_BITS) | pos


def log_of(value: int, basename: str) -> tuple[str, int]:
    """The (file, offset) of a `position`, the file named after `basename`
    (binlog.000003: the server's naming, six digits at least)."""
    stem = basename.rpartition(".")[0] or basename
    return f"{stem}.{value >> _POS_BITS:06d}", value & ((1 << _POS_BITS) - 1)


def create(target: Target, table_sql: str, columns: Sequence[Column],
           key: Sequence[str], display: str, cluster: str | None = None,
           shards: Sequence[tuple[str, str]] = ()) -> None:
    """The followed table (table.py's shape), ordered by the primary key: a table
    without one cannot be followed. `cluster`: made on it (--cluster)."""
    table.ensure_table(target, table_sql, display, columns,
                       table.key_of(key, None, display, or_else=""), cluster, shards,
                       os.environ)


def check_existing(existing: Sequence[Column] | None, display: str) -> None:
    """A table that exists must carry the change columns (one made by a plain copy does
    not: it cannot tell a deleted row from a current one)."""
    if existing is None:
        return
    names = {c.name for c in existing}
    if VERSION not in names or DELETED not in names:
        raise UsageError(f"{display}: exists without {VERSION} and {DELETED}; change capture "
                         "needs a table of its own: name another --table or drop this one")


def data_columns(existing: Sequence[Column]) -> list[Column]:
    return [c for c in existing if c.name not in (VERSION, DELETED)]


def unit_columns(existing: Sequence[Column]) -> list[Column]:
    """What a change unit's lines hold: the table's columns, then the change columns."""
    return [Column(c.name, c.type) for c in data_columns(existing)] + list(CHANGE_COLUMNS)


def current_rows(table_sql: str, columns: Callable[[], str] | None = None) -> str:
    """The SQL of the table's current rows (docs/sources-databases.md)."""
    cols = columns() if columns else "*"
    return f"SELECT {cols} FROM {table_sql} FINAL WHERE NOT {DELETED}"
