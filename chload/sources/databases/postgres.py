"""PostgreSQL tables and queries, read from one exported snapshot by `psql` COPY.

A session holds one connection (a `psql` fed statements: postgres_psql.Control) in a
REPEATABLE READ, READ ONLY transaction that exported its snapshot
(`pg_export_snapshot()`) and stays open for the run; each range is one `psql` process
that imports it (`SET TRANSACTION SNAPSHOT`) and runs `COPY (SELECT ... WHERE range) TO
STDOUT` into the pipe the engine reads (or a spool file: base.py): every range sees
the same database state, whatever is written meanwhile, and no row passes through
Python. Why psql rather than psycopg or chDB's postgresql(): see
docs/sources-databases.md.

COPY's text format is what ClickHouse's TSV reads (`\\N` for NULL, backslash escapes);
a few types are printed differently by the SELECT (below, `_column`), and bytea and
arrays are converted by the engine from the text COPY gives (base.py).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from typing import IO

from chload.core.reading import ranges as db_range
from chload.errors import SourceError, UsageError
from chload.sources import pipes as db_pipes
from chload.sources.base import SourceContext
from chload.sources.databases import early
from chload.sources.databases.base import DatabaseSource
from chload.sources.databases.postgres_psql import (
    Control,
    Psql,
    buffered,
    client_env,
    connection_args,
    find_psql,
)
from chload.sources.databases.session import Range, range_predicate, stream_read
from chload.sources.databases.table import (
    NO_CHECKS,
    DbColumn,
    DbUrl,
    TableInfo,
    cannot_carry,
    nullable,
)
from chload.sources.pipes import Reading

# format_type() name -> ClickHouse type (scalars whose COPY text ClickHouse reads as is)
TYPES = {
    "smallint": "Int16", "integer": "Int32", "bigint": "Int64", "real": "Float32",
    "double precision": "Float64", "boolean": "Bool", "text": "String",
    "character varying": "String", "character": "String", "name": "String",
    "citext": "String", "uuid": "UUID", "json": "String", "jsonb": "String",
    "date": "Date32", "bytea": "String", "xml": "String",
    # addresses and bit strings: their text is the value (ClickHouse's IPv4/IPv6 have no
    # netmask and no room for the other family)
    "inet": "String", "cidr": "String", "macaddr": "String", "macaddr8": "String",
    "bit": "String", "bit varying": "String",
}
_INTEGER_AXIS = {"smallint", "integer", "bigint"}
_TIME_AXIS = {"date", "timestamp without time zone", "timestamp with time zone"}
_ARRAY_ELEMENTS = {"smallint", "integer", "bigint", "real", "double precision", "text",
                   "character varying", "boolean", "uuid"}
CORRELATED = 0.9  # a key this correlated with the table's order is read in order (_order)
# A domain's column is described by its base type (the values are the base type's:
# COPY prints them so): `CREATE DOMAIN email AS text` is a text column.
_COLUMNS_SQL = """SELECT a.attname,
    CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, t.typtypmod)
         ELSE format_type(a.atttypid, a.atttypmod) END AS type,
    a.attnotnull, b.typtype, coalesce(format_type(b.typelem, a.atttypmod), '') AS elem,
    coalesce(array_position(i.indkey::int2[], a.attnum) + 1, 0) AS key_position  -- 0-based
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"""


class PostgresSession:
    """One snapshot of one PostgreSQL table (or query), read range by range."""

    range_checks = NO_CHECKS  # set once the target's types are known (core/reading/ranges.py)
    bounds_in_snapshot = True  # `bounds` reads the exported snapshot itself
    zero_checked = False  # (PostgreSQL has no zero dates)
    control: Control  # the controlling psql; made first, so `close` always has it

    def __init__(self, url: DbUrl, query: str | None, incremental_by: str | None,
                 pipes: bool = False, snapshot: str | None = None) -> None:
        self.url, self.query = url, query
        self.psql = find_psql()
        self.reader = buffered(self.psql)  # a range's psql (the control's is plain)
        self.spare: tuple[int, subprocess.Popen[bytes], IO[bytes]] | None = (
            self._spawn() if pipes else None)  # (ranges are streamed: SourceContext.pipes)
        try:
            self.control = Control(url, self.psql)
        except BaseException:
            self._drop_spare()
            raise
        try:
            self.info = self._describe(incremental_by)
            self.order = ""  # ranges read in key order: read_in_key_order
            self._all("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if snapshot:  # a slot's (exported while its connection stays open): taken
                self._all(f"SET TRANSACTION SNAPSHOT {_text(snapshot)}")  # and exported again
            self.snapshot = str(self._one("SELECT pg_export_snapshot()")[0])
        except BaseException:
            self.close()  # a table refused (no such table, a type not carried)
            raise

    def _one(self, sql: str) -> list[str | None]:
        return self._all(sql)[0]

    def _all(self, sql: str) -> list[list[str | None]]:
        return self.control.rows(sql)

    # -- the table -------------------------------------------------------------------
    def _describe(self, incremental_by: str | None) -> TableInfo:
        """Columns, key and axis, read before the snapshot (a --query is described by a
        temporary view, in a transaction rolled back)."""
        relation = f"{_ident(self.url.schema)}.{_ident(self.url.table)}"
        self._all("BEGIN")
        if self.query:
            relation = "pg_temp.chload_query"
            self._all(f"CREATE TEMP VIEW chload_query AS {self.query}")
        elif self._one(f"SELECT to_regclass({_text(relation)}) IS NULL")[0] == "t":
            raise SourceError(f"{self.url.display}: no such table (or no right to see it)"
                              f"{self._alike()}")
        rows = [[str(v) for v in r] for r in
                self._all(_COLUMNS_SQL.replace("%s", _text(relation)))]
        self._all("ROLLBACK")
        columns = [_column(name, typ, notnull == "t" and not self.query, typtype,
                           elem) for name, typ, notnull, typtype, elem, _ in rows]
        types = {name: typ for name, typ, *_ in rows}
        key = [name for name, *_, pos in sorted(rows, key=lambda r: int(r[5])) if pos != "0"]
        axis = incremental_by or (key[0] if len(key) == 1 and types[key[0]] in
                                  _INTEGER_AXIS else "")
        if axis and axis not in types:
            raise UsageError(f"--incremental-by {axis}: {self.url.display} has no such "
                             f"column; it has {', '.join(types)}")
        if incremental_by and types[axis] not in _INTEGER_AXIS | _TIME_AXIS and not (
                types[axis].startswith("timestamp")):
            raise UsageError(f"--incremental-by {axis}: its type is {types[axis]}; use an "
                             "integer, date or timestamp column that only grows")
        return TableInfo(columns, key, axis, not axis or types[axis] in _INTEGER_AXIS)

    def _alike(self) -> str:
        """Where a table of that name is: in another schema (`public` is the default),
        or spelt in another case (a quoted "Orders"), as '; did you mean ...'."""
        found = self._all(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON "
            "n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND "
            f"lower(c.relname) = lower({_text(self.url.table)}) AND n.nspname NOT IN "
            "('pg_catalog', 'information_schema') ORDER BY 1, 2 LIMIT 3")
        names = [f"{self.url.display.rsplit('/', 1)[0]}/{schema}.{table}"
                 for schema, table in found]
        return f"; did you mean {' or '.join(str(n) for n in names)}?" if names else ""

    def read_in_key_order(self) -> None:
        """Read each range in primary key order where that is an ordered read of the
        table (`_order`); asked by a target that sorts a unit's rows after its last
        byte (DatabaseSource.list, SourceContext's `key_order`): a server sorts a
        block not already in key order before writing it, and an index scan in key
        order moves that work to the database, while the rows stream. Why not for the
        embedded target: docs/sources-databases.md."""
        self.order = self._order()

    def _order(self) -> str:
        """` ORDER BY <key>` by a one-column primary key (the axis: its index exists),
        where the table lies in key order already (pg_stats' correlation of the key
        >= CORRELATED), so that the index scan reads the table's pages in order rather
        than at random; else '' (also for a table without statistics)."""
        key = self.info.key
        if self.query or not self.info.axis or key != [self.info.axis]:
            return ""
        found = self._all(f"SELECT correlation FROM pg_stats WHERE schemaname = "
                          f"{_text(self.url.schema)} AND tablename = {_text(self.url.table)}"
                          f" AND attname = {_text(key[0])}")
        value = found[0][0] if found else None
        if value is None or abs(float(value)) < CORRELATED:
            return ""
        return f" ORDER BY {_ident(key[0])}"

    def _from(self) -> str:
        if self.query:
            return f"({self.query}) AS chload_query"
        return f"{_ident(self.url.schema)}.{_ident(self.url.table)}"

    def bounds(self, axis: str) -> tuple[str | None, str | None, int]:
        col = _ident(axis)
        shown = col if self.info.axis_integer else _fixed_time(col)
        low, high = self._one(f"SELECT min({shown})::text, max({shown})::text FROM "
                              f"{self._from()}")
        rows = 0
        if not self.query:
            relation = _text(f"{_ident(self.url.schema)}.{_ident(self.url.table)}")
            rows = int(self._one("SELECT greatest(reltuples, 0)::bigint FROM pg_class "
                                 f"WHERE oid = {relation}::regclass")[0] or 0)
        return low, high, rows

    def predicate(self, axis: str, r: Range) -> str:
        return range_predicate(_ident(axis), r,
                               lambda value: _literal(value, self.info.axis_integer))

    def outside(self, guards: Sequence[db_range.Guard], where: str) -> list[str | None]:
        """Session.outside, in the snapshot: each column's least value if below its
        guard's range (-infinity, BC), else its greatest if above (infinity, a year past
        9999), as COPY prints it: min and max only, which an index answers."""
        if not guards:
            return []
        found = ", ".join(_beyond(self.info.columns[g.index], g) for g in guards)
        return self._one(f"SELECT {found} FROM {self._from()} WHERE {where}")

    def zero_dates(self, where: str) -> dict[int, str]:
        return {}  # (PostgreSQL has none)

    # -- reading -----------------------------------------------------------------------
    def _script(self, where: str) -> bytes:
        guards = self.range_checks.guards
        selects = ", ".join(_shown(c, guards[i]) if guards.get(i, _NONE).rejects
                            else c.select for i, c in enumerate(self.info.columns))
        checks = "".join(f" AND {_refused(c, guards[i])}" for i, c in
                         enumerate(self.info.columns) if i in guards and not guards[i].rejects)
        # checks raise the plan's cost over jit_above_cost: compiling the plan cost the
        # database more than it saved
        jit = "SET jit = off;\n" if checks else ""
        return (f"\\set ON_ERROR_STOP 1\nBEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;\n"
                f"SET TRANSACTION SNAPSHOT '{self.snapshot}';\nSET DateStyle = ISO;\n"
                f"SET extra_float_digits = 1;\nSET bytea_output = hex;\n{jit}"
                f"COPY (SELECT {selects} FROM {self._from()} WHERE {where}{checks}"
                f"{self.order}) TO STDOUT;\n"
                "COMMIT;\n").encode()

    def _start(self, out: int) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        """A `psql` writing into `out` (owned), waiting on stdin for its script: it
        connects meanwhile."""
        errors = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen([*self.reader, "-X", "-q", *connection_args(self.url)],
                                    stdin=subprocess.PIPE, stdout=out, stderr=errors,
                                    env=client_env(self.url, self.psql))
        except BaseException:
            errors.close()
            raise
        finally:
            os.close(out)
        return proc, errors

    def _spawn(self) -> tuple[int, subprocess.Popen[bytes], IO[bytes]]:
        """The first range's `psql` and its pipe, started with the controlling one so
        that both connect at once (a connection is a good part of the start)."""
        read_end, write_end = db_pipes.make()
        try:
            return (read_end, *self._start(write_end))
        except BaseException:
            os.close(read_end)
            raise

    def _drop_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            os.close(spare[0])
            Psql(self.url, spare[1], spare[2]).stop()

    def read(self, where: str, out: int) -> Psql:
        """`psql` in the snapshot: COPY (the range) TO STDOUT, into `out` (owned)."""
        return Psql(self.url, *self._start(out), self.range_checks).feed(
            self._script(where))

    def stream(self, where: str) -> tuple[int, Reading]:
        """`read` into a pipe: the one psql started with the session, if still alive."""
        spare, self.spare = self.spare, None
        if spare is not None and spare[1].poll() is None:
            return spare[0], Psql(self.url, spare[1], spare[2], self.range_checks).feed(
                self._script(where))
        if spare is not None:
            os.close(spare[0])
            Psql(self.url, spare[1], spare[2]).stop()
        return stream_read(self, where)

    def apart(self) -> PostgresSession:
        """Session.apart: another controlling psql, which imports the snapshot."""
        twin = copy.copy(self)
        twin.spare, twin.control = None, Control(self.url, self.psql)
        try:
            twin._all("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            twin._all(f"SET TRANSACTION SNAPSHOT '{self.snapshot}'")
        except BaseException:
            twin.close()
            raise
        return twin

    def close(self) -> None:
        self._drop_spare()
        self.control.stop()


def _text(value: str) -> str:
    """A SQL string literal (an E-string: backslashes and quotes escaped)."""
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _column(name: str, typ: str, notnull: bool, typtype: str,
            elem: str) -> DbColumn:
    """One column's ClickHouse type and how COPY prints it; one line if none fits."""
    col, base = _ident(name), re.sub(r"\(.*?\)", "", typ).strip()
    if typtype == "e":  # an enum: its label
        return DbColumn(name, nullable("String", not notnull), col)
    if base == "numeric":
        found = re.match(r"numeric\((\d+),(-?\d+)\)", typ)
        decimal = _decimal(int(found.group(1)), int(found.group(2))) if found else ""
        if not decimal:  # a Decimal rounds off digits beyond its scale: String suggested
            return cannot_carry(name, typ, not notnull, col)
        return DbColumn(name, nullable(decimal, not notnull), col)
    if base.startswith("timestamp"):
        digits = re.search(r"\((\d)\)", typ)
        scale = digits.group(1) if digits else "6"
        zoned = "with time zone" in typ
        select = f"({col} AT TIME ZONE 'UTC')" if zoned else col
        return DbColumn(name, nullable(_datetime(scale), not notnull), select, holds="any",
                        source_type="timestamptz" if zoned else "timestamp")
    if base == "date":
        return DbColumn(name, nullable("Date32", not notnull), col, holds="any",
                        source_type="date")
    if base == "boolean":
        return DbColumn(name, nullable("Bool", not notnull), f"{col}::int")
    if base == "bytea":
        return DbColumn(name, nullable("String", not notnull), col, read_type=nullable(
            "String", not notnull), expr=f"unhex(substring({_ch(name)}, 3))")
    element = re.sub(r"\(.*?\)", "", elem.removesuffix("[]")).strip()  # varchar(20)[]
    if typ.endswith("[]") and element in _ARRAY_ELEMENTS | {"character"}:
        inner = TYPES[element]
        # A column of T[] may hold arrays of 2 and more dimensions (PostgreSQL does not
        # enforce them): JSONExtract would read [[1,2],[3,4]] as [], silently; a range
        # holding one fails, naming the column (--schema String keeps the JSON text).
        text, wanted = _ch(name), f"Array(Nullable({inner}))"
        flat = (f"if(throwIf(startsWith(ifNull({text}, ''), '[['), {_ch_str(_nested(name))})"
                f" = 0, ifNull({text}, '[]'), '')")
        return DbColumn(name, wanted, f"array_to_json({col})::text",
                        read_type="Nullable(String)", expr=f"JSONExtract({flat}, '{wanted}')")
    if base in TYPES:
        return DbColumn(name, nullable(TYPES[base], not notnull), col)
    return cannot_carry(name, typ, not notnull, col)


