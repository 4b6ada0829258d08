"""Database tables as sources: ranges of one snapshot, each a unit loaded exactly once.

    chload load postgresql://loader@db:5432/shop/public.orders --table orders
    chload load mysql://loader@db:3306/shop/orders --table orders --incremental-by id

What a unit is. A table is cut along an *axis*: its single-column integer primary key
(a full copy), or the `--incremental-by` column. A unit is the rows whose axis value is
in `(lo, hi]` (`lo` empty: from the beginning), its ledger uri
`postgresql://db:5432/shop/public.orders#id(100,200]` (never a password), its identity
the snapshot it was read from. A table without such a key, and a `--query`, is one
unit (`#all`, or `#query-<hash>`).

Why ranges of a key, and why this rerun rule gives exactly once. Each unit's rows and
its ledger entry are committed together (targets/commit.py, as for files). A rerun
lists the *complement* of the committed ranges within `(-inf, upper]`: no key value is
in two committed ranges, none is left out. `upper` is the snapshot's max of the axis
for `--incremental-by` (so a rerun loads the rows added since: the high-water mark is
just the committed ranges, and it moves only with a commit), and, for a full copy, the
max recorded by the copy that started it (in each unit's identity), so a finished
copy loads nothing on a rerun (`--force` copies again). A copy cut by a crash and
finished by a rerun is consistent per range, not as a whole: the ranges the rerun
loads come from its own snapshot.

What the reading does not see: with `--incremental-by`, rows updated or inserted with an
axis value at or below the mark, rows whose axis is NULL, and deletes.

How it plugs in: `DatabaseSource` is the `Source` (chload/sources/__init__.py). Each run
gets its own object (`open`); its `list` takes the snapshot and lists the ranges; the
source says the table's columns and primary key (`columns`, `sorting_key`: nothing is
inferred), that a range is committed alone (`loads_alone`), and the URL without its
password (`display`); `close` ends the snapshot when the run is over.

How bytes move (no row through Python): right before a range loads, the runner asks
`fetch`: the database's own client (`psql` COPY ... TO STDOUT; the `mariadb`/`mysql`
client, each field formatted by the server) writes the range as tab-separated text
into a pipe that the engine reads while it is written (db_pipes.py: an embedded
engine reads /dev/fd/N, a server is posted the bytes chunked), where the target says
it can (SourceContext.pipes); else into a spool file, loaded as any local file.
Columns the engine must convert (PostgreSQL bytea and arrays) are rewritten to Native
by the engine first (`SourceContext.query`), from a spool. The pipe or spool is
removed (`release`) after its range is committed or failed.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from chload.core import ranges as db_range
from chload.errors import SchemaError, SourceError, UsageError
from chload.formats import FileFormat
from chload.schema import Column, quote_ident, quote_str, structure
from chload.sources import pipes as db_pipes
from chload.sources.base import Source, SourceContext, SourceFile
from chload.sources.databases import early as db_early
from chload.sources.pipes import Reading

URL_KINDS = {"postgresql": "postgresql", "postgres": "postgresql", "mysql": "mysql",
             "mariadb": "mysql"}  # a URL's scheme -> DbUrl.kind
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}
RANGE_ROWS = 2_000_000  # rows a range holds at most, about: a crash redoes at most this
# many. Fewer, larger ranges cost less (each is a client, a stage, a commit, and for the
# database a scan of its own: two 1M-row range COPYs took PostgreSQL 0.9-1.1 CPU-s, one
# COPY of the 2M rows 0.75-0.8): a range per worker unless that is more than this.
TSV = FileFormat("TSV", "none")
NATIVE = FileFormat("Native", "none")


# -- the URL ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DbUrl:
    """`postgresql://user[:password]@host:port/db[/schema.table]`; the password is never
    in `display`, `repr` or a message."""

    kind: str  # postgresql | mysql
    user: str
    host: str
    port: int
    database: str
    schema: str  # PostgreSQL: public by default; MySQL: the database
    table: str  # '' for a --query source
    password: str | None = field(default=None, repr=False)

    @property
    def display(self) -> str:
        where = f"{self.kind}://{self.host}:{self.port}/{self.database}"
        if not self.table:
            return where
        return f"{where}/{self.table}" if self.kind == "mysql" else (
            f"{where}/{self.schema}.{self.table}")

    @property
    def with_user(self) -> str:
        return self.display.replace("://", f"://{self.user}@", 1)


def redact(url: str) -> str:
    """`scheme://user:password@host/...` without the password."""
    head, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = netloc.rsplit("@", 1)[0].split(":", 1)[0] + "@" + netloc.rsplit("@", 1)[1]
    return head + sep + netloc + slash + path


def parse_url(url: str, query: str | None) -> DbUrl:
    kind = URL_KINDS[url.split("://", 1)[0].lower()]
    parts = urlsplit(url)
    path = [unquote(p) for p in parts.path.split("/") if p]
    shown = redact(url)
    try:
        port = parts.port or DEFAULT_PORTS[kind]
    except ValueError:
        raise UsageError(f"{shown}: the port is not a number") from None
    if not path or len(path) > 2 or not parts.hostname:
        raise UsageError(f"{shown}: write {kind}://user@host:port/database/"
                         f"{'schema.' if kind == 'postgresql' else ''}table (or the "
                         "database alone with --query)")
    database, table = path[0], path[1] if len(path) == 2 else ""
    if bool(table) == bool(query):
        raise UsageError(f"{shown}: name a table in the URL or pass --query, not both "
                         "and not neither")
    schema, _, name = table.rpartition(".")
    schema = schema or ("public" if kind == "postgresql" else database)
    user = unquote(parts.username or "") or os.environ.get(
        "PGUSER" if kind == "postgresql" else "USER", "")
    password = unquote(parts.password) if parts.password is not None else None
    return DbUrl(kind, user, parts.hostname, port, database, schema, name, password)


# -- columns ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DbColumn:
    """One source column: its ClickHouse type, what the source's client prints for it
    (`select`, in the source's SQL), how the spool is read (`read_type`) and, where the
    engine must convert, the ClickHouse expression over the read column (`expr`)."""

    name: str
    type: str  # the ClickHouse column type
    select: str
    read_type: str = ""
    expr: str = ""
    plain: str = ""  # what a reader that escapes the fields itself selects ('': the column)
    refused: str = ""  # the source's type, where chload cannot carry it unchanged: `type`
    # is then only a suggestion, and the run needs --schema (its text is read as printed)
    holds: str = ""  # a date or time column: which years it can hold (db_range.guards)
    source_type: str = ""  # its type in the database, where a range check needs it

    @property
    def spool_type(self) -> str:
        return self.read_type or self.type


@dataclass(slots=True)
class TableInfo:
    columns: list[DbColumn]
    key: list[str]  # primary key columns (ORDER BY of a created table)
    axis: str = ""  # the column ranges are cut along ('' : one unit)
    axis_integer: bool = True


def nullable(typ: str, nulls: bool) -> str:
    """Nullable only where the source column is (arrays cannot be, in ClickHouse)."""
    return f"Nullable({typ})" if nulls and not typ.startswith("Array(") else typ


def cannot_carry(name: str, source_type: str, nulls: bool, select: str,
                 hint: str = "String") -> DbColumn:
    """A column no ClickHouse type holds unchanged (interval, money, time, ...): read as
    the source prints it, into the type the user names by --schema (`hint` suggested);
    a run without --schema stops before anything loads (`refusal`)."""
    return DbColumn(name, nullable(hint, nulls), select, refused=source_type)


def refusal(url: DbUrl, columns: Sequence[DbColumn]) -> SchemaError | None:
    """One line naming every column that cannot be carried and the whole --schema to
    pass (a --schema over a database table names every column, in order)."""
    refused = [c for c in columns if c.refused]
    if not refused:
        return None
    which = ", ".join(f"{c.name} ({c.refused})" for c in refused)
    return SchemaError(f"{url.display}: chload cannot carry these columns unchanged: {which}; "
                       "pass --schema naming every column's type, e.g. --schema "
                       f"{schema_hint(columns)} (their values are read as the database "
                       "prints them)")


def schema_hint(columns: Sequence[DbColumn]) -> str:
    """A whole --schema for these columns, quoted for the shell."""
    return _shell_word(", ".join(f"{_name(c.name)} {c.type}" for c in columns))


def _name(name: str) -> str:
    """A column name as --schema takes it: bare where it can be."""
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else quote_ident(name)


def _shell_word(text: str) -> str:
    """`text` quoted for a POSIX shell, readably: in single quotes, or in double quotes
    where it holds one (a type's time zone: DateTime64(6, 'UTC'))."""
    if "'" not in text:
        return f"'{text}'"
    return '"' + re.sub(r'([\\"$`])', r"\\\1", text) + '"'


# -- ranges ----------------------------------------------------------------------------
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


_RANGE = re.compile(r"#(?P<axis>[^#(]+)\((?P<lo>[^,]*),(?P<hi>[^\]]*)\]$")


def parse_range(uri: str, prefix: str) -> tuple[str, Range] | None:
    if not uri.startswith(prefix + "#"):
        return None
    found = _RANGE.search(uri[len(prefix):])
    if not found:
        return None
    return found["axis"], Range(found["lo"] or None, found["hi"] or None)


def missing_ranges(done: Sequence[Range], upper: str, key: Callable[[str], Any]) -> list[Range]:
    """The parts of (-inf, upper] that no range of `done` covers, in order."""
    def at(value: str | None, infinite: tuple) -> tuple:
        return infinite if value is None else (1, key(value))

    top = at(upper, (2,))
    gaps: list[Range] = []
    cursor, covered = (0,), None  # (-inf, cursor] is covered (nothing yet)
    for lo, hi, r in sorted((at(r.lo, (0,)), at(r.hi, (2,)), r) for r in done):
        if cursor >= top:
            break
        if lo > cursor:
            gaps.append(Range(covered, r.lo if lo < top else upper))
        if hi > cursor:
            cursor, covered = hi, r.hi
    if cursor < top:
        gaps.append(Range(covered, upper))
    return gaps


def split_range(r: Range, low: int, step: int) -> list[Range]:
    """An integer range in pieces of about `step` values; `low`: the data's min - 1,
    where the range has no lower end (the piece keeps none)."""
    assert r.hi is not None
    start, end = int(r.lo) if r.lo is not None else low, int(r.hi)
    pieces: list[Range] = []
    lo: str | None = r.lo
    cut = start
    while end - cut > step * 3 // 2:
        cut += step
        pieces.append(Range(lo, str(cut)))
        lo = str(cut)
    pieces.append(Range(lo, r.hi))
    return pieces


# -- values out of the target's range ----------------------------------------------------
@dataclass(frozen=True, slots=True)
class RangeChecks:
    """A session's range checks (db_range.py): by column position, and the columns as
    they are read (for the --schema a refusal suggests)."""

    url: DbUrl
    columns: list[DbColumn]
    guards: dict[int, db_range.Guard]

    def refusal(self, index: int, value: str) -> SchemaError:
        """The one line for `value` of the column at `index`, outside its type's range."""
        guard = self.guards[index]
        if not re.match(r"(?!0000)\d{4}-\d\d-\d\d", value) or value.endswith(" BC"):
            guard = replace(guard, wider="String")  # no date type holds infinity, BC, 10000
        column = self.columns[index]
        wider = (f"Nullable({guard.wider})" if column.type.startswith("Nullable(")
                 else guard.wider)
        hint = schema_hint([replace(c, type=wider) if c is column else c
                            for c in self.columns])
        return db_range.message(self.url.display, guard, value, hint)


NO_CHECKS = RangeChecks(DbUrl("", "", "", 0, "", "", ""), [], {})


# -- a source session ----------------------------------------------------------------
class Session(Protocol):
    """One database read: a snapshot, the table's columns, ranges read into spools."""

    url: DbUrl
    info: TableInfo
    snapshot: str  # names the snapshot (ledger identity)
    range_checks: RangeChecks  # the values each range checks (DatabaseSource.stored)

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

    def close(self) -> None: ...


def stream_read(session: Session, where: str) -> tuple[int, Reading]:
    """Session.stream of a session that has no pipe of its own ready: a new one."""
    read_end, write_end = db_pipes.make()
    try:
        return read_end, session.read(where, write_end)
    except BaseException:
        os.close(read_end)
        raise


def plan_units(session: Session, kind: str, loaded: Sequence[tuple[str, str]],
               spec_workers: int, incremental: bool, force: bool) -> list[SourceFile]:
    """The units still to load: the complement of the committed ranges (`loaded`:
    (uri, identity) of every unit committed into the table from this source)."""
    url, info = session.url, session.info
    prefix = url.display if url.table else f"{url.display}#query"
    if not info.axis:
        uri = f"{prefix}#all" if url.table else f"{prefix}-{_digest(session)}"
        if not force and any(u == uri for u, _ in loaded):
            return []
        return [_unit(kind, uri, session.snapshot, "TRUE")]
    low, high, rows = session.bounds(info.axis)
    if high is None:  # no rows: one empty unit makes the table, if nothing was loaded
        empty = f"{prefix}#empty"  # (not a range: a later copy or increment loads all)
        if (not force and loaded) or any(u == empty for u, _ in loaded):
            return []
        return [_unit(kind, empty, session.snapshot, "FALSE")]
    key: Callable[[str], Any] = int if info.axis_integer else str
    done = [] if force else [r for u, _ in loaded
                             if (found := parse_range(u, prefix)) and found[0] == info.axis
                             for r in [found[1]]]
    upper = high
    if not incremental and done:
        planned = [m for _, ident in loaded if (m := _planned_upper(ident))]
        upper = max(planned, key=key) if planned else high
    gaps = missing_ranges(done, upper, key)
    if info.axis_integer and low is not None:
        width = int(high) - int(low) + 1
        step = max(1, width // max(spec_workers, -(-rows // RANGE_ROWS), 1))
        gaps = [p for g in gaps for p in split_range(g, int(low) - 1, step)]
    identity = f"upto {upper}; snapshot {session.snapshot}"
    return [_unit(kind, f"{prefix}#{g.label(info.axis)}", identity,
                  session.predicate(info.axis, _read_as(g, high, key, session)))
            for g in gaps]


def _read_as(r: Range, high: str, key: Callable[[str], Any], session: Session) -> Range:
    """The range as read: without its upper end where that is the snapshot's max (no
    row of the snapshot is above it), since that test costs the database on every row:
    MariaDB 0.05 CPU-s per 1M rows, about a tenth of its work (1.23 against 1.09 CPU-s
    for 2M rows, 5 rounds; docs/databases.md run L), PostgreSQL's filter likewise. Not
    where the bounds were read outside the readers' snapshot (`bounds_in_snapshot`)."""
    if (r.hi is None or key(r.hi) != key(high)
            or not getattr(session, "bounds_in_snapshot", True)):
        return r
    return Range(r.lo, None)


def _digest(session: Session) -> str:
    text = getattr(session, "query", "") or ""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _planned_upper(identity: str) -> str | None:
    found = re.match(r"upto (\S+);", identity)
    return found.group(1) if found else None


def _unit(kind: str, uri: str, identity: str, where: str) -> SourceFile:
    """A range as listed: `location` is its predicate in the source's SQL (what `fetch`
    reads), `etag` its identity; no bytes yet (size 0, never `known_empty`)."""
    return SourceFile(uri=uri, size=0, mtime_ns=0, format=TSV, etag=identity,
                      kind=kind, location=where)


# -- the Source ----------------------------------------------------------------------------
class DatabaseSource:
    """A database as a `Source` (postgres.py, mysql.py: `_session`). The module's SOURCE
    lists nothing itself: each run gets its own object (`open`), whose `list` takes the
    snapshot that every `fetch` reads from, and whose `close` ends it."""

    kind = ""
    schemes: tuple[str, ...] = ()
    options: tuple[str, ...] = ("query", "incremental_by")
    reads_in_place = False  # a range is read by the source's own query

    def __init__(self) -> None:
        self.session: Session | None = None
        self.context = SourceContext()
        self.spools = ""
        self._guard = threading.Lock()

    def _session(self, url: DbUrl, context: SourceContext) -> Session:
        raise NotImplementedError

    def open(self) -> Source:
        return type(self)()

    def list(self, pattern: str, context: SourceContext) -> list[SourceFile]:
        """Connect, take the snapshot, map the columns; the ranges still to load."""
        if len(context.patterns) > 1 or self.session is not None:
            raise UsageError(f"{redact(pattern)}: a database source loads alone; name it as "
                             "the only source")
        self.context = context
        self.session = db_early.claim(pattern, db_early.key(context)) or self._session(
            parse_url(pattern, context.select), context)
        refused = refusal(self.session.url, self.session.info.columns)
        if refused is not None and context.schema is None:
            raise refused
        ordered = getattr(self.session, "read_in_key_order", None)
        if ordered is not None and context.key_order:
            ordered()  # PostgreSQL (MySQL/MariaDB: InnoDB reads a table in key order)
        committed = context.committed() if context.committed is not None else {}
        return plan_units(self.session, self.kind, sorted(committed.items()),
                          workers_of(context), bool(context.incremental_by), context.force)

    def stored(self, columns: Sequence[Column], read: Sequence[Column], engine: str,
               rejects: bool) -> None:
        """The run's table is made: its columns as the target stores them (`columns`),
        the types the rows are read as (`read`), which ClickHouse parses them (`engine`,
        Target.engine) and whether an error budget rejects rows (`rejects`). The
        session then checks the date and time values those types cannot hold
        (db_range.py) in every range it reads."""
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
        engine is in this process and converts nothing (db_pipes.py), else read by the
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

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        return None

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

    def still_there(self, file: SourceFile) -> bool | None:
        return None

    def reads_at_uri(self, file: SourceFile) -> bool:
        return False

    def known_empty(self, file: SourceFile) -> bool:
        return False


def _kept_as_text(column: DbColumn, given: str) -> bool:
    """--schema typed an array column String: its text as read (PostgreSQL's JSON), not
    converted (a 2-D array, which Array(T) cannot hold)."""
    return column.type.startswith("Array(") and given.removeprefix("Nullable(").startswith(
        "String")


def workers_of(context: SourceContext) -> int:
    """Units that may load at once: --workers, else about the machine's cores."""
    return context.workers or max(2, os.cpu_count() or 2)
