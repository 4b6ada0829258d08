"""Planning: sources x ledger x table -> the files to load and how to read them.

Nothing here reads a row. Listing gives identities; the ledger says what is already
loaded; the engine infers a schema from one file; the table decides column types.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from chload import sniff
from chload.errors import ChloadError, SourceError, UsageError
from chload.formats import HEADER_FORMATS, FileFormat, check_compression
from chload.records import dataclass, field, replace
from chload.rejects import ErrorBudget
from chload.schema import (
    AUDIT_COLUMNS,
    Column,
    Tolerance,
    create_table_sql,
    decide_header,
    infer,
    match_columns,
    parse_structure,
    quote_ident,
)
from chload.sources import SourceFile
from chload.targets import Target

# Formats whose rows carry no column names, so a table's columns cannot stand in.
POSITIONAL_FORMATS = {"CSV", "TSV", "TabSeparated", "CSVWithNames", "TSVWithNames",
                      "TabSeparatedWithNames", "Values", "RowBinary"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class TableName:
    database: str
    name: str

    @property
    def sql(self) -> str:
        return f"{quote_ident(self.database)}.{quote_ident(self.name)}"

    @property
    def display(self) -> str:
        return f"{self.database}.{self.name}"


def parse_table(value: str, default_database: str = "default") -> TableName:
    """`trips` or `db.trips`; plain identifiers only, so messages and SQL stay simple."""
    parts = value.split(".")
    if len(parts) > 2 or not all(_NAME.match(p) for p in parts):
        raise UsageError(
            f"--table {value}: use a plain name like trips or db.trips "
            "(letters, digits and _; not starting with a digit)"
        )
    if len(parts) == 1:
        return TableName(default_database, parts[0])
    return TableName(parts[0], parts[1])


@dataclass
class Plan:
    """What a run will do: which files to load, which to skip, how to read them."""

    to_load: list[SourceFile]
    skipped: list[SourceFile]
    changed: set[str] = field(default_factory=set)  # uris loaded before with another identity
    columns: list[Column] = field(default_factory=list)  # table columns, in data order
    read_columns: list[Column] = field(default_factory=list)  # how the engine reads the data
    created_table: bool = False


def decide(files: Sequence[SourceFile], loaded: dict[str, str], force: bool) -> Plan:
    """Split files into load and skip by the ledger: exactly once per identity."""
    to_load, skipped, changed = [], [], set()
    for f in files:
        before = loaded.get(f.uri)
        if f.is_stream or force or before is None:
            to_load.append(f)
        elif before != f.identity:
            to_load.append(f)
            changed.add(f.uri)
        else:
            skipped.append(f)
    return Plan(to_load, skipped, changed)


def resolve_format(target: Target, files: Sequence[SourceFile],
                   names: Sequence[str] = ()) -> list[SourceFile]:
    """Decide CSV/TSV headers once per format, from the first file that can tell, for all.

    `names`: the columns the data may have (the table's, or --schema's), if known; a
    first line of just those names is a header, no engine needed (sniff.py).
    A file that cannot tell (empty, corrupt) does not stop the run: the next one is
    asked, and if none can, files keep their format and fail or load on their own.
    """
    decided: dict[FileFormat, FileFormat] = {}
    for fmt in dict.fromkeys(f.format for f in files):
        decided[fmt] = fmt
        named = HEADER_FORMATS.get(fmt.name)
        asked = samples(f for f in files if f.format == fmt)  # any: a garbage first file
        if named and names and any(sniff.starts_with_names(s, names) for s in asked):
            decided[fmt] = FileFormat(named, fmt.compression)
            continue
        for sample in samples(f for f in files if f.format == fmt):
            def reader(x: FileFormat, s: SourceFile = sample) -> str:
                return target.reader(s, x.name, None)
            try:
                decided[fmt] = decide_header(target.infer_rows, reader, fmt)
                break
            except ChloadError:
                continue
    return [replace(f, format=decided[f.format]) for f in files]


def samples(files: Iterable[SourceFile], limit: int = 3) -> list[SourceFile]:
    """The files worth asking about a schema: the first few that are not empty (a remote
    object of size 0 may just not have said its size)."""
    return [f for f in files if f.size > 0 or f.kind != "local"][:limit]


def prepare_table(
    target: Target, table: TableName, files: Sequence[SourceFile], *,
    existing: list[Column] | None, schema: str | None, order_by: str | None,
    partition_by: str | None, audit: bool, create: bool = True,
    budget: ErrorBudget | None = None,
) -> tuple[list[Column], list[Column], bool]:
    """Create the table if needed; return (table columns, read columns, created).
    `existing`: the table's columns (target.table_columns), None if it does not exist.

    With `create=False` (validation) a missing table is not created: the data's own
    columns are used. With an error `budget`, inference keeps a text column of
    numbers-but-a-few numeric (schema.numeric_type).
    """
    tolerate = budget.allows if budget and budget.allows_errors else None
    data = (parse_structure(schema) if schema
            else _data_columns(target, files, existing, tolerate))
    created = False
    if existing is None and not create:
        return data, data, False
    if existing is None:
        columns = data + ([Column(n, t) for n, t in AUDIT_COLUMNS.items()] if audit else [])
        target.command(f"CREATE DATABASE IF NOT EXISTS {quote_ident(table.database)}")
        target.command(create_table_sql(table.sql, columns, order_by, partition_by))
        existing = target.table_columns(table.sql) or columns
        created = True
    matched = match_columns(table.display, existing, data, audit)
    return matched, (data if schema else matched), created


def _data_columns(target: Target, files: Sequence[SourceFile], existing: list[Column] | None,
                  tolerate: Tolerance | None = None) -> list[Column]:
    """The columns of the data: inferred by the engine, or for an existing table, what
    the rows are read as.

    For an existing table the table's types decide; the data only has to name its
    columns. Self-describing formats (JSON, Parquet, ...) fall back to the table's own
    columns when a sample cannot be inferred (a broken line must not block a load with
    an error budget).
    """
    failed: tuple[SourceFile, ChloadError] | None = None
    misfit: list[Column] = []
    candidates = samples(files)
    if not candidates:  # every file is empty (0 bytes): nothing to infer from
        return _empty_files(files, existing)
    if existing is not None and candidates[0].format.has_header:
        header = sniff.header_names(candidates[0])  # the names are all that matter
        by_name = {c.name: c for c in existing}
        if header and len(set(header)) == len(header) and set(header) <= set(by_name):
            return [by_name[n] for n in header]
    for sample in candidates:
        def reader(structure: str | None, s: SourceFile = sample) -> str:
            return target.reader(s, s.format.name, parse_structure(structure) if structure
                                 else None)
        try:
            columns = infer(target.infer_rows, reader, nulls=existing is None,
                            tolerate=tolerate)
        except ChloadError as exc:  # this file fails alone when loaded; ask the next
            failed = failed or (sample, exc)
            continue
        if existing is None or {c.name for c in columns} <= {c.name for c in existing}:
            return columns
        misfit = misfit or columns  # a garbage file's columns do not decide either
    if misfit:
        return misfit  # no sample fits: the table's SchemaError says which columns differ
    if existing is not None and candidates[0].format.name not in POSITIONAL_FORMATS:
        return _table_columns(existing)
    assert failed is not None
    first, error = failed
    reason = str(error).split(": ", 1)[-1]
    raise SourceError(f"{first.uri}: cannot infer its columns ({reason}); check --format, "
                      "or pass --schema 'name Type, ...'") from error


def _table_columns(existing: list[Column]) -> list[Column]:
    """What the data is read as when only the table can say: its own columns."""
    return [c for c in existing if not c.default_kind and c.name not in AUDIT_COLUMNS]


def _empty_files(files: Sequence[SourceFile], existing: list[Column] | None) -> list[Column]:
    """Empty files load 0 rows into an existing table; a new one needs --schema."""
    if existing is not None:
        return _table_columns(existing)
    raise SourceError(f"{files[0].uri}: the file is empty, so it has no columns to infer; "
                      "pass --schema 'name Type, ...' to create the table (or load it into "
                      "an existing table)")


def known_names(existing: list[Column] | None, schema: str | None) -> list[str]:
    """The column names the data may have, when known before reading it: --schema's,
    else the existing table's."""
    return [c.name for c in (parse_structure(schema) if schema else existing or [])]


def validate_options(compression: str | None, workers: int | None) -> None:
    if compression:
        check_compression(compression)
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers}: must be 1 or more")
