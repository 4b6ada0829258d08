"""The native MySQL/MariaDB reader: mysql_copy.c, compiled on first use, through ctypes.

It gets the rows over libmariadb's text protocol and writes them escaped, \\N for NULL,
straight into the engine's pipe, so the database sends plain columns and no Python
thread relays them (docs/sources-databases.md: "Why a C reader for MySQL/MariaDB").
It is built with the system `cc` against libmariadb.so.3 (no headers) into
`$CHLOAD_CACHE` or ~/.cache/chload/native, named by a hash of its source and the library.

Invariants: no compiler, no library, or CHLOAD_MYSQL_READER=client: `load()` says why
and the `mariadb` client is used, with the same snapshot and ranges; the password goes to
libmariadb in this process only (no command line, no environment).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chload.runtime import native

if TYPE_CHECKING:
    from chload.core.reading.ranges import Guard

SOURCE = Path(__file__).with_name("mysql_copy.c")
CONNECT_TIMEOUT = 10
WRITE_FAILED = -1
ZERO_DATE = -2  # a zero date where the range may hold none (NativeError args: the
# field's index and its value, tab-separated: mysql_copy.c put_row)
OUT_OF_RANGE = -3  # a date or time the target's type cannot hold (core/reading/ranges.py): the same


def libmariadb() -> str:
    """The system's libmariadb (or libmysqlclient) to link; '' if none."""
    return native.system_library(["libmariadb.so.3", "libmysqlclient.so.21"], "mariadb")


def _build() -> tuple[Any, str]:
    if os.environ.get("CHLOAD_MYSQL_READER") == "client":
        return None, "CHLOAD_MYSQL_READER=client"
    library = libmariadb()
    if not library:
        return None, "no libmariadb.so.3 found (apt-get install libmariadb3)"
    return native.load(SOURCE, library, "chload_mysql", "native MySQL reader", _bind)


def _bind(lib: Any) -> Any:
    text, size = ctypes.c_char_p, ctypes.c_size_t
    lib.chl_my_open.restype = ctypes.c_void_p
    lib.chl_my_open.argtypes = [text, ctypes.c_uint, text, text, text, ctypes.c_uint,
                                ctypes.POINTER(ctypes.c_int), text, size]
    lib.chl_my_exec.restype = ctypes.c_int
    lib.chl_my_exec.argtypes = [ctypes.c_void_p, text, text, size]
    lib.chl_my_copy.restype = ctypes.c_int
    lib.chl_my_copy.argtypes = [ctypes.c_void_p, text, ctypes.c_int, text,
                                ctypes.POINTER(ctypes.c_longlong), text, size]
    lib.chl_my_rows.restype = ctypes.c_int
    lib.chl_my_rows.argtypes = [ctypes.c_void_p, text, ctypes.POINTER(ctypes.c_void_p),
                                ctypes.POINTER(size), text, size]
    lib.chl_my_free.restype = None
    lib.chl_my_free.argtypes = [ctypes.c_void_p]
    lib.chl_my_abort.restype = None
    lib.chl_my_abort.argtypes = [ctypes.c_void_p]
    lib.chl_my_close.restype = None
    lib.chl_my_close.argtypes = [ctypes.c_void_p]
    return lib


class NativeError(Exception):
    """A libmariadb error: args are (error number, message), as pymysql's."""