def _decimal(precision: int, scale: int) -> str:
    """The Decimal that holds every value of numeric(precision, scale) exactly; '' if
    none does (over 76 digits). PostgreSQL 15 allows a scale above the precision
    (numeric(2,5): |v| < 0.001, 5 decimals: Decimal(5, 5)) and a negative one
    (numeric(3,-2): multiples of 100 below 100,000: Decimal(5, 0)); ClickHouse has
    neither, and refused the CREATE."""
    digits = max(precision, scale) if scale >= 0 else precision - scale
    if digits > 76:
        return ""
    return f"Decimal({digits}, {max(scale, 0)})"


_NONE = db_range.Guard(-1, "", "", "", "", "", "", False)
def _within(column: DbColumn, guard: db_range.Guard) -> str:
    """`col >= lo AND col <= hi`, the bounds typed by the column (+00: an instant for
    timestamptz, ignored by timestamp and date). The column itself is compared, not its
    UTC wall-clock (AT TIME ZONE is a zone conversion per row). Not `col <@
    tsrange(...)`, a little cheaper per row: PostgreSQL estimated it to keep 1% of the
    rows and chose another plan (a parallel scan and a sort instead of the key's index)."""
    col = _ident(column.name)
    lo = max(guard.lo, "0001-01-01 00:00:00")  # year 0 is 1 BC, which COPY prints so
    return f"{col} >= '{lo}+00' AND {col} <= '{guard.hi}+00'"


