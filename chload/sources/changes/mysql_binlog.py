"""The binlog read into spool files: each unit whole transactions, each row one TSV line.

The reader is mysql-replication's (pure Python: a decoded row is a dict; measured in
docs/benchmarks.md). A row event of the followed table becomes lines of the table's
columns plus `_version` (the event's binlog position) and `_is_deleted`: an insert or
an update its after image, a delete its before image marked deleted, an update that
moves the key also a deleted line for the old key. The engine parses the lines.

A unit ends at a transaction's end (XID, or COMMIT of a non-transactional table) once it
holds `rows` rows or `seconds` passed, at the position the run must stop at, or before
DDL of the table (returned to the caller: a column added, or a stop).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import IO, Any

from chload.errors import SourceError
from chload.sources.changes.mysql_table import position

HEARTBEAT = 0.5  # seconds: an idle server's heartbeat lets a unit end on time
_ESCAPES = ((b"\\", b"\\\\"), (b"\t", b"\\t"), (b"\n", b"\\n"), (b"\r", b"\\r"),
            (b"\0", b"\\0"))
_ENDS_TXN = {"COMMIT", "XA COMMIT"}
_QUIET = {"BEGIN", "COMMIT", "ROLLBACK"}


@dataclass(slots=True)
class Cut:
    """What one unit read: its end (the position after its last transaction), its rows,
    and the DDL of the followed table it stopped before (None: none)."""

    end: int
    rows: int = 0
    ddl: str | None = None
    ddl_end: int = 0
    exhausted: bool = False  # the run's end position reached (or the log's end)


@dataclass(slots=True)
class Layout:
    """How a row dict becomes a TSV line: the table's columns in order, and each
    one's fractional digits where it is a DATETIME/TIMESTAMP (the server's text)."""

    names: list[str]
    key: list[str]
    scales: dict[str, int] = field(default_factory=dict)


def layout_of(columns: Sequence[tuple[str, str]], key: Sequence[str]) -> Layout:
    """(name, MySQL column type) in table order, and the primary key -> Layout."""
    scales = {}
    for name, typ in columns:
        found = re.match(r"(datetime|timestamp|time)(?:\((\d)\))?", typ.lower())
        if found:
            scales[name] = int(found.group(2) or 0)
    return Layout([n for n, _ in columns], list(key), scales)


def _escaped(raw: bytes) -> bytes:
    for a, b in _ESCAPES:
        if a in raw:
            raw = raw.replace(a, b)
    return raw


def _datetime(value: datetime, scale: int) -> bytes:
    raw = value.strftime("%Y-%m-%d %H:%M:%S").encode()
    return raw + b"." + f"{value.microsecond:06d}"[:scale].encode() if scale else raw


def _time(value: timedelta, scale: int) -> bytes:
    """A TIME as the server prints it: [-]H:MM:SS[.fraction], hours past 24."""
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign, micros = ("-" if micros < 0 else ""), abs(micros)
    seconds, fraction = divmod(micros, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    text = f"{sign}{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return (text + f".{fraction:06d}"[:scale + 1] if scale else text).encode()


# a value's text by its exact type: the common ones need no escaping (numbers, times)
_PLAIN: dict[type, Callable[[Any, int], bytes]] = {
    int: lambda v, _: b"%d" % v,
    float: lambda v, _: repr(v).encode(),
    Decimal: lambda v, _: format(v, "f").encode(),
    datetime: _datetime,
    date: lambda v, _: v.isoformat().encode(),
    timedelta: _time,
    bool: lambda v, _: b"1" if v else b"0",
    str: lambda v, _: _escaped(v.encode("utf-8", "surrogateescape")),
    bytes: lambda v, _: _escaped(v),
}


def _text(value: Any, scale: int) -> bytes:
    plain = _PLAIN.get(type(value))
    if plain is not None:
        return plain(value, scale)
    if isinstance(value, (set, frozenset)):
        return _escaped(",".join(sorted(value)).encode())
    return _escaped(str(value).encode())


def line(values: dict[str, Any], layout: Layout, version: int, deleted: int) -> bytes:
    scales = layout.scales
    fields = [b"\\N" if (v := values.get(n)) is None else _text(v, scales.get(n, 0))
              for n in layout.names]
    fields.append(b"%d" % version)
    fields.append(b"1" if deleted else b"0")
    return b"\t".join(fields) + b"\n"


class BinlogReader:
    """One binlog connection from a position on, read unit by unit."""

    def __init__(self, settings: dict[str, Any], log_file: str, log_pos: int,
                 schema: str, table: str, follow: bool) -> None:
        from pymysqlreplication import BinLogStreamReader

        self.schema, self.table = schema, table
        self.at = position(log_file, log_pos)  # the end of the last transaction read
        try:
            self.stream = BinLogStreamReader(
                connection_settings=settings, server_id=_server_id(), resume_stream=True,
                log_file=log_file, log_pos=log_pos, blocking=follow,
                slave_heartbeat=HEARTBEAT if follow else None, enable_logging=False)
        except Exception as exc:  # noqa: BLE001 - pymysql's errors, at this one boundary
            raise SourceError(f"binlog of {schema}.{table}: {exc}") from None
        self._events: Iterator[Any] = iter(self.stream)

    def close(self) -> None:
        self.stream.close()

    def unit(self, out: IO[bytes], layout: Layout, rows: int, seconds: float,
             end: int | None, stop: Callable[[], bool],
             awaited: Callable[[], bool] = lambda: True) -> Cut:
        """Read whole transactions into `out` (see the module docstring). Past `seconds`
        a unit ends only once `awaited()` (the unit before it committed): while a commit
        takes longer, the unit grows instead of queueing behind it."""
        from pymysqlreplication import event as ev, row_event as rev

        cut = Cut(self.at)
        pending: list[bytes] = []
        started = time.monotonic()
        while True:
            if not pending:  # between transactions: where a unit may end
                if end is not None and cut.end >= end:
                    cut.exhausted = True
                    return cut
                if cut.rows and (cut.rows >= rows or (
                        time.monotonic() - started >= seconds and awaited())):
                    return cut
                if stop():
                    return cut
            try:
                e = next(self._events)
            except StopIteration:
                cut.exhausted = True
                return cut
            except Exception as exc:  # noqa: BLE001 - pymysql's errors, at this boundary
                raise SourceError(f"binlog of {self.schema}.{self.table}: {exc}") from None
            if isinstance(e, ev.HeartbeatLogEvent):
                continue
            here = position(self.stream.log_file, e.packet.log_pos) if e.packet.log_pos \
                else 0
            if isinstance(e, rev.RowsEvent):
                if e.schema == self.schema and e.table == self.table:
                    pending.extend(_lines(e, layout, here))
            elif isinstance(e, ev.XidEvent):
                cut.rows += _flush(out, pending)
                self.at = cut.end = here
            elif isinstance(e, ev.QueryEvent):
                query = e.query.strip()
                if query.upper() in _ENDS_TXN:
                    cut.rows += _flush(out, pending)
                    self.at = cut.end = here
                elif query.upper() not in _QUIET:
                    if self._touches(query, e.schema):
                        cut.ddl, cut.ddl_end = query, here
                        return cut
                    self.at = cut.end = here  # DDL of another table: a transaction

    def _touches(self, query: str, schema: bytes | str) -> bool:
        """Whether DDL names the followed table (as `t`, t or `db`.`t`)."""
        current = schema.decode() if isinstance(schema, bytes) else schema
        name = re.escape(self.table)
        pattern = rf"(?<![\w$])(`?{re.escape(self.schema)}`?\s*\.\s*)?`?{name}`?(?![\w$])"
        found = re.search(pattern, query, re.IGNORECASE)
        if found is None:
            return False
        return bool(found.group(1)) or current == self.schema


def _lines(e: Any, layout: Layout, version: int) -> list[bytes]:
    from pymysqlreplication import row_event as rev

    out = []
    for row in e.rows:
        if isinstance(e, rev.UpdateRowsEvent):
            before, after = row["before_values"], row["after_values"]
            if any(before.get(k) != after.get(k) for k in layout.key):
                out.append(line(before, layout, version, 1))
            out.append(line(after, layout, version, 0))
        elif isinstance(e, rev.DeleteRowsEvent):
            out.append(line(row["values"], layout, version, 1))
        else:
            out.append(line(row["values"], layout, version, 0))
    return out


def _flush(out: IO[bytes], pending: list[bytes]) -> int:
    n = len(pending)
    if n:
        out.writelines(pending)
        pending.clear()
    return n


def _server_id() -> int:
    """A replica id of its own per reader (two readers of one id cut each other off)."""
    import os
    return 1_000_000 + (os.getpid() * 31 + threading.get_ident()) % 1_000_000_000
