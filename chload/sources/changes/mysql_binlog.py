"""The binlog read into spool files: each unit whole transactions, each row one TSV line.

chload's own binlog client: a pymysql connection that asks for the binlog from a position
(COM_BINLOG_DUMP, as a replica does), its events split here, the rows events of the
followed table read by mysql_rows.py straight into TSV lines (no dict, no Python value
per row). A rows event of the followed table becomes lines of the table's columns plus
`_version` (the event's binlog position) and `_is_deleted`: an insert or an update its
after image, a delete its before image marked deleted, an update that moves the key also
a deleted line for the old key. The engine parses the lines.

A unit ends at a transaction's end (XID, or COMMIT of a non-transactional table) once it
holds `rows` rows or `seconds` passed, at the position the run must stop at, or before
DDL of the table (returned to the caller: a column added, or a stop).
"""

from __future__ import annotations

import contextlib
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from chload.errors import SourceError
from chload.sources.changes import mysql_binlog_native as nat
from chload.sources.changes.mysql_rows import Image
from chload.sources.changes.mysql_table import log_of, position

HEARTBEAT = 0.5  # seconds: an idle server's heartbeat lets a unit end on time
_ENDS_TXN = {"COMMIT", "XA COMMIT"}
_QUIET = {"BEGIN", "COMMIT", "ROLLBACK"}
# event types (mysql's Log_event_type; MariaDB's compressed ones 165-171)
_QUERY, _ROTATE, _XID, _TABLE_MAP, _HEARTBEAT = 2, 4, 16, 19, 27
_ROWS = {23: "write", 24: "update", 25: "delete", 30: "write", 31: "update", 32: "delete"}
_COMPRESSED = range(165, 172)
_DUMP = 0x12  # COM_BINLOG_DUMP
_LOST = (2006, 2013)  # the server has gone away, lost connection: connect again
_RECONNECTS = 3


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
    """The followed table's columns in order (the lines' order), and its primary key."""

    names: list[str]
    key: list[str]


def layout_of(columns: Sequence[tuple[str, str]], key: Sequence[str]) -> Layout:
    """(name, MySQL column type) in table order, and the primary key -> Layout."""
    return Layout([n for n, _ in columns], list(key))


# what the reader hands the unit: (kind, position after the event, what it says)
# kind "rows": (Image, write/update/delete, bytes, offset of the rows, end of the rows);
# "xid": None; "query": (query text, its default schema); "beat": None
Event = tuple[str, int, Any]
_END: Event = ("end", 0, None)


