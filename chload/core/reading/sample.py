"""What a file's sample says, beyond the engine's own inference of its columns.

The engine types each column from a file's first rows (`DESCRIBE`); chload then reads a
larger sample (NULL_SAMPLE_ROWS) once, in the engine, for what that typing cannot see:
NULLs (Nullable only where the sample holds one), numbers-but-a-few under an error budget
(numeric_type), a later value the type cannot read (misfit_error), integers with a
leading zero (LEADING_ZERO), `NN/NN/YYYY` dates of unproven order (date_order), and
a header repeated as a row (repeated_header). docs/reading-files.md ("Tables chload
creates") says what each means to a user.

Invariant: no row passes through Python; every figure is an aggregate of one engine query.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from chload.errors import KEEP_BAD_ROWS, DataError, SchemaError
from chload.schema import NULL_SAMPLE_ROWS, Column, Query, quote_ident, quote_str, structure

if TYPE_CHECKING:
    from chload.sources.base import SourceFile


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
    # The types a table would get: a --schema suggested below keeps a leading zero too.
    refined = [_refine(c, stats, tolerate) for c in columns]
    wrong = [c for c in digits if stats.get(f"not_int:{c.name}")] if not tolerate else []
    if wrong:  # read as text: a value that is no integer was counted, not raised
        value = _sample_stats(query, source, (), (), settings, (), wrong[:1], found=True)
        raise misfit_error(refined, wrong[0].name,
                           f"{value.found[wrong[0].name]!r} is not {_base(wrong[0].type)}")
    for c in dates:
        def example(c: Column = c) -> str:
            return _sample_stats(query, source, (), (), settings, dates=[c],
                                 found=True).found[c.name]
        date_order(refined, c, stats, example)
    if stats.get("header:rows") and not tolerate:
        repeated_header(columns, _sample_stats(query, source, (), columns, settings),
                        stats["header:rows"])
    return refined


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
    day, month = stats.get(f"day_first:{name}", 0), stats.get(f"month_first:{name}", 0)
    if not stats.get(f"dated:{name}") or (day and not month):
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
               if stats.get(f"values:{c.name}", 0) > repeats
               and stats.get(f"not_Float64:{c.name}") == repeats]
    if numeric:
        shown = ", ".join(numeric[:3]) + (f" and {len(numeric) - 3} more" if len(numeric) > 3
                                          else "")
        times = "once" if repeats == 1 else f"{repeats} times"
        raise SampleMisfit(reason=f"the header line comes again as a row ({times} in "
                                  f"the first {NULL_SAMPLE_ROWS:,} rows, as when files are "
                                  f"joined with cat), which would make {shown} text; pass "
                                  f"{KEEP_BAD_ROWS}, or remove those lines from the file")


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
                                  f"as text, or {KEEP_BAD_ROWS}")
    return SampleMisfit(reason=f"a row after the first ones does not fit the columns they "
                              f"gave ({text}); pass --schema 'name Type, ...', or "
                              f"{KEEP_BAD_ROWS}")


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
        base = "String"  # LEADING_ZERO
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
    """Counts over the sample (`null:c`, `values:c`, ...), and `found`: per column asked
    (_sample_stats with `found`), one value that made it count."""

    def __init__(self, counts: dict[str, int], found: dict[str, str]) -> None:
        super().__init__(counts)
        self.found = found


def _sample_stats(query: Query, source_sql: str, nullable: Sequence[Column],
                  textual: Sequence[Column], settings: str = "",
                  header_row: Sequence[Column] = (), digits: Sequence[Column] = (),
                  found: bool = False, dates: Sequence[Column] = ()) -> Stats:
    """One read of the first NULL_SAMPLE_ROWS rows, counting: NULLs per nullable column;
    values and non-numbers per text column; rows that repeat `header_row` (each column
    holding its own name); per integer column read as text (`digits`), values with a
    leading zero and values that are no integer; per date column read as text
    (`dates`), values written NN/NN/YYYY and which number passes 12. With `found`, one
    such value per column too (`Stats.found`). Aliases are positional: a column's own
    name as an alias would shadow the column inside the other aggregates."""
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


def declared(file: SourceFile, columns: list[Column]) -> list[Column]:
    """`columns` inferred from `file`, Nullable where its source declares a column so
    (SourceFile.constants: a Delta table's partition values, NULL in files the sample
    is not), whatever the sample holds; the type otherwise as inferred (and stored)."""
    nullable = {name for name, typ, _ in file.constants if typ.startswith("Nullable(")}
    return [Column(c.name, f"Nullable({c.type})") if c.name in nullable
            and not c.type.startswith("Nullable(") else c for c in columns]
