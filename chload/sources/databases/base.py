"""A database as a `Source`: ranges of one snapshot, each a unit loaded exactly once.

`DatabaseSource` is the `Source` (sources/base.py) of postgres.py and mysql.py, which make
its `Session` (session.py). Each run gets its own object (`open`); `list` takes the
snapshot and lists the ranges still to load (plan.py); the source gives the table's
columns and primary key (nothing is inferred); `stored` begins the one query over the rows
to load that finds every value the table's types cannot hold, beside the ranges, which
`settle` waits for before any range commits; `close` ends the snapshot.

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
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from chload.core.reading import ranges as db_range
from chload.errors import SchemaError, SourceError, UsageError, ValuesRefused
from chload.formats import FileFormat
from chload.schema import Column, bare_type, quote_ident, quote_str, structure
from chload.sources import pipes as db_pipes
from chload.sources.base import RemoteSource, Source, SourceContext, SourceFile
from chload.sources.databases import early as db_early
from chload.sources.databases.plan import plan_units
from chload.sources.databases.session import Session
from chload.sources.databases.table import (
    DbColumn,
    DbUrl,
    RangeChecks,
    nullable,
    parse_url,
    redact,
    refusal,
)

NATIVE = FileFormat("Native", "none")
TSV = FileFormat("TSV", "none")


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
        self.listed = "FALSE"  # the rows of the units `list` gave (the source's SQL)
        self.asked: dict[tuple[int, str, str, str], str | None] = {}  # _outside's answers
        self.rejects = False  # an error budget rejects rows (`stored`)
        self.kept: dict[str, str] = {}  # column -> the type the target's table stores it
        # as, where the target is not chDB: a converted spool is written in it (`_spooled`)
        self._notes: builtins.list[str] = []
        self._guard = threading.Lock()
        self.check: _Check | None = None  # the query beside the ranges (`_check_first`)

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
        if context.key_order:
            self.session.read_in_key_order()
        committed = context.committed() if context.committed is not None else {}
        units = plan_units(self.session, self.kind, sorted(committed.items()),
                           workers_of(context), bool(context.incremental_by), context.force)
        # a copy's ranges together are the whole table (its key is never NULL)
        whole = (context.force or not committed) and not context.incremental_by
        self.listed = "TRUE" if whole or any(u.location == "TRUE" for u in units) else (
            " OR ".join(f"({u.location})" for u in units) or "FALSE")
        if context.schema is None:
            self._dates_as_date(self.session, context)
        if context.schema is None and any(c.refused for c in self.session.info.columns):
            raise self._refusal(self.session, context)
        if not units and committed and not context.incremental_by:
            last = context.last_commit() if context.last_commit is not None else None
            self._notes.append(copied_note(self.session, last))
        return units

    def notes(self) -> builtins.list[str]:
        return list(self._notes)

    def _refusal(self, session: Session, context: SourceContext) -> SchemaError:
        """The one line of a table with columns chload cannot carry: its --schema in
        types the target has, String for a date or time column holding a value its
        type cannot hold there (asked of the database now, so that the --schema given
        loads)."""
        hint = [replace(c, type=storable(c.type, context.has_type)) for c in
                session.info.columns]
        engine = context.engine or db_range.CHDB
        guards = db_range.guards([(c.name, c.holds) for c in hint], [c.type for c in hint],
                                 {}, engine, False)
        found = self._outside(session, list(guards.values()), self.listed)
        error = refusal(session.url, [replace(c, type=nullable("String", "Nullable(" in
                                                                c.type))
                                      if i in found else c for i, c in enumerate(hint)])
        assert error is not None
        if not found:
            return error
        held = ", ".join(f"{hint[i].name} holds {v!r}" for i, v in sorted(found.items()))
        return SchemaError(f"{error}; String there also for values their types cannot hold "
                           f"on {guards[min(found)].where}: {held}")

    def _dates_as_date(self, session: Session, context: SourceContext) -> None:
        """Date columns typed Date, not Date32, for a target that has no Date32 (18.16)
        where every value to load fits Date there. One query asks, and asks too what
        `_check_first` will where the table is made of these columns (`_predicted`), so
        that a run reads the table once for both. A column holding a value outside
        stays Date32, which that target refuses in one line naming it
        (targets/server/capabilities.py). Asked only where the table is to be made
        with a date column: otherwise the types are the table's (or no date's), and
        `_check_first` asks beside the ranges, off the run's critical path."""
        if context.has_type is None or context.has_type("Date32") or (
                context.table_exists is not None and context.table_exists()):
            return
        columns = session.info.columns
        guards = self._predicted(session, context)
        if not any(bare_type(columns[i].type) == "Date32" for i in guards):
            return
        found = self._outside(session, list(guards.values()), self.listed)
        for i, column in enumerate(columns):
            if bare_type(column.type) == "Date32" and i in guards and i not in found:
                columns[i] = replace(column, type=column.type.replace("Date32", "Date"))

    def _predicted(self, session: Session, context: SourceContext
                   ) -> dict[int, db_range.Guard]:
        """The checks `stored` will make where the target (without Date32) creates the
        table of the described columns, in the types it stores (Date for a date);
        under an error budget, which checks nothing first, only the dates'."""
        columns = session.info.columns
        dates = {c.name for c in columns if bare_type(c.type) == "Date32"}
        stored = {c.name: "Date" if c.name in dates else storable(c.type, context.has_type)
                  for c in columns}
        found = db_range.guards([(c.name, c.holds) for c in columns],
                                [c.type for c in columns], stored,
                                context.engine or db_range.CHDB, False)
        return {i: g for i, g in found.items() if not context.rejects or g.name in dates}

    def _outside(self, session: Session, guards: Sequence[db_range.Guard],
                 where: str) -> dict[int, str]:
        """Column index -> a value outside its guard's range, of the rows matching
        `where`; each (column, range, where) asked of the database once."""
        asked = [g for g in guards if (g.index, g.lo, g.hi, where) not in self.asked]
        for guard, value in zip(asked, session.outside(asked, where), strict=True):
            self.asked[(guard.index, guard.lo, guard.hi, where)] = value
        return {g.index: value for g in guards
                if (value := self.asked[(g.index, g.lo, g.hi, where)]) is not None}

    def stored(self, columns: Sequence[Column], read: Sequence[Column], engine: str,
               rejects: bool) -> None:
        """The run's table is made: its columns as the target stores them (`columns`),
        the types the rows are read as (`read`), which ClickHouse parses them (`engine`,
        Target.engine) and whether an error budget rejects rows (`rejects`). The
        session then checks the date and time values those types cannot hold
        (core/reading/ranges.py) in every range it reads."""
        session = self.session
        if session is None:
            return
        self.kept = {} if engine == db_range.CHDB else {c.name: c.type for c in columns}
        self.rejects = rejects
        given = {c.name: c.type for c in read}
        typed = [replace(c, type=given.get(c.name, c.type)) for c in session.info.columns]
        found = db_range.guards([(c.name, c.holds) for c in typed], [c.type for c in typed],
                                {c.name: c.type for c in columns}, engine, rejects)
        session.range_checks = RangeChecks(session.url, typed, found)
        if not rejects:
            self._check_first(session)

    def _check_first(self, session: Session) -> None:
        """Every value the range checks would refuse, found by one query over the rows
        still to load: one line names every such column (and the --schema that loads
        them all), rather than a range failing after others were committed. (Each
        range still checks its own rows.) The query runs beside the ranges, on a
        connection of its own at the snapshot (Session.apart), and the first commit
        waits for it (`settle`); at once where `list` asked it already (`_dates_as_date`)."""
        guards = list(session.range_checks.guards.values())
        if guards and all((g.index, g.lo, g.hi, self.listed) in self.asked for g in guards):
            self._refuse(session, session)
        elif guards or session.zero_checked:
            self.check = _Check(lambda: self._refuse_apart(session))

    def _refuse_apart(self, session: Session) -> None:
        apart = session.apart()
        try:
            self._refuse(apart, session)
        finally:
            apart.close()

    def _refuse(self, asked: Session, session: Session) -> None:
        """Raise ValuesRefused if the rows to load hold a value a range check refuses
        (asked of `asked`: `session` or its connection apart)."""
        checks = session.range_checks
        found = self._outside(asked, list(checks.guards.values()), self.listed)
        zeros = asked.zero_dates(self.listed)
        if found or zeros:
            raise ValuesRefused(str(checks.refusals(found, zeros)))

    def settle(self) -> None:
        """Source.settle: the check begun by `stored` answered; what it found raised."""
        if self.check is not None:
            self.check.settle()

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
        by_name = {c.name: c for c in columns}
        text = self.rejects  # (TSV: a row the target's parse rejects is kept in chload.rejects)
        read = [Column(c.name, c.spool_type if c.expr or c.name not in names
                       else "Nullable(String)" if text else by_name[c.name].type)
                for c in session.info.columns]
        exprs = ", ".join(self._written(c, by_name[c.name].type, text)
                          for c in session.info.columns if c.name in names)
        native, fmt = path + ".native", TSV if text else NATIVE
        self.context.query(
            f"INSERT INTO FUNCTION file({quote_str(native)}, {quote_str(fmt.name)}) "
            f"SELECT {exprs} FROM file({quote_str(path)}, 'TSV', {quote_str(structure(read))})")
        os.remove(path)
        return replace(spool, local_path=native, format=fmt, size=os.path.getsize(native))

    def _written(self, column: DbColumn, given: str, text: bool) -> str:
        """A column of a converted spool: in the type it is read as (`given`), or for a
        server, the type its table stores (the server's INSERT of Native takes each
        column in the table's own type, and knows no Bool, Date32 or DateTime64 on
        18.16: `kept`); under an error budget (`text`) a column not converted is its
        text as the source printed it, for the target to parse."""
        typ = self.kept.get(column.name, given)
        name = quote_ident(column.name)
        if column.expr and not _kept_as_text(column, given):
            return f"CAST({column.expr} AS {typ}) AS {name}"
        return name if typ == given or text else f"CAST({name} AS {typ}) AS {name}"

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