class BinlogReader:
    """One binlog connection from a position on, read unit by unit."""

    native: nat.Native | None = None  # the native reader on its socket (None: Python)

    def __init__(self, settings: dict[str, Any], log_file: str, log_pos: int,
                 schema: str, table: str, follow: bool) -> None:
        self.schema, self.table = schema, table
        self.where = f"binlog of {schema}.{table}"
        self.log_file = log_file
        self.at = position(log_file, log_pos)  # the end of the last transaction read
        self.images: dict[bytes, Image | None] = {}  # a table map's bytes -> its readers
        self.mapped: dict[int, Image] = {}  # table id -> the followed table's readers
        self.settings, self.follow = settings, follow
        self.conn, self.checksum = _dump(settings, log_file, log_pos, follow, self.where)
        self.dbms = "mariadb" if "mariadb" in self.conn.get_server_info().lower() else "mysql"
        self.base = position(log_file, 0)
        self._events: Iterator[Event] = self._read()
        self._layout: Layout | None = None
        self._in_c = False  # the followed table's rows read by the native reader
        self._c_image: Image | None = None  # (their columns)
        lib, self.native_why = nat.library()
        if lib is not None:  # the socket read by C from here on (mysql_binlog_native)
            self.native = nat.Native(lib, self.conn._sock.fileno(), self.checksum, self.base,
                                 schema, table)

    def close(self) -> None:
        if self.native is not None:
            self.native.close()
        self.conn.close()

    def unit(self, out: IO[bytes], layout: Layout, rows: int, seconds: float,
             end: int | None, stop: Callable[[], bool],
             awaited: Callable[[], bool] = lambda: True) -> Cut:
        """Read whole transactions into `out` (see the module docstring). Past `seconds`
        a unit ends only once `awaited()` (the unit before it committed): while a commit
        takes longer, the unit grows instead of queueing behind it."""
        if self.native is not None:
            return self._native_unit(out, layout, rows, seconds, end, stop, awaited)
        cut = Cut(self.at)
        pending: list[bytes] = []
        started = time.monotonic()
        names, key = layout.names, layout.key
        while True:
            if not pending and _ends(cut, end, rows, started, seconds, awaited, stop):
                return cut
            kind, here, said = next(self._events, _END)
            if kind == "rows":
                image, change, data, first, last = said
                pending.extend(image.lines(data, first, last, change, names, key, here))
            elif kind == "xid":
                cut.rows += _flush(out, pending)
                self.at = cut.end = here
            elif kind == "query":
                ends = self._query(cut, said, here)
                if ends is None:
                    return cut
                if ends:
                    cut.rows += _flush(out, pending)
                    self.at = cut.end = here
            elif kind == "restart":  # read again from the unit's last whole transaction
                pending.clear()
            elif kind == "end":
                cut.exhausted = True
                return cut

    def _query(self, cut: Cut, said: tuple, here: int) -> bool | None:
        """A query event at `here`: True when it ends the transaction (the caller writes
        it, then moves the position to `here`); None when it is DDL of the followed table
        (`cut` says which: the unit ends before it); else False (BEGIN and the like, or
        another table's DDL, a transaction of its own: the position moves past it)."""
        query = said[0].strip()
        if query.upper() in _ENDS_TXN:
            return True
        if query.upper() not in _QUIET:
            if self._touches(query, said[1]):
                cut.ddl, cut.ddl_end = query, here
                return None
            self.at = cut.end = here
        return False

    def _native_unit(self, out: IO[bytes], layout: Layout, rows: int, seconds: float,
                     end: int | None, stop: Callable[[], bool],
                     awaited: Callable[[], bool]) -> Cut:
        """unit() with the native reader: C reads until a unit may end (rows, the end
        position, a tick between transactions) or an event is Python's."""
        assert self.native is not None
        native, cut, pending, lost = self.native, Cut(self.at), False, 0
        started = time.monotonic()
        out.flush()
        fd = out.fileno()
        if layout is not self._layout:
            self._layout = layout
            if self._in_c and self._c_image is not None:
                native.order(*_order(self._c_image, layout))
        while True:
            if not pending and _ends(cut, end, rows, started, seconds, awaited, stop):
                return cut
            code, made, at, pending, _ = native.next(fd, max(1, rows - cut.rows), end or 0,
                                                     nat.TICK_SECONDS)
            cut.rows += made
            if at:
                self.at = cut.end = at
            if code == nat.LOST:
                if lost >= _RECONNECTS:
                    raise SourceError(f"{self.where}: {native.error()}")
                lost += 1  # the connection dropped: again from the last whole transaction
                time.sleep(lost - 1)
                self._reconnect()
                pending = False
                continue
            lost = 0
            if code == nat.END:
                cut.exhausted = True
                return cut
            if code in (nat.WRITE, nat.NOMEM):
                raise SourceError(f"{self.where}: {native.error() or 'out of memory'}")
            if code != nat.EVENT:
                continue
            event = self._event(native.event())
            if event is None:
                continue
            kind, here, said = event
            if kind == "rows":
                image, change, data, first, last = said
                lines = image.lines(data, first, last, change, layout.names, layout.key,
                                    here)
                if lines:
                    native.append(lines)
                    pending = True
            elif kind == "query":
                ends = self._query(cut, said, here)
                if ends is None:
                    return cut
                if ends:
                    cut.rows += native.commit(fd)
                    pending = False
                    self.at = cut.end = here

    def _read(self) -> Iterator[Event]:
        """The binlog's events that matter here, split from the connection's packets."""
        import pymysql

        read = self.conn._read_bytes  # (pymysql's socket reads: its errors, timeouts)
        lost = 0
        while True:
            try:
                head = read(4)
                size = int.from_bytes(head[:3], "little")
                data = read(size)
                while size == 0xFFFFFF:  # an event of 16 MiB or more: packets follow
                    size = int.from_bytes(read(4)[:3], "little")
                    data += read(size)
            except pymysql.OperationalError as exc:
                if not exc.args or exc.args[0] not in _LOST or lost >= _RECONNECTS:
                    raise SourceError(f"{self.where}: {exc.args[-1] if exc.args else exc}"
                                      ) from None
                lost += 1  # the connection dropped: again from the last whole transaction
                time.sleep(lost - 1)
                read = self._reconnect()
                yield "restart", self.at, None
                continue
            except pymysql.Error as exc:
                raise SourceError(f"{self.where}: {exc.args[-1] if exc.args else exc}"
                                  ) from None
            lost = 0
            event = self._event(data)
            if event is _END:
                return
            if event is not None:
                yield event

    def _event(self, data: bytes) -> Event | None:
        """One packet's event that matters here (None: none; _END: the log's end); a
        table map or a rotate taken in."""
        if not data or data[0] != 0:
            if data[:1] == b"\xfe" and len(data) < 9:  # the log's end (no --follow)
                return _END
            if data[:1] == b"\xff":
                raise SourceError(f"{self.where}: {_error(data)}")
            return None
        kind, size, log_pos = data[5], *struct.unpack_from("<II", data, 10)
        end = 1 + size - (4 if self.checksum else 0)
        here = self.base | log_pos if log_pos else 0
        if kind in _ROWS:
            image = self.mapped.get(int.from_bytes(data[20:26], "little"))
            if image is not None:
                return "rows", here, (image, _ROWS[kind], data, _rows_at(data, kind), end)
        elif kind == _TABLE_MAP:
            self._map(data, end)
        elif kind == _XID:
            return "xid", here, None
        elif kind == _QUERY:
            return "query", here, _query(data, end)
        elif kind == _ROTATE:
            self.log_file = data[28:end].decode()
            self.base = position(self.log_file, 0)
            if self.native is not None:
                self.native.base(self.base)
        elif kind == _HEARTBEAT:
            return "beat", here, None
        elif kind in _COMPRESSED:
            raise SourceError(f"{self.where}: the binlog is compressed "
                              "(log_bin_compress): change capture reads it "
                              "uncompressed; turn log_bin_compress off")
        return None

    def _reconnect(self) -> Callable[[int], bytes]:
        """A new binlog connection from the end of the last whole transaction read."""
        with contextlib.suppress(Exception):
            self.conn.close()
        self.log_file, pos = log_of(self.at, self.log_file)
        self.mapped.clear()
        self.conn, self.checksum = _dump(self.settings, self.log_file, pos, self.follow,
                                         self.where)
        self.base = position(self.log_file, 0)
        if self.native is not None:
            self.native.reset(self.conn._sock.fileno(), self.checksum, self.base)
        return self.conn._read_bytes

    def _map(self, data: bytes, end: int) -> None:
        """A table map: the followed table's readers (made once per distinct map), else
        its id forgotten (its rows are skipped)."""
        table_id = int.from_bytes(data[20:26], "little")
        body = data[20:end]
        if body in self.images:
            image = self.images[body]
        else:
            at = 28
            schema = data[at + 1:at + 1 + data[at]].decode("utf-8", "replace")
            at += data[at] + 2
            table = data[at + 1:at + 1 + data[at]].decode("utf-8", "replace")
            image = None
            if schema == self.schema and table == self.table:
                image = Image(_columns(data, self.checksum, self.dbms), self.where)
            if len(self.images) > 1024:  # (maps of many tables: kept bounded)
                self.images.clear()
            self.images[body] = image
        if image is None:
            self.mapped.pop(table_id, None)
        else:
            self.mapped[table_id] = image
        if self.native is not None:
            self._in_c = self.native.map(table_id, body, image)
            if self._in_c:
                self._c_image = image
                if image is not None and self._layout is not None:
                    self.native.order(*_order(image, self._layout))

    def _touches(self, query: str, schema: bytes | str) -> bool:
        """Whether DDL names the followed table (as `t`, t or `db`.`t`)."""
        current = schema.decode() if isinstance(schema, bytes) else schema
        name = re.escape(self.table)
        pattern = rf"(?<![\w$])(`?{re.escape(self.schema)}`?\s*\.\s*)?`?{name}`?(?![\w$])"
        found = re.search(pattern, query, re.IGNORECASE)
        if found is None:
            return False
        return bool(found.group(1)) or current == self.schema


