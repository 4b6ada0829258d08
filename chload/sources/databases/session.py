"""The Session protocol: one snapshot of one database table, read range by range.

postgres.py and mysql.py implement it; base.py (the Source) and plan.py (which ranges
to load) use only what it declares. A `Range` is a set of axis values `(lo, hi]`;
`predicate` writes it in the source's SQL. A read owns the file descriptor it writes
into and closes it; `finish` says whether every row was written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from chload.core.reading.ranges import Guard
from chload.sources import pipes as db_pipes
from chload.sources.databases.table import DbUrl, RangeChecks, TableInfo
from chload.sources.pipes import Reading


@dataclass(frozen=True, slots=True)
class Range:
    """Axis values in (lo, hi]; lo None: from the beginning; hi None: no end."""

    lo: str | None
    hi: str | None

    def label(self, axis: str) -> str:
        return f"{axis}({self.lo or ''},{self.hi or ''}]"


def range_predicate(column: str, r: Range, literal: Callable[[str], str]) -> str:
    """`column > lo AND column <= hi` in the source's SQL (`column` quoted, `literal`
    quoting a value, by the source's dialect); `column IS NOT NULL` for an unbounded
    range (a row whose axis is NULL is in no range)."""
    parts = [f"{column} {op} {literal(value)}" for op, value in ((">", r.lo), ("<=", r.hi))
             if value is not None]
    return " AND ".join(parts) or f"{column} IS NOT NULL"


class Session(Protocol):
    """One database read: a snapshot, the table's columns, ranges read into spools."""

    url: DbUrl
    query: str | None  # the --query read instead of a table (None: the URL's table)
    info: TableInfo
    snapshot: str  # names the snapshot (ledger identity)
    range_checks: RangeChecks  # the values each range checks (DatabaseSource.stored)
    bounds_in_snapshot: bool  # `bounds` were read in the readers' snapshot (plan.py)

    def read_in_key_order(self) -> None:
        """Read each range in primary key order from now on, where that is cheap for the
        database (asked by a target that sorts a unit's rows after its last byte)."""
        ...

    def bounds(self, axis: str) -> tuple[str | None, str | None, int]:
        """(min, max, estimated rows) of the axis in the snapshot."""
        ...

    def read(self, where: str, out: int) -> Reading:
        """Start writing the rows matching `where` (source SQL) as TSV into the file
        descriptor `out` (a spool file or a pipe), which the read now owns (it closes
        it); `finish` says whether every row was written."""
        ...

    def stream(self, where: str) -> tuple[int, Reading]:
        """`read` into a new pipe: (its read end, for the engine; the reading)."""
        ...

    def predicate(self, axis: str, r: Range) -> str: ...

    def outside(self, guards: Sequence[Guard], where: str) -> list[str | None]:
        """For each guard, a value of its column (by position) outside [lo, hi] among
        the rows matching `where`, or None: one query, before any range is read."""
        ...

    def zero_dates(self, where: str) -> dict[int, str]:
        """Column index -> a zero date (MySQL's 0000-00-00, 2024-02-00) among the rows
        matching `where`, of each column where one would fail the range."""
        ...

    @property
    def zero_checked(self) -> bool:
        """`zero_dates` may find some (MySQL date columns that fail on one)."""
        ...

    def apart(self) -> Session:
        """This session's table on a connection of its own, in the same snapshot where
        the database shares one (PostgreSQL), for `outside` and `zero_dates` beside the
        ranges (DatabaseSource._check_first); its `close` ends only that connection."""
        ...

    def close(self) -> None: ...


def stream_read(session: Session, where: str) -> tuple[int, Reading]:
    """Session.stream of a session that has no pipe of its own ready: a new one."""
    read_end, write_end = db_pipes.make()
    try:
        return read_end, session.read(where, write_end)
    except BaseException:
        os.close(read_end)
        raise

