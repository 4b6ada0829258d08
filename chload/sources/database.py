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

How bytes move (no row through Python): the database's own client streams each range
as tab-separated text (`psql` COPY ... TO STDOUT; the `mariadb`/`mysql` client, the
line formatted by the server) into a spool file; the target then loads that file as
any other (`load_file`: the embedded engine reads it, an 18.16 server is posted the
bytes and parses them). Columns the engine must convert (PostgreSQL bytea and arrays)
are rewritten to Native by the loader's engine first. The spool is removed after its
unit is committed or failed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from chload.errors import SchemaError, UsageError
from chload.formats import FileFormat
from dataclasses import dataclass, field, replace
from chload.schema import Column, quote_ident, quote_str, structure
from chload.sources import SourceFile

SCHEMES = {"postgresql": "postgresql", "postgres": "postgresql", "mysql": "mysql",
           "mariadb": "mysql"}
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}
RANGE_ROWS = 250_000  # rows a range holds, about: a crash redoes at most this many
TSV = FileFormat("TSV", "none")
NATIVE = FileFormat("Native", "none")


def is_database(source: str) -> bool:
    return source.split("://", 1)[0].lower() in SCHEMES if "://" in source else False


# -- the URL ---------------------------------------------------------------------------
@dataclass(frozen=True)
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
    kind = SCHEMES[url.split("://", 1)[0].lower()]
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
@dataclass(frozen=True)
class DbColumn:
    """One source column: its ClickHouse type, what the source's client prints for it
    (`select`, in the source's SQL), how the spool is read (`read_type`) and, where the
    engine must convert, the ClickHouse expression over the read column (`expr`)."""

    name: str
    type: str  # the ClickHouse column type
    select: str
    read_type: str = ""
    expr: str = ""

    @property
    def spool_type(self) -> str:
        return self.read_type or self.type


@dataclass
class TableInfo:
    columns: list[DbColumn]
    key: list[str]  # primary key columns (ORDER BY of a created table)
    axis: str = ""  # the column ranges are cut along ('' : one unit)
    axis_integer: bool = True


def nullable(typ: str, nulls: bool) -> str:
    """Nullable only where the source column is (arrays cannot be, in ClickHouse)."""
    return f"Nullable({typ})" if nulls and not typ.startswith("Array(") else typ


def cannot_carry(url: DbUrl, column: str, source_type: str, hint: str = "String") -> SchemaError:
    return SchemaError(f"{url.display}: column {column} has type {source_type}, which chload "
                       f"cannot carry unchanged; pass --schema with that column as a type "
                       f"you choose, e.g. --schema '... {column} {hint} ...'")


# -- ranges ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Range:
    """Axis values in (lo, hi]; lo None: from the beginning; hi None: no end."""

    lo: str | None
    hi: str | None

    def label(self, axis: str) -> str:
        return f"{axis}({self.lo or ''},{self.hi or ''}]"


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


# -- a source session ----------------------------------------------------------------
class Session(Protocol):
    """One database read: a snapshot, the table's columns, ranges read into spools."""

    url: DbUrl
    info: TableInfo
    snapshot: str  # names the snapshot (ledger identity)

    def bounds(self, axis: str) -> tuple[str | None, str | None, int]:
        """(min, max, estimated rows) of the axis in the snapshot."""
        ...

    def read(self, where: str, path: str) -> None:
        """Write the rows matching `where` (source SQL) as TSV to `path`."""
        ...

    def predicate(self, axis: str, r: Range) -> str: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Unit:
    where: str


def open_session(url: DbUrl, query: str | None, incremental_by: str | None, workers: int,
                 ) -> Session:
    if url.kind == "postgresql":
        from chload.sources.postgres import PostgresSession

        return PostgresSession(url, query, incremental_by)
    from chload.sources.mysql import MysqlSession

    return MysqlSession(url, query, incremental_by, workers)