def _dump(settings: dict[str, Any], log_file: str, log_pos: int, follow: bool,
          where: str) -> tuple[Any, bool]:
    """A connection that has asked for the binlog from (log_file, log_pos), as a replica
    (server id of its own; without --follow the server ends at its log's end), and
    whether its events carry a checksum."""
    import pymysql

    try:
        conn = pymysql.connect(host=settings["host"], port=settings["port"],
                               user=settings["user"] or None,
                               password=settings["passwd"] or "", connect_timeout=10,
                               charset="utf8mb4")
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL VARIABLES LIKE 'BINLOG_CHECKSUM'")
            found = cur.fetchone()
            checksum = found is not None and str(found[1]).upper() != "NONE"
            if checksum:
                cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            if follow:
                cur.execute("SET @master_heartbeat_period = %s", (int(HEARTBEAT * 1e9),))
            cur.execute("SET @mariadb_slave_capability = 4")
        payload = bytes([_DUMP]) + struct.pack("<IHI", log_pos, 0 if follow else 1,
                                               _server_id()) + log_file.encode()
        conn._write_bytes(struct.pack("<I", len(payload))[:3] + b"\x00" + payload)
        conn._next_seq_id = 1
    except pymysql.Error as exc:
        raise SourceError(f"{where}: {exc.args[-1] if exc.args else exc}") from None
    return conn, checksum


