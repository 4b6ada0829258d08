"""Planning: sources x ledger x table -> the files to load and how to read them.

Nothing here reads a row. Listing gives identities; the ledger says what is already
loaded; the engine infers a schema from one file; the table decides column types.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence

from chload import sniff
from chload.errors import ChloadError, SourceError, UsageError
from chload.formats import HEADER_FORMATS, FileFormat, check_compression
from chload.ledger import FileEvent, TableState
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
    refused: dict[str, str] = field(default_factory=dict)  # changed, not loaded: uri -> why
    columns: list[Column] = field(default_factory=list)  # table columns, in data order
    read_columns: list[Column] = field(default_factory=list)  # how the engine reads the data
    created_table: bool = False


def decide(files: Sequence[SourceFile], loaded: Mapping[str, FileEvent], force: bool) -> Plan:
    """Split files into load, skip and refuse by the ledger: exactly once per file.

    A file loaded before under another identity (a log that grew, a file rewritten) is
    refused, not loaded again: its earlier rows are still in the table, and loading it
    whole would double them. `--force` loads it (and every file) again, as asked.
    """
    plan = Plan([], [])
    for f in files:
        before = loaded.get(f.uri)
        if f.is_stream or before is None:
            plan.to_load.append(f)
            continue
        if before.identity != f.identity:
            plan.changed.add(f.uri)
            if not force:
                plan.refused[f.uri] = _changed_message(f, before)
                continue
        (plan.to_load if force else plan.skipped).append(f)
    return plan


def _changed_message(f: SourceFile, before: FileEvent) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(before.seq / 1e9))
    return (f"{f.uri}: changed since it was loaded ({before.rows:,} rows, {when}); not "
            "loaded again, which would add those rows twice: pass --force to load it whole "
            "again, after deleting its earlier rows if they must not stay")


def own_history(table: TableState, loaded: Mapping[str, FileEvent],
                ) -> tuple[Mapping[str, FileEvent], str]:
    """The ledger's loads that are the table's as it is now, and why the others are not
    (a line for the report; '' when all are).

    - No table: the loads went into a table since dropped (or renamed away).
    - A uuid (chDB; servers with Atomic databases): loads recorded under another uuid
      went into another table of that name. Loads recorded without one (older ledgers)
      count as the table's.
    - A table with no rows while the ledger says rows went in (TRUNCATE, or re-created
      empty): loading again cannot double anything.

    What is not detected: on 18.16 (no uuid) a table re-created and given rows before
    the rerun; and rows deleted from a table that keeps others (DELETE, DROP PARTITION).
    The ledger keeps those files loaded: a rerun skips them (`--force` loads them).
    Block numbers and metadata_modification_time were weighed for 18.16 and set aside:
    an old table that was ALTERed and lost its newest partition looks re-created by
    both, and taking it for new would load into a table still holding the rows.
    """
    if not loaded:
        return loaded, ""
    if not table.exists:
        return {}, "table was dropped since the last load: loading all files again"
    own = {uri: e for uri, e in loaded.items() if e.table_uuid in ("", table.uuid)}
    if not own:
        return own, "table was re-created since the last load: loading all files again"
    if table.rows == 0 and any(e.rows for e in own.values()):
        return {}, ("table holds no rows (truncated or re-created since the last load): "
                    "loading all files again")
    return own, ""


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
        first = samples(f for f in files if f.format == fmt)[:1]
        if named and names and first and sniff.starts_with_names(first[0], names):
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
    failure: ChloadError | None = None
    candidates = samples(files) or list(files[:1])
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
            return infer(target.infer_rows, reader, nulls=existing is None, tolerate=tolerate)
        except ChloadError as exc:
            failure = exc
    if existing is not None and candidates[0].format.name not in POSITIONAL_FORMATS:
        return [c for c in existing if not c.default_kind and c.name not in AUDIT_COLUMNS]
    reason = str(failure).split(": ", 1)[-1]
    raise SourceError(f"{candidates[0].uri}: cannot infer its columns ({reason}); check "
                      "--format, or pass --schema 'name Type, ...'") from failure


def known_names(existing: list[Column] | None, schema: str | None) -> list[str]:
    """The column names the data may have, when known before reading it: --schema's,
    else the existing table's."""
    return [c.name for c in (parse_structure(schema) if schema else existing or [])]


def validate_options(compression: str | None, workers: int | None) -> None:
    if compression:
        check_compression(compression)
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers}: must be 1 or more")
