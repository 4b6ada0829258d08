"""How each MySQL/MariaDB column is read: its ClickHouse type, the SQL that prints it
as a TSV field (the client reader's; the C reader escapes plain columns itself), and
the guards of its dates: zero dates (`zero_flags`) and values out of the target's range
(`range_guard`, `kept`). mysql.py's session uses these; nothing here connects.
"""

from __future__ import annotations

import re
from dataclasses import replace

from chload.core.reading import ranges as db_range
from chload.schema import parse_structure
from chload.sources.databases.table import DbColumn, cannot_carry, nullable

INTEGERS = {"tinyint": 8, "smallint": 16, "mediumint": 32, "int": 32, "integer": 32,
             "bigint": 64}
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set",
         "json", "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
_PLAIN = {"float": "Float32", "double": "Float64", "real": "Float64", "year": "UInt16"}
TIME_AXIS = {"date", "datetime", "timestamp"}
_SPECIAL = r"'[\\t\\n\\r\\\\\\x00]'"  # a tab, newline, CR, backslash or NUL (PCRE)


def base_of(typ: str) -> str:
    return re.split(r"[(\s]", typ, maxsplit=1)[0]


def column_of(name: str, typ: str, nulls: bool) -> DbColumn:
    """One column's ClickHouse type and the SQL that prints it as a TSV field."""
    col, base = ident(name), base_of(typ)
    args = re.search(r"\(([^)]*)\)", typ)
    if base in INTEGERS:
        ch = f"{'U' if 'unsigned' in typ else ''}Int{INTEGERS[base]}"
        return _field(name, ch, col, nulls)
    if base == "decimal" and args:
        precision, _, scale = args.group(1).partition(",")
        return _field(name, f"Decimal({precision}, {scale or 0})", col, nulls)
    if base in ("datetime", "timestamp"):
        scale = args.group(1) if args else "0"
        ch = f"DateTime64({scale}, 'UTC')"  # whole seconds too: postgres._datetime
        # a datetime holds years 0000 to 9999, a timestamp 1970 to 2038 (any type holds)
        return replace(_field(name, ch, col, nulls), holds="4digit" if base == "datetime"
                       else "")
    if base == "date":
        return replace(_field(name, "Date32", col, nulls), holds="4digit")
    if base in _TEXT:
        return _field(name, "String", _escaped(col), nulls)
    if base in _PLAIN:
        return _field(name, _PLAIN[base], col, nulls)
    if base == "bit":  # its value as a number (the bytes as they are stored, else)
        number = f"CAST({col} AS UNSIGNED)"
        return replace(_field(name, "UInt64", number, nulls), plain=number)
    text = _field(name, "String", _escaped(col), nulls)  # (geometry: bytes)
    return cannot_carry(name, typ, nulls, text.select)


def _escaped(col: str) -> str:
    """A text column as a TSV field, escaped by the server (the client reader's)."""
    escaped = col
    for raw, shown in (("CHAR(92)", "'\\\\\\\\'"), ("CHAR(9)", "'\\\\t'"),
                       ("CHAR(10)", "'\\\\n'"), ("CHAR(13)", "'\\\\r'"),
                       ("CHAR(0)", "'\\\\0'")):
        escaped = f"REPLACE({escaped}, {raw}, {shown})"
    # Most values need no escape: one regex test is cheaper for the server than five
    # REPLACEs.
    return f"IF({col} RLIKE {_SPECIAL}, {escaped}, {col})"


def zero_flags(columns: list[DbColumn], types: dict[str, str],
                schema: str | None) -> tuple[list[DbColumn], str]:
    """What a zero date (0000-00-00, or a zero month or day: a permissive sql_mode lets
    them in, and ClickHouse would read each as another date, silently) does in each
    column: fails the range ('1', the default), is NULL ('2': --schema types the
    column Nullable), or is kept ('0': --schema types it String, or not a date). The
    native reader checks each value (mysql_copy.c); the client's SELECT gets a guard."""
    given = {c.name: c.type for c in parse_structure(schema)} if schema else {}
    flags, guarded = [], []
    for c in columns:
        flag = "0"
        if base_of(types[c.name]) in TIME_AXIS:
            typ = given.get(c.name, "String") if schema else "Date"  # (not Nullable:
            # a nullable column's zero dates were NULL without --schema saying so)
            flag = "0" if "Date" not in typ else "2" if typ.startswith("Nullable(") else "1"
        flags.append(flag)
        guarded.append(c if flag == "0" else _zero_guard(c, flag))
    return guarded, "".join(flags) if "1" in flags or "2" in flags else ""


def range_guard(column: DbColumn, guard: db_range.Guard) -> str:
    """The client reader's SELECT of a date or time column with a range check: a value
    outside [lo, hi] as text no date parser takes, so the range fails with the engine's
    parse error (or, within a budget, the row is rejected). Zero dates stay the zero
    guard's, and NULL stays NULL."""
    shown = f"CONCAT('{db_range.SHOWN}', {ident(column.name)})"
    return f"IF({kept(column, guard)}, {column.select}, {shown})"


def kept(column: DbColumn, guard: db_range.Guard) -> str:
    """A value the range check passes: NULL, within [lo, hi], or a zero date (_zero_guard)."""
    col = ident(column.name)
    return (f"{col} IS NULL OR {col} BETWEEN '{guard.lo}' AND '{guard.hi}' OR "
            f"MONTH({col}) = 0 OR DAYOFMONTH({col}) = 0")


def _zero_guard(column: DbColumn, flag: str) -> DbColumn:
    """The client reader's SELECT of a date column: a zero date as NULL ('2'), or as
    text no date parser takes ('1': the range fails)."""
    col = ident(column.name)
    shown = "NULL" if flag == "2" else f"CONCAT('zero date ', {col})"
    guard = f"IF(MONTH({col}) = 0 OR DAYOFMONTH({col}) = 0, {shown}, {col})"
    return replace(column, select=f"IFNULL({guard}, '\\\\N')")


def _field(name: str, ch: str, select: str, nulls: bool) -> DbColumn:
    return DbColumn(name, nullable(ch, nulls),
                    f"IFNULL({select}, '\\\\N')" if nulls else select)


def ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
