"""A database as a `Source`: ranges of one snapshot, each a unit loaded exactly once.

`DatabaseSource` is the `Source` (sources/base.py) of postgres.py and mysql.py, which make
its `Session` (session.py). Each run gets its own object (`open`); `list` takes the
snapshot and lists the ranges still to load (plan.py); the source gives the table's
columns and primary key (nothing is inferred); `close` ends the snapshot.

Invariants: no row passes through Python (`fetch` has the database's own client write a
range as TSV into a pipe the engine reads, sources/pipes.py, or into a spool file); a
range is committed alone (`loads_alone`); the pipe or spool is removed (`release`) only
after its range is committed or failed; `display` never shows the password.
docs/sources-databases.md ("How it works inside") says why ranges give exactly once.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from chload.core import ranges as db_range
from chload.errors import SourceError, UsageError
from chload.formats import FileFormat
from chload.schema import Column, quote_ident, quote_str, structure
from chload.sources import pipes as db_pipes
from chload.sources.base import RemoteSource, Source, SourceContext, SourceFile
from chload.sources.databases import early as db_early
from chload.sources.databases.plan import plan_units
from chload.sources.databases.session import Session
from chload.sources.databases.table import DbColumn, DbUrl, RangeChecks, parse_url, redact, refusal

NATIVE = FileFormat("Native", "none")


# -- the Source ----------------------------------------------------------------------------
class DatabaseSource(RemoteSource):
    """A database as a `Source` (postgres.py, mysql.py: `_session`). The module's SOURCE
    lists nothing itself: each run gets its own object (`open`), whose `list` takes the
    snapshot that every `fetch` reads from, and whose `close` ends it."""

    kind = ""
    schemes: tuple[str, ...] = ()
    options: tuple[str, ...] = ("query", "incremental_by")
    unit = "range"  # of the table's axis (plan.py)
    reads_in_place = False  # a range is read by the source's own query

    def __init__(self) -> None:
        self.session: Session | None = None
        self.context = SourceContext()
        self.spools = ""
        self._notes: builtins.list[str] = []
        self._guard = threading.Lock()

    def _session(self, url: DbUrl, context: SourceContext) -> Session:
        raise NotImplementedError

    def session_for(self, pattern: str, context: SourceContext) -> Session:
        """A new session (snapshot, columns) of the table or query `pattern` names."""
        return self._session(parse_url(pattern, context.select), context)

    def open(self) -> Source:
        return type(self)()

    def list(self, pattern: str, context: SourceContext) -> list[SourceFile]:
        """Connect, take the snapshot, map the columns; the ranges still to load."""
        if len(context.patterns) > 1 or self.session is not None:
            raise UsageError(f"{redact(pattern)}: a database source loads alone; name it as "
                             "the only source")
        self.context = context
        self.session = (db_early.claim(pattern, db_early.key(context))
                        or self.session_for(pattern, context))
        refused = refusal(self.session.url, self.session.info.columns)
        if refused is not None and context.schema is None:
            raise refused
        if context.key_order:
            self.session.read_in_key_order()
        committed = context.committed() if context.committed is not None else {}
        units = plan_units(self.session, self.kind, sorted(committed.items()),
                           workers_of(context), bool(context.incremental_by), context.force)
        if not units and committed and not context.incremental_by:
            last = context.last_commit() if context.last_commit is not None else None
            self._notes.append(copied_note(self.session, last))
        return units

    def notes(self) -> builtins.list[str]:
        return list(self._notes)

    def stored(self, columns: Sequence[Column], read: Sequence[Column], engine: str,
               rejects: bool) -> None:
        """The run's table is made: its columns as the target stores them (`columns`),
        the types the rows are read as (`read`), which ClickHouse parses them (`engine`,
        Target.engine) and whether an error budget rejects rows (`rejects`). The
        session then checks the date and time values those types cannot hold
        (core/ranges.py) in every range it reads."""
        session = self.session
        if session is None:
            return
        given = {c.name: c.type for c in read}
        typed = [replace(c, type=given.get(c.name, c.type)) for c in session.info.columns]
        found = db_range.guards([(c.name, c.holds) for c in typed], [c.type for c in typed],
                                {c.name: c.type for c in columns}, engine, rejects)
        session.range_checks = RangeChecks(session.url, typed, found)

    def _open(self) -> Session:
        if self.session is None:
            raise SourceError(f"{self.kind}: a unit asked of a source that listed none")
        return self.session

    def fetch(self, file: SourceFile, columns: Sequence[Column], workdir: str) -> SourceFile:
        """The range made readable by the engine: streamed through a pipe where the
        engine is in this process and converts nothing (sources/pipes.py), else read by the
        database's client into a spool: TSV as the source printed it, or, where a column
        needs the engine to convert it, Native."""
        session = self._open()
        if self.context.pipes and not self._converts(session, columns):
            return self._piped(session, file)
        with self._guard:
            if not self.spools:
                os.makedirs(workdir, exist_ok=True)
                self.spools = tempfile.mkdtemp(prefix="spool-", dir=workdir)
        path = os.path.join(self.spools, f"{os.urandom(6).hex()}.tsv")
        try:
            session.read(file.location, os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                         ).finish()
            return self._spooled(session, file, columns, path)
        except BaseException:
            self.release([replace(file, local_path=p) for p in (path, path + ".native")])
            raise

    @staticmethod
    def _converts(session: Session, columns: Sequence[Column]) -> bool:
        names = {c.name for c in columns}
        return any(c.expr and c.name in names for c in session.info.columns)

    def _piped(self, session: Session, file: SourceFile) -> SourceFile:
        """The range as a pipe the engine reads while the client writes (same uri,
        identity and kind: `current` checks it was read whole before the commit)."""
        read_end, reading = session.stream(file.location)
        path = db_pipes.register(read_end, reading)
        return replace(file, local_path=path, location="", size=0)

    def _spooled(self, session: Session, file: SourceFile, columns: Sequence[Column],
                 path: str) -> SourceFile:
        spool = replace(file, kind="local", local_path=path, location="",
                        size=os.path.getsize(path))
        names = {c.name for c in columns}
        if not self._converts(session, columns):
            return spool
        if self.context.query is None:
            raise UsageError(f"{file.uri}: converting its columns needs the engine "
                             "(SourceContext.query)")
        read = [Column(c.name, c.spool_type if c.name in names else c.type)
                for c in session.info.columns]
        by_name = {c.name: c for c in columns}
        exprs = ", ".join(f"CAST({c.expr} AS {by_name[c.name].type}) AS {quote_ident(c.name)}"
                          if c.expr and not _kept_as_text(c, by_name[c.name].type)
                          else quote_ident(c.name)
                          for c in session.info.columns if c.name in names)
        native = path + ".native"
        self.context.query(
            f"INSERT INTO FUNCTION file({quote_str(native)}, 'Native') SELECT {exprs} FROM "
            f"file({quote_str(path)}, 'TSV', {quote_str(structure(read))})")
        os.remove(path)
        return replace(spool, local_path=native, format=NATIVE, size=os.path.getsize(native))

    def release(self, files: Iterable[SourceFile]) -> None:
        """Remove the spools and pipes `fetch` made (listed units have none)."""
        for f in files:
            path = f.local_path or ""
            if db_pipes.is_pipe(path):
                db_pipes.release(path)
                continue
            if self.spools and path.startswith(self.spools + os.sep):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)

    def close(self) -> None:
        session, self.session = self.session, None
        try:
            if session is not None:
                session.close()
        finally:
            if self.spools:
                shutil.rmtree(self.spools, ignore_errors=True)

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        if db_pipes.is_pipe(file.local_path):
            args = [file.local_path or "", fmt, structure or "auto"]
            return f"file({', '.join(quote_str(a) for a in args)})"
        raise UsageError(f"{file.uri}: a database range is read by `chload load` (fetched "
                         "into a spool), not in place")

    def loads_alone(self, file: SourceFile) -> bool:
        return True  # a range is a commit of its own

    def columns(self, files: Sequence[SourceFile]) -> builtins.list[Column] | None:
        return [Column(c.name, c.type) for c in self._open().info.columns]

    def sorting_key(self, files: Sequence[SourceFile]) -> str | None:
        """The primary key as ORDER BY: a composite one as a tuple `(a, b)` (bare
        `a, b` is a syntax error after ORDER BY)."""
        key = [quote_ident(k) for k in self._open().info.key]
        return None if not key else key[0] if len(key) == 1 else f"({', '.join(key)})"

    def display(self, pattern: str) -> str:
        return redact(pattern)

    def current(self, file: SourceFile) -> SourceFile:
        """A range of one snapshot does not change; a streamed one is checked here after
        its read (raises unless read whole: db_pipes.check)."""
        if db_pipes.is_pipe(file.local_path):
            db_pipes.check(file.local_path or "", file.uri)
        return file


def _kept_as_text(column: DbColumn, given: str) -> bool:
    """--schema typed an array column String: its text as read (PostgreSQL's JSON), not
    converted (a 2-D array, which Array(T) cannot hold)."""
    return column.type.startswith("Array(") and given.removeprefix("Nullable(").startswith(
        "String")


def copied_note(session: Session, last: tuple[str, int] | None) -> str:
    """Why a rerun of a finished copy loads nothing, and what would load the rows added
    since (plan.py: a copy's upper end is the one its first run recorded)."""
    by = ""
    if last is not None:
        when = datetime.fromtimestamp(last[1] / 1e9, UTC)
        by = f" by run {last[0]}" if last[0] else ""
        by += f" at {when:%Y-%m-%d %H:%M:%S} UTC"
    column = session.info.axis or "COLUMN"
    return (f"{session.url.display} was copied{by}; a copy loads it once, so rows added "
            f"since are not loaded: load them with --incremental-by {column} (a column "
            "that only grows), or copy it all again with --force")


def workers_of(context: SourceContext) -> int:
    """Units that may load at once: --workers, else about the machine's cores."""
    return context.workers or max(2, os.cpu_count() or 2)
