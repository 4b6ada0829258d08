"""Table schemas: inference from files, CREATE TABLE, and matching data to a table.

Inference is the engine's (`DESCRIBE file(...)`); we only refine it:
- CSV/TSV header: the engine's detection decides between `CSV` and `CSVWithNames`
  where types tell; where they cannot (all text), the planner judges the first line
  (dialect._decide_header). A header's names become column names (`header_columns`).
- Names: any text, quoted wherever SQL is written (`quote_ident`); `--schema` and the
  server's DDL checks parse quoted names (`parse_structure`, `mask_quoted`).
- Nullability: the engine infers every text column `Nullable` (setting
  `schema_inference_make_columns_nullable`), which makes sorting keys impossible and
  storage larger. We count NULLs over a sample (empty CSV fields are NULL in a Nullable
  column, via `input_format_csv_empty_as_default`) and keep `Nullable` only where the
  sample has one.
- Dirty numbers: with an error budget, a text column whose sampled values are numbers
  but a few is numeric, and the few are bad rows for the budget (`numeric_type`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from chload.errors import DataError, SchemaError, UsageError
from chload.formats import HEADER_FORMATS, FileFormat

AUDIT_COLUMNS = {"_source_file": "LowCardinality(String)", "_loaded_at": "DateTime"}
NULL_SAMPLE_ROWS = 200_000
# Whether the first line is a header the engine decides from the lines after it; a few
# hundred say as much as its default 25,000 (which took 1.5 s on a 51-column file).
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


def quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


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


def infer(query: Query, reader: Callable[[str | None], str], nulls: bool = True,
          tolerate: Tolerance | None = None, settings: str = "",
          names: Sequence[str] = (), header: bool = False,
          text: bool = False, dates_told: bool = False) -> list[Column]:
    """Columns of a source: the engine's inference, Nullable only where NULLs appear.

    `reader(structure)` returns the table-function SQL reading the sample file. With
    `nulls=False` (only the names matter: the table exists) the sample is not read.
    `tolerate(bad, values)`: with an error budget, whether `bad` of a text column's
    `values` may be bad rows rather than a reason to make the column String
    (numeric_type below). `settings` (`name = value, ...`) go with every query;
    `names`, if given, name the inferred columns in order (a header the engine cannot
    read by name: SKIP_HEADER). `header`: the file's first line named the columns, so
    a row repeating it is looked for (repeated_header). `text`: values are text (CSV,
    TSV), so integer and date columns are sampled as written (LEADING_ZERO,
    date_order); `dates_told`: the user set date_time_input_format, which decides.
    """
    extra = f", {settings}" if settings else ""
    described = query(
        f"DESCRIBE {reader(None)} SETTINGS schema_inference_make_columns_nullable = 1{extra}"
    )
    columns = [Column(row["name"], row["type"]) for row in described]
    _names_are_text([c.name for c in columns])
    if names:
        if len(names) != len(columns):
            raise SchemaError(f"the header names {len(names)} columns, the rows have "
                              f"{len(columns)}")
        columns = [Column(name, c.type) for name, c in zip(names, columns, strict=True)]
    nullable = [c for c in columns if c.type.startswith("Nullable(")]
    textual = [c for c in columns if tolerate and _base(c.type) == "String"]
    if not nulls or not (nullable or textual):
        return columns
    if tolerate:  # with an error budget the load rejects the rows that do not fit
        settings = ", ".join(s for s in (settings, _SKIP_BAD_ROWS) if s)
    # A row repeating the header can only be read where every column is text.
    header_row = columns if header and all(_base(c.type) == "String" for c in columns) else ()
    digits = [c for c in columns if text and re.fullmatch(r"U?Int\d+", _base(c.type))]
    dates = [c for c in columns if text and not dates_told
             and re.fullmatch(r"Date(Time)?(64)?(\(.*\))?", _base(c.type))]
    source = reader(structure([Column(c.name, "Nullable(String)") if c in digits + dates
                               else c for c in columns]))
    try:
        stats = _sample_stats(query, source, nullable, textual, settings, header_row, digits,
                              dates=dates)
    except DataError as exc:
        raise misfit_error(columns, exc.column, re.sub(
            r"^column \S+: |\s*\(at row \d+\)", "", exc.reason)) from exc
    wrong = [c for c in digits if stats[f"not_int:{c.name}"]] if not tolerate else []
    if wrong:  # read as text: a value that is no integer was counted, not raised
        value = _sample_stats(query, source, (), (), settings, (), wrong[:1], found=True)
        raise misfit_error(columns, wrong[0].name,
                           f"{value.found[wrong[0].name]!r} is not {_base(wrong[0].type)}")
    for c in dates:
        def example(c: Column = c) -> str:
            return _sample_stats(query, source, (), (), settings, dates=[c],
                                 found=True).found[c.name]
        date_order(columns, c, stats, example)
    if stats.get("header:rows") and not tolerate:
        repeated_header(columns, _sample_stats(query, source, (), columns, settings),
                        stats["header:rows"])
    return [_refine(c, stats, tolerate) for c in columns]


# A date written `03/04/2024` (or with `-` or `.`): day/month or month/day? The engine
# reads each value on its own, day first unless that is impossible: in one column,
# `01/13/2024` is January 13 and `03/04/2024` April 3.
_NUMERIC_DATE = r"^(\d{1,2})[/.-](\d{1,2})[/.-]\d{2,4}"


def date_order(columns: Sequence[Column], column: Column, stats: dict[str, int],
               example: Callable[[], str]) -> None:
    """Refuse to guess the order of a column of `NN/NN/YYYY` dates unless the sample
    proves it day first (a first number above 12, none in second place), the engine's
    reading: before any table is created, say which setting reads the file as meant.
    `example()`: one such value of the sample (asked only here)."""
    name = column.name
    day, month = stats[f"day_first:{name}"], stats[f"month_first:{name}"]
    if not stats[f"dated:{name}"] or (day and not month):
        return
    schema = ", ".join(f"{_schema_name(c.name)} {'String' if c.name == name else _base(c.type)}"
                       for c in columns)
    keep = f"--schema '{schema}' to keep them as written"
    written = f"column {name} holds dates written like {example()!r}"
    if day and month:
        raise SampleMisfit(reason=f"{written}, some with a first and some with a second "
                                  f"number above 12, so not in one order; pass {keep}")
    seen = ("month first (a second number above 12), which the engine would read day first "
            "wherever it can" if month else "which could be day/month or month/day (no number "
            "above 12 in the sample), and the engine would read them day first")
    raise SampleMisfit(reason=f"{written}, {seen}; pass --setting date_time_input_format="
                              "best_effort_us to read them month first (US), --setting "
                              "date_time_input_format=best_effort to read them day first, or "
                              f"{keep}")


def repeated_header(columns: Sequence[Column], stats: dict[str, int], repeats: int) -> None:
    """Files joined with `cat` repeat the header line as a row: the engine then infers
    text for every column, numbers included. Where a column's values are numbers but
    for such rows (`stats`: values and non-numbers per column), say so before the table
    is created: with a budget those rows are bad rows of numeric columns
    (numeric_type), rejected and kept by the load."""
    numeric = [c.name for c in columns
               if stats[f"values:{c.name}"] > repeats
               and stats[f"not_Float64:{c.name}"] == repeats]
    if numeric:
        shown = ", ".join(numeric[:3]) + (f" and {len(numeric) - 3} more" if len(numeric) > 3
                                          else "")
        times = "once" if repeats == 1 else f"{repeats} times"
        raise SampleMisfit(reason=f"the header line comes again as a row ({times} in "
                                  f"the first {NULL_SAMPLE_ROWS:,} rows, as when files are "
                                  f"joined with cat), which would make {shown} text; pass "
                                  "--max-errors N to load the other rows and keep those lines "
                                  "in chload.rejects, or remove them from the file")


_SKIP_BAD_ROWS = "input_format_allow_errors_num = 1000000000"


class SampleMisfit(SchemaError):
    """A value of the sample that its inferred column's type cannot read (misfit_error)."""


