"""A database table as chload sees it: its URL, its columns and the value checks.

`DbUrl` never shows the password (`display`, `repr`, messages). A `DbColumn` says how
the source's client prints a column and which ClickHouse type holds it; a column no
type holds unchanged is `refused`, and a run without --schema stops before anything
loads (`refusal`). `RangeChecks` turns a date or time value out of the target's range
(core/reading/ranges.py) into one line naming the --schema that loads it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import unquote, urlsplit

from chload.core.reading import ranges as db_range
from chload.errors import SchemaError, UsageError
from chload.schema import schema_argument

URL_KINDS = {"postgresql": "postgresql", "postgres": "postgresql", "mysql": "mysql",
             "mariadb": "mysql"}  # a URL's scheme -> DbUrl.kind
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


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
    return schema_argument((c.name, c.type) for c in columns)


# -- values out of the target's range ----------------------------------------------------
@dataclass(frozen=True, slots=True)
class RangeChecks:
    """A session's range checks (core/reading/ranges.py): by column position, and the columns as
    they are read (for the --schema a refusal suggests)."""

    url: DbUrl
    columns: list[DbColumn]
    guards: dict[int, db_range.Guard]

    def refusal(self, index: int, value: str) -> SchemaError:
        """The one line for `value` of the column at `index`, outside its type's range."""
        return self.refusals({index: value})

    def refusals(self, found: dict[int, str], zeros: dict[int, str] | None = None
                 ) -> SchemaError:
        """The one line for values of several columns (by index) outside their types'
        ranges (`found`) and MySQL zero dates (`zeros`), with the one --schema that
        loads them all."""
        zeros = zeros or {}
        guards = {i: self.guards[i] if is_date(v) else replace(self.guards[i], wider="String")
                  for i, v in found.items()}  # no date type holds infinity, BC, 10000
        nulls = {i: c.type if c.type.startswith("Nullable(") else f"Nullable({c.type})"
                 for i, c in enumerate(self.columns) if i in zeros}
        hint = schema_hint([replace(c, type=_wrapped(c.type, guards[i].wider)) if i in guards
                            else replace(c, type=nulls[i]) if i in nulls else c
                            for i, c in enumerate(self.columns)])
        if not zeros:
            return db_range.message_many(self.url.display,
                                         [(guards[i], found[i]) for i in sorted(found)], hint)
        held = [db_range.held_text(guards[i], v) for i, v in sorted(found.items())] + [
            f"column {self.columns[i].name} holds the zero date '{v}' (a permissive "
            "sql_mode let it in), which ClickHouse has no value for"
            for i, v in sorted(zeros.items()) if i not in found]
        ways = [f"{guards[i].name} as {guards[i].wider}" for i in sorted(found)] + [
            f"{self.columns[i].name} as {nulls[i]} to load such dates as NULL, or as String "
            "to keep their text" for i in sorted(zeros) if i not in found]
        return SchemaError(
            f"{self.url.display}: {'; '.join(held)}; pass --schema with {', '.join(ways)}, "
            f"e.g. --schema {hint} (a table that exists keeps its own type for "
            f"{'them' if len(ways) > 1 else 'it'}: ALTER or drop it first)")


def is_date(value: str) -> bool:
    """A value as the source prints it is a date of years 0001 to 9999 (not infinity, BC,
    or a year past 9999)."""
    return bool(re.match(r"(?!0000)\d{4}-\d\d-\d\d", value)) and not value.endswith(" BC")


def _wrapped(typ: str, wider: str) -> str:
    return f"Nullable({wider})" if typ.startswith("Nullable(") else wider


NO_CHECKS = RangeChecks(DbUrl("", "", "", 0, "", "", ""), [], {})
