"""The native binlog reader: mysql_binlog.c, compiled on first use, through ctypes.

mysql_binlog.py asks for the binlog on a pymysql connection, then hands that
connection's socket to the C reader, which splits the events and writes the followed
table's rows events as the unit's TSV lines (the text mysql_rows.py makes) with the GIL
released; what it leaves to Python comes back one event at a time (mysql_binlog.c's
header). Built with the system `cc` into `$CHLOAD_CACHE` (runtime/native.py), linking
nothing but libc.

Invariants: no compiler, or CHLOAD_BINLOG_READER=python: `library()` says why and the
reader stays in Python, with the same lines; a column whose type the C reader does not
read (FLOAT, DOUBLE, TIME, ENUM, SET, BIT, JSON, a text not UTF-8, latin1 or binary) sends the
table's rows events to mysql_rows.py.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chload.runtime import native
from chload.sources.changes import mysql_rows as mr

SOURCE = Path(__file__).with_name("mysql_binlog.c")
UNIT, EXHAUSTED, TICK, EVENT, END, LOST, WRITE, NOMEM = range(8)
TICK_SECONDS = 0.05  # how often a call comes back between transactions (stop, time)
_INT, _DECIMAL, _DATETIME2, _TIMESTAMP2, _DATE, _STRING, _YEAR = range(1, 8)
_SIZES = {"b": 1, "h": 2, "i": 4, "q": 8}


CHOSEN = "CHLOAD_BINLOG_READER=python"  # why, when the Python reader was asked for


def _build() -> tuple[Any, str]:
    if os.environ.get("CHLOAD_BINLOG_READER") == "python":
        return None, CHOSEN
    return native.load(SOURCE, "", "chload_binlog", "native binlog reader", _bind)


def _bind(lib: Any) -> Any:
    p, i, ll, ull, sz = (ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong,
                         ctypes.c_ulonglong, ctypes.c_size_t)
    ints = ctypes.POINTER(ctypes.c_int)
    lib.chl_bl_open.restype = p
    lib.chl_bl_open.argtypes = [i, i, ull, ctypes.c_char_p, ctypes.c_char_p]
    lib.chl_bl_close.restype = None
    lib.chl_bl_close.argtypes = [p]
    lib.chl_bl_reset.restype = None
    lib.chl_bl_reset.argtypes = [p, i, i, ull]
    lib.chl_bl_base.restype = None
    lib.chl_bl_base.argtypes = [p, ull]
    lib.chl_bl_map.restype = i
    lib.chl_bl_map.argtypes = [p, i, ull, ctypes.c_char_p, sz, i, ints, ints, ints]
    lib.chl_bl_order.restype = i
    lib.chl_bl_order.argtypes = [p, i, ints, i, ints]
    lib.chl_bl_append.restype = i
    lib.chl_bl_append.argtypes = [p, ctypes.c_char_p, sz, ll]
    lib.chl_bl_event.restype = p
    lib.chl_bl_event.argtypes = [p, ctypes.POINTER(sz)]
    lib.chl_bl_next.restype = i
    lib.chl_bl_next.argtypes = [p, i, ll, ull, ctypes.c_double, ctypes.POINTER(ll),
                                ctypes.POINTER(ull), ints, ctypes.POINTER(ull)]
    lib.chl_bl_commit.restype = ll
    lib.chl_bl_commit.argtypes = [p, i]
    lib.chl_bl_error.restype = ctypes.c_char_p
    lib.chl_bl_error.argtypes = [p]
    return lib


library = native.Once(_build)


def kinds(image: mr.Image) -> tuple[list[int], list[int], list[int]] | None:
    """The C reader's (kind, a, b) of each of a table map's columns; None if one of
    them is read by mysql_rows.py only."""
    kind: list[int] = []
    a: list[int] = []
    b: list[int] = []
    for column, read in zip(image.columns, image.readers, strict=True):
        t = column.type
        fixed, text = getattr(read, "fixed", None), getattr(read, "text", None)
        if fixed is not None:
            found = (_INT, _SIZES[fixed.lower()], int(fixed.islower()))
        elif t == mr.INT24:
            found = (_INT, 3, int(not getattr(column, "unsigned", False)))
        elif t == mr.NEWDECIMAL:
            found = (_DECIMAL, column.precision, column.decimals)
        elif t in (mr.DATETIME2, mr.TIMESTAMP2):
            found = (_DATETIME2 if t == mr.DATETIME2 else _TIMESTAMP2, column.fsp, 0)
        elif t == mr.DATE:
            found = (_DATE, 0, 0)
        elif t == mr.YEAR:
            found = (_YEAR, 0, 0)
        elif text is not None and text[1] in (None, "cp1252"):  # (latin1: cp1252)
            found = (_STRING, text[0], int(text[1] is not None))
        else:
            return None
        kind.append(found[0])
        a.append(found[1])
        b.append(found[2])
    return kind, a, b


def _ints(values: Sequence[int]) -> Any:
    return (ctypes.c_int * max(1, len(values)))(*values)


class Native:
    """One C reader on a binlog connection's socket."""

    def __init__(self, lib: Any, fd: int, checksum: bool, base: int, schema: str,
                 table: str) -> None:
        self.lib = lib
        self.handle = lib.chl_bl_open(fd, int(checksum), base, schema.encode(),
                                      table.encode())
        if not self.handle:
            raise MemoryError("the native binlog reader")
        self._made, self._at = ctypes.c_longlong(), ctypes.c_ulonglong()
        self._pending, self._here = ctypes.c_int(), ctypes.c_ulonglong()

    def close(self) -> None:
        if self.handle:
            self.lib.chl_bl_close(self.handle)
            self.handle = None

    def reset(self, fd: int, checksum: bool, base: int) -> None:
        self.lib.chl_bl_reset(self.handle, fd, int(checksum), base)

    def base(self, base: int) -> None:
        self.lib.chl_bl_base(self.handle, base)

    def map(self, table_id: int, body: bytes, image: mr.Image | None) -> bool:
        """The followed table's map (None: its id is another table's now); whether its
        rows are read in C."""
        if image is None:
            self.lib.chl_bl_map(self.handle, 0, table_id, None, 0, 0, None, None, None)
            return False
        found = kinds(image)
        if found is None:
            self.lib.chl_bl_map(self.handle, 2, table_id, None, 0, 0, None, None, None)
            return False
        kind, a, b = found
        if self.lib.chl_bl_map(self.handle, 1, table_id, body, len(body), len(kind),
                               _ints(kind), _ints(a), _ints(b)):
            raise MemoryError("the native binlog reader")
        return True

    def order(self, places: Sequence[int], keys: Sequence[int]) -> None:
        if self.lib.chl_bl_order(self.handle, len(places), _ints(places), len(keys),
                                 _ints(keys)):
            raise MemoryError("the native binlog reader")

    def next(self, fd: int, rows: int, end: int, seconds: float
             ) -> tuple[int, int, int, bool, int]:
        """(code, lines written, position after them or 0, lines pending, the event's
        position) of mysql_binlog.c's chl_bl_next."""
        code = self.lib.chl_bl_next(self.handle, fd, rows, end, seconds,
                                    ctypes.byref(self._made), ctypes.byref(self._at),
                                    ctypes.byref(self._pending), ctypes.byref(self._here))
        return (code, self._made.value, self._at.value, bool(self._pending.value),
                self._here.value)

    def event(self) -> bytes:
        size = ctypes.c_size_t()
        at = self.lib.chl_bl_event(self.handle, ctypes.byref(size))
        return ctypes.string_at(at, size.value) if at else b""

    def append(self, lines: Sequence[bytes]) -> None:
        data = b"".join(lines)
        if self.lib.chl_bl_append(self.handle, data, len(data), len(lines)):
            raise MemoryError("the native binlog reader")

    def commit(self, fd: int) -> int:
        """The pending lines made whole (a transaction Python saw end): how many."""
        made = self.lib.chl_bl_commit(self.handle, fd)
        if made < 0:
            raise OSError(self.error())
        return int(made)

    def error(self) -> str:
        return (self.lib.chl_bl_error(self.handle) or b"").decode(errors="replace")
