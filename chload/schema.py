"""Table schemas: names and types as SQL, CREATE TABLE, and matching data to a table.

Inference is the engine's (`DESCRIBE file(...)`); sample.py refines it (NULLs, values
the engine's typing would change or cannot read). Here:
- CSV/TSV header: the engine's detection decides between `CSV` and `CSVWithNames`
  where types tell; where they cannot (all text), the planner judges the first line
  (dialect._decide_header). A header's names become column names (`header_columns`).
- Names: any text, quoted wherever SQL is written (`quote_ident`); `--schema` and the
  server's DDL checks parse quoted names (`parse_structure`, `mask_quoted`).
- Nullability: the engine infers every column `Nullable` (setting
  `schema_inference_make_columns_nullable`); empty CSV fields are NULL in a Nullable
  column (`input_format_csv_empty_as_default`); sample.py keeps `Nullable` only where
  the sample has a NULL, so sorting keys stay possible and storage small.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from chload.errors import SchemaError, UsageError
from chload.formats import HEADER_FORMATS, FileFormat

AUDIT_COLUMNS = {"_source_file": "LowCardinality(String)", "_loaded_at": "DateTime"}
NULL_SAMPLE_ROWS = 200_000
# Whether the first line is a header the engine decides from the lines after it; a few
# hundred say as much as its default 25,000, which is slow on wide files.
HEADER_SAMPLE = ("SETTINGS input_format_max_rows_to_read_for_schema_inference = 500, "
                 "input_format_max_bytes_to_read_for_schema_inference = 1048576")
_UNSORTABLE = re.compile(
    r"^(Nullable|Array|Map|Tuple|JSON|Object|Dynamic|Variant|AggregateFunction)"
)
_POSITIONAL = re.compile(r"^c\d+$")
# A header with an empty or repeated name cannot be read by name: such files are read
# by position. Inference reads the rows after the header line as headerless CSV/TSV ...
SKIP_HEADER = ("input_format_csv_skip_first_lines = 1, input_format_tsv_skip_first_lines = 1, "
               "input_format_csv_detect_header = 0, input_format_tsv_detect_header = 0")
# ... and loading reads a WithNames file's columns in the order the header has them.
BY_POSITION = (("input_format_with_names_use_header", "0"),)

Query = Callable[[str], list[dict]]  # runs SQL, returns small result rows as dicts


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    default_kind: str = ""  # DEFAULT / MATERIALIZED / ALIAS / EPHEMERAL, from system.columns

    @property
    def sql(self) -> str:
        return f"{quote_ident(self.name)} {self.type}"


def bare_type(typ: str) -> str:
    """`UInt8` for `Nullable(UInt8)` or `LowCardinality(Nullable(UInt8))`: the type a
    value has, without the wrappers that say how it is stored."""
    while (inner := re.fullmatch(r"\s*(?:Nullable|LowCardinality)\((.*)\)\s*", typ)):
        typ = inner.group(1)
    return typ.strip()


def quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def schema_argument(columns: Iterable[tuple[str, str]]) -> str:
    """A whole --schema for (name, type) pairs, quoted for a POSIX shell and readable:
    names bare where they can be, in single quotes, or in double quotes where a type
    holds one (a time zone: DateTime64(6, 'UTC'))."""
    text = ", ".join(f"{n if re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', n) else quote_ident(n)}"
                     f" {t}" for n, t in columns)
    if "'" not in text:
        return f"'{text}'"
    return '"' + re.sub(r'([\\"$`])', r"\\\1", text) + '"'


def quote_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def structure(columns: Sequence[Column]) -> str:
    """The `structure` argument of a table function: 'a UInt32, b String'."""
    return ", ".join(c.sql for c in columns)


def parse_structure(text: str) -> list[Column]:
    """Parse a --schema value ('a UInt32, b Nullable(String)', '`Order ID` UInt32'),
    respecting parentheses and quotes: a name with a space, comma or parenthesis is
    written in backquotes (or double quotes), as in ClickHouse."""
    columns = []
    for part in split_top_level(text):
        name, typ = _name_and_type(part)
        if not typ:
            raise UsageError(f"--schema: column '{name}' has no type (write 'name Type'; "
                             "quote a name with spaces in backquotes: `Order ID` UInt32)")
        columns.append(Column(name, typ))
    if not columns:
        raise UsageError("--schema is empty; write e.g. --schema 'id UInt64, name String'")
    return columns


def split_top_level(text: str) -> list[str]:
    """`text` split at the commas outside parentheses and quotes, parts stripped."""
    masked = mask_quoted(text)
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(masked + ","):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [p for p in parts if p]


def mask_quoted(text: str) -> str:
    """`text` with what is inside quotes ('...', `...`, "...") replaced by `_`, same
    length: structure (commas, parentheses, spaces) can then be found by position."""
    out, quote, i = list(text), "", 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and i + 1 < len(text):
                out[i] = out[i + 1] = "_"
                i += 2
                continue
            if ch == quote and text[i + 1:i + 2] == quote:  # a doubled quote
                out[i] = out[i + 1] = "_"
                i += 2
                continue
            if ch == quote:
                quote = ""
            else:
                out[i] = "_"
        elif ch in "'`\"":
            quote = ch
        i += 1
    return "".join(out)


def _name_and_type(part: str) -> tuple[str, str]:
    """'`Order ID` UInt32' -> ('Order ID', 'UInt32'); 'a String' -> ('a', 'String')."""
    if part[:1] in "`\"":
        end = mask_quoted(part).find(part[0], 1)
        if end > 0:
            return unquote_ident(part[:end + 1]), part[end + 1:].strip()
    name, *typ = re.split(r"\s+", part, maxsplit=1)
    return name.strip("`\""), "".join(typ).strip()


def unquote_ident(text: str) -> str:
    """`a\\`b` or "a""b" -> the name itself (quote_ident's inverse)."""
    quote, body = text[0], text[1:-1]
    body = body.replace(quote * 2, quote)
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "b": "\b", "f": "\f"}


def header_columns(fields: Sequence[str]) -> list[str]:
    """A header's fields as column names: an empty one is `c<position>` (as the engine
    names unnamed columns) and a repeated one `<name>_<position>`, so every column has
    a name of its own."""
    names: list[str] = []
    for position, field in enumerate(fields, 1):
        name = field or f"c{position}"
        if name in names or (not field and name in fields):
            name = f"{name}_{position}"
        names.append(name)
    return names


def decide_header(query: Query, reader: Callable[[FileFormat], str], fmt: FileFormat) -> FileFormat:
    """CSV/TSV: `CSVWithNames` when the engine detects a header line, else `CSV`."""
    named = HEADER_FORMATS.get(fmt.name)
    if named is None:
        return fmt
    extra = f", {format_settings(fmt)}" if fmt.delimiter else ""
    names = [row["name"] for row in query(f"DESCRIBE {reader(fmt)} {HEADER_SAMPLE}{extra}")]
    if all(_POSITIONAL.match(n) for n in names):
        return fmt
    return FileFormat(named, fmt.compression, fmt.delimiter)


def format_settings(fmt: FileFormat) -> str:
    """The settings reading `fmt` needs (`name = value, ...`): CSV's delimiter if not `,`."""
    return settings_sql([("format_csv_delimiter", fmt.delimiter)]) if fmt.delimiter else ""


def default_order_by(columns: Sequence[Column]) -> str:
    """A sorting key: the first column that can be one (not Nullable, not composite)."""
    for column in columns:
        if not column.name.startswith("_") and not _UNSORTABLE.match(column.type):
            if not column.type.startswith(("Float", "Bool", "LowCardinality(Nullable")):
                return quote_ident(column.name)
    return "tuple()"


def create_table_sql(
    table: str, columns: Sequence[Column], order_by: str | None, partition_by: str | None,
    engine: str = "MergeTree",
) -> str:
    body = ",\n    ".join(c.sql for c in columns)
    sql = f"CREATE TABLE IF NOT EXISTS {table} (\n    {body}\n) ENGINE = {engine}"
    if partition_by:
        sql += f"\nPARTITION BY {partition_by}"
    return sql + f"\nORDER BY {order_by or default_order_by(columns)}"


def match_columns(
    table: str, table_columns: Sequence[Column], data_columns: Sequence[Column], audit: bool,
    missing_ok: bool = False,
) -> list[Column]:
    """The table's columns that the data fills, in the data's order, with the table's types.

    A file column the table lacks, or a table column (without a DEFAULT) the file
    lacks, is a SchemaError listing all of them in one line. `missing_ok`: a table
    column the data lacks loads as NULL or its default (--on-new-column add/ignore).
    """
    by_name = {c.name: c for c in table_columns}
    unknown = [c.name for c in data_columns if c.name not in by_name]
    data_names = {c.name for c in data_columns}
    optional = set(AUDIT_COLUMNS) if audit else set()
    missing = [
        c.name for c in table_columns
        if c.name not in data_names and not c.default_kind and c.name not in optional
        and not missing_ok
    ]
    if audit:
        missing += [name for name in AUDIT_COLUMNS if name not in by_name]
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"columns in the data but not in the table: {', '.join(unknown)}")
        if missing:
            parts.append(f"columns in the table but not in the data: {', '.join(missing)}")
        evolve = " (--on-new-column add adds them; ignore loads the others)" if unknown else ""
        raise SchemaError(
            f"table {table}: {'; '.join(parts)}. Fix the table (ALTER TABLE ... ADD COLUMN)"
            f"{evolve}, or pass --schema to say how to read the data"
        )
    return [by_name[c.name] for c in data_columns]


def add_column_sql(table: str, column: Column, if_not_exists: bool = False) -> str:
    """`ALTER TABLE t ADD COLUMN [IF NOT EXISTS] c T` (18.16 has no IF NOT EXISTS)."""
    guard = "IF NOT EXISTS " if if_not_exists else ""
    return f"ALTER TABLE {table} ADD COLUMN {guard}{column.sql}"


def split_table(table: str) -> tuple[str, str]:
    """`db`.`t` (as chload quotes it) -> (db, t)."""
    database, _, name = table.partition(".")
    return database.strip("`"), name.strip("`")


def display_table(table: str) -> str:
    """`db`.`t` -> db.t, as users write it and the ledger records it."""
    return ".".join(split_table(table))


def settings_sql(settings: Iterable[tuple[str, str]]) -> str:
    """`name = value, ...` for a SETTINGS clause; numbers bare, other values quoted."""
    return ", ".join(f"{k} = {_setting_value(v)}" for k, v in settings)


def _setting_value(value: str) -> str:
    return value if value.lstrip("-").replace(".", "", 1).isdigit() else quote_str(value)