def _beyond(column: DbColumn, guard: db_range.Guard) -> str:
    """The column's min where below the guard's range, else its max where above, as
    text (a timestamptz as its UTC wall-clock, as read); NULL when within."""
    col = _ident(column.name)
    lo = max(guard.lo, "0001-01-01 00:00:00")

    def shown(value: str) -> str:
        zoned = column.source_type == "timestamptz"
        return f"({value} AT TIME ZONE 'UTC')::text" if zoned else f"{value}::text"
    return (f"CASE WHEN min({col}) < '{lo}+00' THEN {shown(f'min({col})')} WHEN max({col}) > "
            f"'{guard.hi}+00' THEN {shown(f'max({col})')} END")


def _refused(column: DbColumn, guard: db_range.Guard) -> str:
    """The range check of a column (core/reading/ranges.py), a condition of the COPY's WHERE (a
    SELECT of plain columns needs no projection: a CASE there cost the database twice
    as much): a value outside [lo, hi] (infinity too) is cast, after a marker, to an
    integer, which PostgreSQL refuses with an error quoting it, and the range fails
    (Psql.finish). (A timestamp's parser took some such text: 'm 1 infinity'.) NULL
    passes. It follows the range's own predicate, which PostgreSQL tests first (the
    cheaper): rows of other ranges are not checked."""
    col = _ident(column.name)
    return (f"({_within(column, guard)} OR ('{db_range.MARKER} {guard.index} ' || "
            f"{col}::text)::int IS NULL)")