def _error(data: bytes) -> str:
    """An error packet's text: code and message (the server's words)."""
    code = int.from_bytes(data[1:3], "little")
    text = data[9:] if data[3:4] == b"#" else data[3:]
    return f"({code}) {text.decode('utf-8', 'replace')}"


def _rows_at(data: bytes, kind: int) -> int:
    """Where a rows event's body starts (its column count): after the table id and
    flags, and a version 2 event's extra data."""
    if kind < 30:
        return 28
    return 28 + int.from_bytes(data[28:30], "little")


def _query(data: bytes, end: int) -> tuple[str, str]:
    """A query event's (statement, default schema)."""
    schema_len = data[28]
    status_len = int.from_bytes(data[31:33], "little")
    at = 33 + status_len
    schema = data[at:at + schema_len].decode("utf-8", "replace")
    return data[at + schema_len + 1:end].decode("utf-8", "replace"), schema


def _columns(data: bytes, checksum: bool, dbms: str) -> list[Any]:
    """A table map's columns, as mysql-replication reads them (types, metadata, and the
    optional metadata: names, signedness, character sets, ENUM/SET values)."""
    from types import SimpleNamespace

    from pymysql.protocol import MysqlPacket
    from pymysqlreplication import event as ev, row_event as rev
    from pymysqlreplication.packet import BinLogPacketWrapper

    wrapped = BinLogPacketWrapper(
        MysqlPacket(data, "utf8"), table_map={}, ctl_connection=SimpleNamespace(
            charset="utf8mb4", _get_dbms=lambda: dbms), mysql_version=None, use_checksum=checksum,
        allowed_events=frozenset([rev.TableMapEvent, ev.RotateEvent]), only_tables=None,
        ignored_tables=None, only_schemas=None, ignored_schemas=None, freeze_schema=False,
        ignore_decode_errors=False, verify_checksum=False, optional_meta_data=True,
        enable_logging=False)
    return list(wrapped.event.columns)


def _order(image: Image, layout: Layout) -> tuple[list[int], list[int]]:
    """Where each of the lines' columns is in the image (-1: none), and the key's."""
    places, keys = image.order(layout.names, layout.key)
    return (list(range(len(image.names))) if places is None else places), keys


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


def _ends(cut: Cut, end: int | None, rows: int, started: float, seconds: float,
          awaited: Callable[[], bool], stop: Callable[[], bool]) -> bool:
    """Between transactions, whether the unit ends here: the end position reached (then
    `cut.exhausted`), its rows, its time once the unit before committed, or a stop."""
    if end is not None and cut.end >= end:
        cut.exhausted = True
        return True
    return bool(cut.rows and (cut.rows >= rows or (
        time.monotonic() - started >= seconds and awaited()))) or stop()