def misfit_error(columns: Sequence[Column], column: str | None, text: str) -> SampleMisfit:
    """The engine typed each column from the file's first rows (25,000 by default); a
    later row, read for the sample's statistics, holds a value its column's type cannot
    read (`text`: what the engine said, `'N/A' is not Int64` where it names the value).
    Said before any table is created, with the --schema that reads the column as text."""
    base = [Column(c.name, _base(c.type)) for c in columns]
    if column:
        schema = ", ".join(
            f"{_schema_name(c.name)} {'String' if c.name == column else c.type}"
            for c in base)
        return SampleMisfit(reason=f"column {column}: {text}, the type the file's first "
                                  f"rows gave it; pass --schema '{schema}' to read the column "
                                  "as text, or --max-errors N to load the other rows and keep "
                                  "such rows in chload.rejects")
    return SampleMisfit(reason=f"a row after the first ones does not fit the columns they "
                              f"gave ({text}); "
                              "pass --schema 'name Type, ...', or --max-errors N to load the "
                              "other rows and keep such rows in chload.rejects")


def _schema_name(name: str) -> str:
    """A column's name as --schema takes it: bare where it is an identifier."""
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else quote_ident(name)


Tolerance = Callable[[int, int], bool]


def _names_are_text(names: Sequence[str]) -> None:
    """Column names must be UTF-8: a Latin-1 header (`gr\xf6\xdfe`) comes back from the
    engine as bytes kept as surrogates (engine._text), which no statement can carry."""
    for name in names:
        try:
            name.encode()
        except UnicodeEncodeError:
            shown = name.encode(errors="surrogateescape").decode("latin-1")
            raise SchemaError(reason=f"the header names a column {shown!r} that is not "
                              "UTF-8 text; convert the file to UTF-8 (e.g. iconv -f LATIN1 "
                              "-t UTF-8 FILE > FILE.utf8.csv)") from None


