"""The native replication stream reader: stream_reader.c, compiled on first use, through
ctypes.

replication.py's `Stream` starts the replication on psycopg's libpq connection, then
hands the connection (its PGconn pointer) to the C reader, which reads the CopyData
messages and writes each change's text as one line of the spool segment with the GIL
released; it comes back at a commit whose position matters, a keepalive, when the wake
pipe is written, and at least once a second (stream_reader.c's header), and Python keeps
every position, seal and status rule.

The C code calls the libpq that owns the connection: the one psycopg loaded (psycopg's
binary package bundles its own; the C and Python ones use the system's), found among
the libraries the process has mapped and opened again without loading anything
(RTLD_NOLOAD): its functions' addresses are handed to the reader, which links nothing
but libc.

Invariants: no compiler, CHLOAD_PG_STREAM_READER=python, or no libpq known to be
psycopg's: `library()` or `Native.open` says why and the loop stays in Python, writing
the same spool bytes.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from chload.runtime import native

SOURCE = Path(__file__).with_name("stream_reader.c")
COMMIT, KEEPALIVE, IDLE, END, FAILED, CONSUME, WRITE, NOMEM = range(8)
BATCH = 4096  # messages after which a commit comes back to Python (its position)
CHOSEN = "CHLOAD_PG_STREAM_READER=python"  # why, when the Python loop was asked for


class State(ctypes.Structure):
    """stream_reader.c's chl_pg_state: what a call is given and what it says."""

    _fields_ = [("room", ctypes.c_int64), ("batch", ctypes.c_int64),
                ("stop", ctypes.c_int32), ("in_txn", ctypes.c_int32),
                ("commit_at", ctypes.c_int64), ("commit_bytes", ctypes.c_int64),
                ("commit_changes", ctypes.c_int64), ("bytes", ctypes.c_int64),
                ("changes", ctypes.c_int64), ("sent", ctypes.c_int64),
                ("asked", ctypes.c_int32), ("error", ctypes.c_int32)]


def _build() -> tuple[Any, str]:
    return native.load(SOURCE, "", "chload_pgstream", "native replication stream reader",
                       _bind)


def _bind(lib: Any) -> Any:
    p = ctypes.c_void_p
    lib.chl_pg_open.restype = p
    lib.chl_pg_open.argtypes = [p, p, p, p]
    lib.chl_pg_close.restype = None
    lib.chl_pg_close.argtypes = [p]
    lib.chl_pg_next.restype = ctypes.c_int
    lib.chl_pg_next.argtypes = [p, p, ctypes.c_int, ctypes.c_int, ctypes.c_double,
                                ctypes.POINTER(State)]
    return lib


library = native.Once(_build)


def psycopg_libpq() -> tuple[str, str]:
    """The path of the libpq psycopg's connections are made by, or '' and why not."""
    from psycopg import pq
    mapped: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                if os.path.basename(path).startswith("libpq") and ".so" in path:
                    mapped.add(path)
    except OSError as exc:
        return "", f"the libraries loaded are not known ({exc})"
    if pq.__impl__ == "binary":  # (its own libpq, beside its package)
        import psycopg_binary
        libs = os.path.dirname(os.path.dirname(psycopg_binary.__file__ or "")) + os.sep
        mapped = {path for path in mapped if path.startswith(libs)}
    if len(mapped) != 1:
        return "", (f"which libpq psycopg ({pq.__impl__}) uses is not clear "
                    f"({len(mapped)} loaded)")
    return mapped.pop(), ""


class Native:
    """One C reader on a replication connection (psycopg's pq.PGconn)."""

    def __init__(self, lib: Any, handle: int) -> None:
        self.lib, self.handle, self.state = lib, handle, State()
        self.state.batch = BATCH

    @classmethod
    def open(cls) -> tuple[Native | None, str]:
        """A reader, or None and why not."""
        if os.environ.get("CHLOAD_PG_STREAM_READER") == "python":
            return None, CHOSEN
        lib, why = library()
        if lib is None:
            return None, why
        path, why = psycopg_libpq()
        if not path:
            return None, why
        try:  # (RTLD_NOLOAD: the one loaded, never a second copy)
            pq = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
            funcs = [ctypes.cast(getattr(pq, name), ctypes.c_void_p).value
                     for name in ("PQgetCopyData", "PQconsumeInput", "PQsocket",
                                  "PQfreemem")]
        except (OSError, AttributeError) as exc:
            return None, f"psycopg's libpq could not be opened again: {exc}"
        return cls.over(lib, funcs), ""

    @classmethod
    def over(cls, lib: Any, funcs: list[int | None]) -> Native:
        """A reader calling these PQgetCopyData, PQconsumeInput, PQsocket, PQfreemem."""
        handle = lib.chl_pg_open(*funcs)
        if not handle:
            raise MemoryError("the native replication stream reader")
        return cls(lib, handle)

    def close(self) -> None:
        if self.handle:
            self.lib.chl_pg_close(self.handle)
            self.handle = 0

    def next(self, conn: Any, fd: int, wake: int, wait: float) -> int:
        """One call of chl_pg_next (its results in `state`)."""
        return int(self.lib.chl_pg_next(self.handle, conn.pgconn_ptr, fd, wake, wait,
                                        ctypes.byref(self.state)))
