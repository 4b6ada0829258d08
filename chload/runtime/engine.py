"""The in-process ClickHouse engine (chDB), persistent in one directory.

chDB allows one database path per process, and a second process cannot open a path
another holds; its own message for that is cryptic. We take an exclusive `flock` on
`<dir>/.chload.lock` first, so a second chload gets one clear line instead.
A chDB session runs one query at a time (a second thread's `SELECT 1` waits for the
first thread's INSERT to finish), but several sessions on one path run in parallel.
So each thread gets its own session. The same class, in memory, is a server target's
loader engine (server/push.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from chload.errors import ChloadError, DataError, TargetInUse, UsageError, from_engine_message
from chload.runtime.library import release_relocations
from chload.runtime.monitor import CallStats

LOCK_NAME = ".chload.lock"
# Settings of every chDB session; a query's own SETTINGS (a user's --setting) still win.
# - compile_*: no JIT. The engine compiles an expression (LLVM) the third time it sees
#   it, and a commit's survey (argMax) and block-number query (max) would pay for that
#   at the end of the load, where nothing overlaps it; a load's own expressions are
#   column copies, too cheap to gain from compiling.
# For bounded memory (bench/memory.py):
# - storage_file_read_method: chDB's file() maps a local file into memory by default
#   (mmap), so RSS grows with the file. pread reads through bounded buffers at the
#   same speed.
# - BLOCK_SETTINGS, for an insert of much data (the embedded target sets them per
#   insert, only there: embedded/target.py LARGE_UNIT_BYTES).
SESSION_SETTINGS: tuple[tuple[str, str], ...] = (
    ("storage_file_read_method", "pread"),
    ("compile_aggregate_expressions", "0"),
    ("compile_expressions", "0"),
    # A CSV/TSV file ending in blank lines (an editor's, an export's) reads as its rows,
    # not as a row of defaults or "Rows have different amount of values". 18.16 cannot:
    # a raw POST that fails falls back to this engine (fill.py _fill).
    ("input_format_csv_skip_trailing_empty_lines", "1"),
    ("input_format_tsv_skip_trailing_empty_lines", "1"),
    # A NULL into a column that is not Nullable is an error, not the type's default
    # (0, '', 1970-01-01) stored without a word: exact for Parquet, ORC, Arrow, Avro and
    # Native, and `\N` in CSV/TSV (not an empty CSV field, not JSON's null: fit.py looks
    # for those in a file's start). `--setting input_format_null_as_default=1` asks for
    # the default back (a query's SETTINGS win).
    ("input_format_null_as_default", "0"),
    # The ledger's summary read in its order (the committer's first look, the planner's
    # keys) merges its parts' streams; buffered ahead, each stream holds blocks of its
    # own, so a ledger of a million files cost the loader tens of MiB at the first look.
    ("read_in_order_use_buffering", "0"),
)
# - min_insert_block_size_bytes: an insert squashes rows into blocks of 1M rows or 256 MB
#   (one part each), i.e. ~128 MB a block per insert thread for wide rows, several held
#   at once: 1.5-1.8 GB. Bounded by bytes: 32 MB 0.86-1.02 GB.
# - input_format_parquet_memory_high_watermark: the Parquet reader reads row groups ahead
#   up to 4 GB by default, more than the insert can take; at 128 MB (about one row group
#   of 128 MB read at a time per thread) the reader's share fell from ~550 to ~390 MB.
# Both cost where the data is small: more, smaller parts of wide rows (taxi, 10 x 5 MB
# gzip CSV of 51 columns: 3.7-4.4 CPU s against 3.0-3.7 without; bench/results.md).
BLOCK_SETTINGS: tuple[tuple[str, str], ...] = (
    ("min_insert_block_size_bytes", str(32 << 20)),
    ("input_format_parquet_memory_high_watermark", str(128 << 20)),
)


# Sessions open in this process, all engines: none left means the engine has nothing of
# ours to shut down, and the process may end without Python's teardown (cli.run).
_live = [0]
_live_guard = threading.Lock()
_import_guard = threading.Lock()
_released: list[int] = []  # the library's relocation pages given back, once (library.py)
_RTLD_DEEPBIND = 0x8  # (dlfcn.h) as chdb/__init__.py preloads its library


def idle() -> bool:
    """Whether no session of any engine is open (every engine was closed)."""
    return _live[0] == 0


class QueryStats(CallStats):
    """An engine's queries (CallStats), with the count and seconds of those before the
    first data query began (set-up: ledger, probe, table) and the sessions opened, for
    EmbeddedTarget.cost_report."""

    def __init__(self) -> None:
        super().__init__()
        self.first_data_at: float | None = None  # time.time() when the first began
        self.setup: tuple[int, float] | None = None
        self.sessions = 0
        self.open_seconds = 0.0  # opening sessions (the first one imports chDB)

    def opened(self, seconds: float) -> None:
        with self._guard:
            self.sessions += 1
            self.open_seconds += seconds

    def begin(self, data: bool) -> None:
        if data and self.first_data_at is None:
            with self._guard:
                if self.first_data_at is None:
                    self.first_data_at = time.time()
                    self.setup = (self.calls, self.seconds)


class Engine:
    """chDB sessions, one per call under way, on a directory this process holds exclusively, or
    in memory (`path=None`: the loader's own engine for a server target, which keeps
    nothing). Sessions open on first use."""

    def __init__(self, path: str | None,
                 settings: tuple[tuple[str, str], ...] = SESSION_SETTINGS + BLOCK_SETTINGS,
                 ) -> None:
        self.path = os.path.abspath(path) if path else None
        self.settings = settings  # every session's (SET at open)
        self._lock = _acquire(self.path) if self.path else None
        self._sessions: list[Any] = []  # every session opened
        self._idle: list[Any] = []  # those no call is using
        self._guard = threading.Lock()
        self.stats = QueryStats()

    @contextlib.contextmanager
    def _session(self) -> Iterator[Any]:
        """A session for one call, used by no other call meanwhile: an idle one, else a
        new one. Sessions are as many as calls ever ran at once, not one per thread
        that ever called (a run's workers are new threads each poll of a follow)."""
        with self._guard:
            session = self._idle.pop() if self._idle else None
        if session is None:
            began = time.monotonic()
            session = self._open()
            self.stats.opened(time.monotonic() - began)
            with self._guard:
                self._sessions.append(session)
            with _live_guard:
                _live[0] += 1
        try:
            yield session
        finally:
            with self._guard:
                self._idle.append(session)

    def _open(self) -> Any:
        _import_chdb()
        import chdb.session

        try:
            session = chdb.session.Session(self.path) if self.path else chdb.session.Session()
        except Exception as exc:  # chDB allows one data path per process
            if self.path:
                raise _convert(exc, f"target {self.path}") from exc
            raise UsageError(
                f"cannot start the loader's engine ({str(exc).splitlines()[0]}); a process "
                "can use an embedded target or a server target, not both") from exc
        if self.settings:
            session.query("SET " + ", ".join(f"{k} = '{v}'" for k, v in self.settings))
        return session

    def query(self, sql: str, fmt: str = "TSV", context: str = "query") -> str:
        """Run a statement; engine errors become chload errors naming `context`."""
        result = self._run(sql, fmt, context)
        return _text(result.bytes()) if result is not None else ""

    def answer(self, sql: str, fmt: str, context: str = "query") -> bytes:
        """A query's answer as the engine writes it (a binary format: no text)."""
        result = self._run(sql, fmt, context)
        return result.bytes() if result is not None else b""

    def give_back(self) -> None:
        """Return the memory the engine's allocator keeps after a large query (a long
        ledger grouped) to the system, so the loader's resident size stays what it
        needs (SYSTEM JEMALLOC PURGE; nothing where the engine has no jemalloc)."""
        with contextlib.suppress(ChloadError):
            self.query("SYSTEM JEMALLOC PURGE", "TSV", "memory")

    def execute(self, sql: str, context: str = "query",
                errors: Callable[[str], ChloadError] | None = None) -> tuple[int, int]:
        """Run a write; return (rows written, bytes read from storage) from the engine.
        `errors` turns the engine's message into the error to raise (default: by code)."""
        result = self._run(sql, "TSV", context, errors, data=True)
        return int(result.rows_written()), int(result.storage_bytes_read())

    def execute_rows(self, sql: str, context: str = "query") -> list[dict[str, Any]]:
        """Run a write and then a query in one call (`INSERT ...; SELECT ...`): the
        query's (small) result as dicts. One round trip less than execute() and rows()."""
        result = self._run(sql, "JSONEachRow", context, data=True)
        return _dicts(_text(result.bytes()) if result is not None else "")

    def rows(self, sql: str, context: str = "query") -> list[dict[str, Any]]:
        """Run a query and return its (small) result as dicts: metadata, never data rows."""
        return _dicts(self.query(sql, "JSONEachRow", context))

    def stream(self, sql: str, context: str) -> Iterator[bytes]:
        """The answer of `sql` in Native, block by block (bounded memory)."""
        try:
            with self._session() as session:
                answer = session.send_query(sql, "Native")
                try:
                    for chunk in answer:
                        yield chunk.bytes()
                finally:  # (a reader that stopped early: the session is free again)
                    answer.cancel()
        except Exception as exc:
            raise _convert(exc, context) from exc

    def _run(self, sql: str, fmt: str, context: str,
             errors: Callable[[str], ChloadError] | None = None, data: bool = False) -> Any:
        self.stats.begin(data)
        began = time.monotonic()
        try:
            with self._session() as session:
                return session.query(sql, fmt)
        except ChloadError:
            raise
        except Exception as exc:  # chdb raises ChdbError / RuntimeError with the engine text
            if errors is not None and not isinstance(exc, UnicodeDecodeError):
                raise errors(str(exc)) from exc
            raise _convert(exc, context) from exc
        finally:
            self.stats.add(time.monotonic() - began, data)

    def close(self) -> None:
        with self._guard:
            sessions, self._sessions, self._idle = self._sessions, [], []
        for session in sessions:
            session.close()
        with _live_guard:
            _live[0] -= len(sessions)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def prefetch() -> None:
    """Start loading chDB's engine library on a thread, for a command that will open an
    embedded target: most of chDB's import is mapping that library, which leaves the
    interpreter free, so chload's own modules import meanwhile.

    Only the library, by its absolute path, never the `chdb` package: the package's
    import changes the process's working directory to its own while it loads, so a
    relative path resolved meanwhile on another thread (the default `./chload-data`,
    a source glob) landed inside site-packages. The import that opens the first
    session (`_import_chdb`, on the thread that asks) then finds the library mapped."""
    threading.Thread(target=_map_library, name="chload-map-chdb", daemon=True).start()


def _map_library() -> None:
    try:
        import ctypes
        import importlib.util

        spec = importlib.util.find_spec("chdb")  # finds; runs nothing of the package
        library = os.path.join(os.path.dirname(spec.origin or ""), "_chdb.abi3.so") \
            if spec is not None else ""
        if os.path.isfile(library):  # the flags chDB loads it with: the same handle
            ctypes.CDLL(library, mode=sys.getdlopenflags() | _RTLD_DEEPBIND)
    except (ImportError, OSError, ValueError):
        pass  # (the import that opens the first session loads it, or says why not)


def _import_chdb() -> None:
    """Import chDB without pyarrow: chDB treats it as optional (Arrow results only, which
    chload never asks for), and importing it (and numpy) would slow every run's start.
    Only while chDB imports; a later `import pyarrow` works as usual. One thread
    at a time: a second waits for the first's import. Once imported, the library's
    relocation table, read only while it loaded, is unmapped (library.py)."""
    with _import_guard:
        if _released:
            return
        if "chdb.session" not in sys.modules and "pyarrow" not in sys.modules:
            sys.modules["pyarrow"] = None  # type: ignore[assignment]
            try:
                import chdb.session  # noqa: F401
            finally:
                if sys.modules.get("pyarrow", 0) is None:
                    del sys.modules["pyarrow"]
        import chdb.session  # noqa: F401  (pyarrow imported already: as it comes)

        _released.append(release_relocations(getattr(sys.modules.get("chdb._chdb"),
                                                     "__file__", None) or ""))


def _convert(exc: Exception, context: str) -> ChloadError:
    if isinstance(exc, UnicodeDecodeError):  # chDB could not decode the engine's message
        return DataError(f"{context}: the engine rejected the data and its message quotes "
                         "bytes that are not UTF-8; is this binary data, or the wrong --format?")
    return from_engine_message(str(exc), context)


def _acquire(path: str) -> int:
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UsageError(f"target {path}: cannot use this directory ({exc.strerror})") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise TargetInUse(
            f"target {path} is in use by another chload process (pid {holder}); "
            "wait for it to finish or use another --target directory"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _dicts(text: str) -> list[dict[str, Any]]:
    """An answer in JSONEachRow as dicts, decoded in one call (a batch's answer holds a
    row a file): a row a line, split at line feeds only (a value's own are escaped; it
    may hold other characters str.splitlines splits at)."""
    rows = [line for line in text.split("\n") if line]
    return json.loads(f"[{','.join(rows)}]") if rows else []


def _text(answer: bytes) -> str:
    """The engine's answer as text. A String column holds bytes, not always UTF-8 (a
    Latin-1 file loads as it is): such bytes are kept as surrogates, and the CLI writes
    them back out unchanged (cli.main: stdout's errors="surrogateescape")."""
    return answer.decode(errors="surrogateescape")