class Connection:
    """One libmariadb connection. `copy` runs in a relay thread (the GIL released);
    `abort` may come from another thread meanwhile; `close` only once neither runs."""

    def __init__(self, lib: Any, host: str, port: int, user: str, password: str | None,
                 database: str) -> None:
        self.lib = lib
        err, code = ctypes.create_string_buffer(1024), ctypes.c_int(0)
        self.handle = lib.chl_my_open(host.encode(), port, user.encode() or None,
                                      password.encode() if password is not None else None,
                                      database.encode(), CONNECT_TIMEOUT, ctypes.byref(code),
                                      err, len(err))
        if not self.handle:  # 2003 (cannot connect) when libmariadb gave no number
            raise NativeError(code.value or 2003, err.value.decode(errors="replace"))

    def execute(self, sql: str) -> None:
        err = ctypes.create_string_buffer(1024)
        code = self.lib.chl_my_exec(self.handle, sql.encode(), err, len(err))
        if code:
            raise NativeError(code, err.value.decode(errors="replace"))

    def rows(self, sql: str) -> list[tuple[str | None, ...]]:
        """The rows of a small statement (metadata, bounds: never a table's data), each
        field a string or None for NULL."""
        err = ctypes.create_string_buffer(1024)
        buf, size = ctypes.c_void_p(), ctypes.c_size_t()
        code = self.lib.chl_my_rows(self.handle, sql.encode(), ctypes.byref(buf),
                                    ctypes.byref(size), err, len(err))
        if code:
            raise NativeError(code, err.value.decode(errors="replace"))
        if not buf.value:
            return []
        try:
            text = ctypes.string_at(buf.value, size.value).decode(errors="replace")
        finally:
            self.lib.chl_my_free(buf)
        return [tuple(_field(f) for f in line.split("\t")) for line in text.splitlines()]

    def copy(self, sql: str, fd: int, checks: str = "") -> int:
        """The rows of `sql` as TSV into `fd`; how many. `checks`: what each field is
        checked for (zero dates, a range: mysql_copy.c parse_checks; mysql.py makes it).
        Raises NativeError (the connection is then unusable: close it)."""
        err = ctypes.create_string_buffer(1024)
        rows = ctypes.c_longlong(0)
        code = self.lib.chl_my_copy(self.handle, sql.encode(), fd, checks.encode() or None,
                                    ctypes.byref(rows), err, len(err))
        if code:
            raise NativeError(code, err.value.decode(errors="replace"))
        return rows.value

    def abort(self) -> None:
        if self.handle:
            self.lib.chl_my_abort(self.handle)

    def close(self) -> None:
        if self.handle:
            self.lib.chl_my_close(self.handle)
            self.handle = None


class NativeReader:
    """A snapshot reader (mysql.py's pool) on a libmariadb connection: `run` writes a
    statement's rows into a file descriptor; the end of the rows is the end of the
    call, so no marker is needed."""

    native = True

    def __init__(self, conn: Connection, fail: Callable[[NativeError], Exception]) -> None:
        self.conn, self.fail = conn, fail

    @classmethod
    def start(cls, lib: Any, url: Any, password: str | None, setup: Sequence[str],
              fail: Callable[[NativeError], Exception]) -> NativeReader:
        """Connect and run `setup` (the statements that start the snapshot)."""
        try:
            conn = Connection(lib, url.host, url.port, url.user, password, url.database)
        except NativeError as exc:
            raise fail(exc) from None
        reader = cls(conn, fail)
        try:
            for statement in setup:
                conn.execute(statement)
        except NativeError as exc:
            reader.stop(kill=True)
            raise fail(exc) from None
        return reader

    def run(self, statement: str, out: int, checks: str = "") -> None:
        try:
            self.conn.copy(statement, out, checks)
        except NativeError as exc:
            raise self.fail(exc) from None

    def abort(self) -> None:
        self.conn.abort()

    def stop(self, kill: bool = False) -> None:
        """Close the connection (which ends its transaction); `kill`: its state is
        unknown (a range cut halfway), so its socket is shut first."""
        if kill:
            self.conn.abort()
        self.conn.close()


_UNESCAPE = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r", "0": "\0"}


def _field(text: str) -> str | None:
    """One field of `Connection.rows` (escaped as mysql_copy.c's escape())."""
    if text == "\\N":
        return None
    if "\\" not in text:
        return text
    out, chars = [], iter(text)
    for c in chars:
        out.append(_UNESCAPE.get(next(chars, ""), "") if c == "\\" else c)
    return "".join(out)


load = native.Once(_build)  # the compiled reader, or None and why not (one line)


def checks_of(zero: str, guards: dict[int, Guard], fields: int) -> str:
    """What the native reader checks in each field (mysql_copy.c parse_checks): zero dates
    (`zero`: mysql.py's _zero_dates) and ranges (core/reading/ranges.py); '' for nothing."""
    if not zero and not guards:
        return ""
    mode = "S" if any(g.rejects for g in guards.values()) else "F"
    fields_spec = [f"{zero[i] if zero else '0'}{guards[i].lo if i in guards else ''}\t"
                   f"{guards[i].hi if i in guards else ''}\n" for i in range(fields)]
    return mode + "".join(fields_spec)