def _base(type_: str) -> str:
    return type_[len("Nullable("):-1] if type_.startswith("Nullable(") else type_


def _refine(column: Column, stats: dict[str, int], tolerate: Tolerance | None) -> Column:
    """Drop Nullable where the sample has no NULL; a text column of numbers stays numeric."""
    nullable = column.type.startswith("Nullable(")
    has_null = nullable and stats.get(f"null:{column.name}", 1) > 0
    base = _base(column.type)
    if tolerate and base == "String":
        base = numeric_type(stats, column.name, tolerate) or base
    if stats.get(f"zeros:{column.name}"):
        base = "String"  # leading_zeros
    return Column(column.name, f"Nullable({base})" if has_null else base)


# An integer written with a leading zero (`02134`, `0612345678`): a zip code, a phone
# number, an account id. Read as an integer it loses the zero, and no table type brings
# it back; such a column is created String, keeping every value as written (--schema
# chooses otherwise).
LEADING_ZERO = r"^[+-]?0[0-9]"


def numeric_type(stats: dict[str, int], name: str, tolerate: Tolerance) -> str | None:
    """`Int64` or `Float64` for a text column whose sampled values are numbers but a few.

    The engine infers String for a column as soon as one sampled value is not a number
    ("x7" among integers). With an error budget the user has said some rows are bad:
    such a column is numeric when at most 1% of its values are not numbers, or the
    budget allows them; those rows are then rejected (and kept) by the load, within
    the budget, instead of turning the whole column into text.
    """
    values = stats.get(f"values:{name}", 0)
    for type_ in ("Int64", "Float64"):
        bad = stats.get(f"not_{type_}:{name}", values)
        if values and bad * 2 < values and (bad * 100 <= values or tolerate(bad, values)):
            return type_
    return None


class Stats(dict[str, int]):
    """Counts over the sample (`null:c`, `values:c`, ...), and `found`: per integer
    column read as text, a value that is no integer."""

    def __init__(self, counts: dict[str, int], found: dict[str, str]) -> None:
        super().__init__(counts)
        self.found = found