def plan_units(session: Session, loaded: Sequence[tuple[str, str]], spec_workers: int,
               incremental: bool, force: bool) -> list[SourceFile]:
    """The units still to load: the complement of the committed ranges (`loaded`:
    (uri, identity) of every unit committed into the table from this source)."""
    url, info = session.url, session.info
    prefix = url.display if url.table else f"{url.display}#query"
    if not info.axis:
        uri = f"{prefix}#all" if url.table else f"{prefix}-{_digest(session)}"
        if not force and any(u == uri for u, _ in loaded):
            return []
        return [_unit(uri, session.snapshot, "TRUE")]
    low, high, rows = session.bounds(info.axis)
    if high is None:
        return []
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
        step = max(1, width // max(spec_workers * 2, -(-rows // RANGE_ROWS), 1))
        gaps = [p for g in gaps for p in split_range(g, int(low) - 1, step)]
    identity = f"upto {upper}; snapshot {session.snapshot}"
    return [_unit(f"{prefix}#{g.label(info.axis)}", identity,
                  session.predicate(info.axis, g)) for g in gaps]


def _digest(session: Session) -> str:
    text = getattr(session, "query", "") or ""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _planned_upper(identity: str) -> str | None:
    found = re.match(r"upto (\S+);", identity)
    return found.group(1) if found else None


def _unit(uri: str, identity: str, where: str) -> SourceFile:
    return SourceFile(uri=uri, size=0, mtime_ns=0, format=TSV, etag=identity,
                      kind="database", location=where)


# -- the target wrapper ------------------------------------------------------------------
class DatabaseTarget:
    """The target, loading units of a database source: each unit's range is read into a
    spool file, which the target loads as it loads any local file (the same committer,
    so a unit's rows and its ledger entry are committed together)."""

    def __init__(self, target: Any, session: Session) -> None:
        self._target, self.session = target, session
        self.spools = tempfile.mkdtemp(prefix="spool-", dir=_spool_parent(target))
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def plan_batches(self, files: Sequence[SourceFile], budget: Any,
                     workers: int) -> list[tuple[SourceFile, ...]]:
        return [(f,) for f in files]  # a unit is a commit of its own

    def reader(self, file: SourceFile, fmt: str, columns: Sequence[Column] | None) -> str:
        raise SchemaError(f"{file.uri}: a database unit is not read by inference")

    def load_file(self, job: Any, progress: Callable[[int, int], None]) -> Any:
        path = os.path.join(self.spools, f"{os.urandom(6).hex()}.tsv")
        try:
            self.session.read(job.file.location, path)
            job = self._spooled(job, path)
            return self._target.load_file(job, progress)
        finally:
            for leftover in (path, path + ".native"):
                if os.path.exists(leftover):
                    os.remove(leftover)

    def _spooled(self, job: Any, path: str) -> Any:
        """The job reading the spool: TSV as the source printed it, or, where a column
        needs the engine to convert it, Native written by the loader's engine."""
        columns = self.session.info.columns
        names = {c.name for c in job.read_columns}
        spool = replace(job.file, kind="local", local_path=path, format=TSV,
                        size=os.path.getsize(path))
        convert = [c for c in columns if c.expr and c.name in names]
        if not convert:
            return replace(job, file=spool)
        read = [Column(c.name, c.spool_type if c.name in names else c.type) for c in columns]
        by_name = {c.name: c for c in job.read_columns}
        exprs = ", ".join(f"CAST({c.expr} AS {by_name[c.name].type}) AS {quote_ident(c.name)}"
                          if c.expr else quote_ident(c.name) for c in columns if c.name in names)
        native = path + ".native"
        self._target.engine.execute(
            f"INSERT INTO FUNCTION file({quote_str(native)}, 'Native') SELECT {exprs} FROM "
            f"file({quote_str(path)}, 'TSV', {quote_str(structure(read))})", job.file.uri)
        os.remove(path)
        spool = replace(spool, local_path=native, format=NATIVE, size=os.path.getsize(native))
        return replace(job, file=spool)

    def close(self) -> None:
        try:
            self.session.close()
        finally:
            shutil.rmtree(self.spools, ignore_errors=True)
            self._target.close()


def _spool_parent(target: Any) -> str:
    parent = os.path.join(getattr(target, "path", tempfile.gettempdir()), "tmp")
    os.makedirs(parent, exist_ok=True)
    return parent


def table_columns(info: TableInfo) -> str:
    """The mapped columns as a --schema string (how a created table gets them)."""
    return ", ".join(f"{quote_ident(c.name)} {c.type}" for c in info.columns)


# -- the hooks api.py calls -------------------------------------------------------------
def open_sources(spec: Any, target: Any) -> tuple[Any, Any]:
    """For a database source: connect, take the snapshot, map the columns; return the
    spec with the mapped columns as its schema, the primary key as ORDER BY and the
    source without its password, and the target wrapped to read ranges. Other sources:
    both as they were."""
    named = [s for s in spec.sources if is_database(s)]
    if not named:
        for flag, value in (("--query", spec.query), ("--incremental-by", spec.incremental_by)):
            if value:
                raise UsageError(f"{flag}: only for a postgresql:// or mysql:// source")
        return spec, target
    if len(spec.sources) > 1:
        raise UsageError(f"{redact(named[0])}: a database source loads alone; name it as "
                         "the only source")
    url = parse_url(named[0], spec.query)
    session = open_session(url, spec.query, spec.incremental_by,
                           spec.workers or max(2, os.cpu_count() or 2))
    try:
        schema = spec.schema or table_columns(session.info)
        if spec.schema:
            _check_schema(url, session.info, spec.schema)
        order_by = spec.order_by or (", ".join(quote_ident(k) for k in session.info.key)
                                     or None)
        spec = replace(spec, sources=(url.with_user,), schema=schema, order_by=order_by)
        return spec, DatabaseTarget(target, session)
    except BaseException:
        session.close()
        raise


def _check_schema(url: DbUrl, info: TableInfo, schema: str) -> None:
    from chload.schema import parse_structure

    given = [c.name for c in parse_structure(schema)]
    names = [c.name for c in info.columns]
    if given != names:
        raise UsageError(f"--schema: name every column of {url.display}, in its order: "
                         f"{', '.join(names)}")


def list_units(source: str, spec: Any, target: Any) -> list[SourceFile]:
    """The units a run loads (after api.open_sources wrapped the target)."""
    from chload import planner
    from chload.ledger import COMMITTING

    if not isinstance(target, DatabaseTarget):
        raise UsageError(f"{redact(source)}: a database source loads through chload.load()")
    table = planner.parse_table(spec.table, str(getattr(target, "database", "default")))
    ledger = target.ledger
    events = dict(ledger.loaded(table.display))
    events.update((e.uri, e) for e in ledger.latest(table.display, [COMMITTING]))
    own, _ = planner.own_history(ledger.table_state(table.database, table.name), events)
    loaded = [(uri, e.identity) for uri, e in own.items()]
    return plan_units(target.session, loaded, spec.workers or max(2, os.cpu_count() or 2),
                      bool(spec.incremental_by), spec.force)