class _Check:
    """A check run in a thread beside the ranges; `settle` waits for it and raises what
    it raised (each caller its own copy of a ValuesRefused: threads raise it at once)."""

    def __init__(self, ask: Callable[[], None]) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(ask,), name="chload_db_check",
                                       daemon=True)
        self.thread.start()

    def _run(self, ask: Callable[[], None]) -> None:
        try:
            ask()
        except BaseException as exc:  # noqa: BLE001 (raised by `settle`, in a load's thread)
            self.error = exc

    def settle(self) -> None:
        self.thread.join()
        if isinstance(self.error, ValuesRefused):
            raise ValuesRefused(str(self.error))
        if self.error is not None:
            raise self.error


def _kept_as_text(column: DbColumn, given: str) -> bool:
    """--schema typed an array column String: its text as read (PostgreSQL's JSON), not
    converted (a 2-D array, which Array(T) cannot hold)."""
    return column.type.startswith("Array(") and given.removeprefix("Nullable(").startswith(
        "String")


def storable(typ: str, has_type: Callable[[str], bool] | None) -> str:
    """`typ` as a --schema for a target that may lack its family (`has_type`; None: all
    are had): Bool and DateTime64(0) as the server maps them (capabilities.py), else
    String for a type it lacks."""
    if has_type is None:
        return typ
    typ = re.sub(r"\bBool\b", "UInt8", typ) if not has_type("Bool") else typ
    if not has_type("DateTime64"):
        typ = re.sub(r"DateTime64\(0(, ('[^']*'))?\)", r"DateTime(\2)", typ).replace(
            "DateTime()", "DateTime")
    families = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", re.sub(r"'[^']*'", "", typ))
    wide = re.search(r"Decimal\((\d+)", typ)
    if any(f[0].isupper() and not has_type(f) for f in families) or (
            wide and int(wide.group(1)) > 38 and not has_type("Decimal256")):
        return nullable("String", typ.startswith("Nullable("))
    return typ


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