def _sample_stats(query: Query, source_sql: str, nullable: Sequence[Column],
                  textual: Sequence[Column], settings: str = "",
                  header_row: Sequence[Column] = (), digits: Sequence[Column] = (),
                  found: bool = False, dates: Sequence[Column] = ()) -> Stats:
    """NULLs per nullable column; values and non-numbers per text column; rows that
    repeat `header_row` (each column holding its own name); per integer column read as
    text (`digits`), values with a leading zero and values that are no integer (with
    `found`, one of them); one read of the first NULL_SAMPLE_ROWS rows. Aliases are positional: a
    column's own name as an alias would shadow the column inside the other aggregates."""
    exprs: dict[str, str] = {}
    if header_row:
        exprs["header:rows"] = "countIf(" + " AND ".join(
            f"toString({quote_ident(c.name)}) = {quote_str(c.name)}" for c in header_row) + ")"
    for c in nullable:
        exprs[f"null:{c.name}"] = f"countIf(isNull({quote_ident(c.name)}))"
    for c in textual:
        name = quote_ident(c.name)
        exprs[f"values:{c.name}"] = f"countIf(notEmpty(ifNull({name}, '')))"
        for type_ in ("Int64", "Float64"):
            exprs[f"not_{type_}:{c.name}"] = (
                f"countIf(notEmpty(ifNull({name}, '')) AND isNull(to{type_}OrNull({name})))")
    for c in digits:
        name, value = quote_ident(c.name), f"ifNull({quote_ident(c.name)}, '')"
        bad = f"notEmpty({value}) AND isNull(to{_base(c.type)}OrNull({value}))"
        exprs[f"zeros:{c.name}"] = f"countIf(match({value}, {quote_str(LEADING_ZERO)}))"
        exprs[f"not_int:{c.name}"] = f"countIf({bad})"
        if found:  # only asked again when one was counted: anyIf costs every row
            exprs[f"found:{c.name}"] = f"anyIf({value}, {bad})"
    for c in dates:  # read as text: how many are NN/NN/YYYY, and which number passes 12
        value = f"ifNull({quote_ident(c.name)}, '')"
        parts = f"extractGroups({value}, {quote_str(_NUMERIC_DATE)})"
        exprs[f"dated:{c.name}"] = f"countIf(match({value}, {quote_str(_NUMERIC_DATE)}))"
        exprs[f"day_first:{c.name}"] = f"countIf(toUInt8OrZero({parts}[1]) > 12)"
        exprs[f"month_first:{c.name}"] = f"countIf(toUInt8OrZero({parts}[2]) > 12)"
        if found:
            exprs[f"found:{c.name}"] = (f"anyIf({value}, match({value}, "
                                        f"{quote_str(_NUMERIC_DATE)}))")
    keys = list(exprs)
    select = ", ".join(f"{e} AS __chload_{i}" for i, e in enumerate(exprs.values()))
    rows = query(f"SELECT {select} FROM (SELECT * FROM {source_sql} LIMIT {NULL_SAMPLE_ROWS})"
                 + (f" SETTINGS {settings}" if settings else ""))
    got = {key: rows[0][f"__chload_{i}"] for i, key in enumerate(keys)} if rows else {}
    return Stats({k: int(v) for k, v in got.items() if not k.startswith("found:")},
                 {k[6:]: str(v) for k, v in got.items() if k.startswith("found:")})


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
) -> list[Column]:
    """The table's columns that the data fills, in the data's order, with the table's types.

    A file column the table lacks, or a table column (without a DEFAULT) the file
    lacks, is a SchemaError listing all of them in one line.
    """
    by_name = {c.name: c for c in table_columns}
    unknown = [c.name for c in data_columns if c.name not in by_name]
    data_names = {c.name for c in data_columns}
    optional = set(AUDIT_COLUMNS) if audit else set()
    missing = [
        c.name for c in table_columns
        if c.name not in data_names and not c.default_kind and c.name not in optional
    ]
    if audit:
        missing += [name for name in AUDIT_COLUMNS if name not in by_name]
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"columns in the data but not in the table: {', '.join(unknown)}")
        if missing:
            parts.append(f"columns in the table but not in the data: {', '.join(missing)}")
        raise SchemaError(
            f"table {table}: {'; '.join(parts)}. Fix the table (ALTER TABLE ... ADD COLUMN), "
            "or pass --schema to say how to read the data"
        )
    return [by_name[c.name] for c in data_columns]


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