def _shown(column: DbColumn, guard: db_range.Guard) -> str:
    """Under an error budget: a value outside the range written as text no date parser
    takes (db_range.SHOWN), so the engine rejects that row into chload.rejects."""
    return (f"CASE WHEN {_within(column, guard)} OR {_ident(column.name)} IS NULL THEN "
            f"({column.select})::text ELSE '{db_range.SHOWN}' || {_ident(column.name)}::text "
            "END")


def _datetime(scale: str) -> str:
    """DateTime64, whole seconds too: a DateTime holds 1970 to 2106 only, and the engine
    reads a value outside as its nearest end, silently (1960 as 1970-01-01). A server
    without DateTime64 (18.16) stores DateTime64(0) as DateTime (capabilities.py)."""
    return f"DateTime64({scale}, 'UTC')"


def _fixed_time(col: str) -> str:
    """A time axis printed at fixed width, so bounds compare as text."""
    return f"to_char({col}, 'YYYY-MM-DD HH24:MI:SS.US')"


def _literal(value: str, integer: bool) -> str:
    if integer:
        return str(int(value))
    return "'" + value.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _nested(name: str) -> str:
    return (f"column {name} holds an array of 2 or more dimensions, which is not "
            f"Array(T); pass --schema with {name} as String to load its JSON text (a table "
            "that exists keeps its own type: ALTER or drop it first)")


def _ch_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ch(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


class PostgresSource(DatabaseSource):
    """`postgresql://` and `postgres://` sources (base.py says how they load)."""

    kind = "postgres"
    schemes: tuple[str, ...] = ("postgresql", "postgres")
    # --follow: its changes after a copy (sources/changes/postgres/)
    options: tuple[str, ...] = ("query", "incremental_by", "follow", "cluster")

    def begin_early(self, pattern: str, context: SourceContext) -> Callable[[], None] | None:
        """The snapshot's session begun while the target opens (early.py says why)."""
        return early.begin(pattern, self, context)

    def _session(self, url: DbUrl, context: SourceContext) -> PostgresSession:
        return PostgresSession(url, context.select, context.incremental_by, context.pipes,
                               context.snapshot)


SOURCE = PostgresSource()
