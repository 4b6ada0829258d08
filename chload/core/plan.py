"""Planning: sources x ledger x table -> the files to load and how to read them.

Nothing here reads a row. Listing gives identities; the ledger says what is already
loaded; the engine infers a schema from one file; the table decides column types.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from chload.commit.known import KnownUnits
from chload.commit.ledger import FileEvent
from chload.commit.rejects import ErrorBudget
from chload.core.reading import fit, heads as firsts, sniff
from chload.core.reading.dialect import (
    csv_settings as csv_settings,
    first_line,
    just_a_header,
    resolve_format as resolve_format,
    rows_before_bad_json,
    rows_before_blank_tail,
    samples,
)
from chload.core.reading.sample import SampleMisfit, Tolerance, declared, infer
from chload.core.run import on_threads
from chload.core.upsert import Upsert
from chload.errors import KEEP_BAD_ROWS, ChloadError, SchemaError, SourceError, UsageError
from chload.formats import LINE_FORMATS, check_compression
from chload.schema import (
    AUDIT_COLUMNS,
    BY_POSITION,
    SKIP_HEADER,
    Column,
    bare_type,
    format_settings,
    header_columns,
    match_columns,
    parse_structure,
    quote_ident,
)
from chload.sources.base import Skipped, SourceFile
from chload.sources.run import RunSources
from chload.targets.base import Target

# columns a stream's reader writes into each row (--audit): (target, data, format, inferred)
AddColumns = Callable[[Target, list[Column], str, bool], list[Column]]

# Formats whose rows carry no column names, so a table's columns cannot stand in.
POSITIONAL_FORMATS = {"CSV", "TSV", "TabSeparated", "CSVWithNames", "TSVWithNames",
                      "TabSeparatedWithNames", "Values", "RowBinary"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_DATABASES = {  # lower-cased name -> whose it is
    "system": "the server's own", "information_schema": "the server's own",
    "chload": "chload's own (its ledger and stage tables)",
}


@dataclass(frozen=True, slots=True)
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
    """`trips` or `db.trips`; plain identifiers only, so messages and SQL stay simple.
    The server's own databases and chload's (its ledger and stages) are refused: rows
    written there vanish, or a later load drops them."""
    parts = value.split(".")
    if len(parts) > 2 or not all(_NAME.match(p) for p in parts):
        raise UsageError(
            f"--table {value}: use a plain name like trips or db.trips "
            "(letters, digits and _; not starting with a digit)"
        )
    table = TableName(default_database, parts[0]) if len(parts) == 1 else TableName(*parts)
    owner = RESERVED_DATABASES.get(table.database.lower())
    if owner:
        raise UsageError(
            f"--table {value}: database {table.database} is {owner}; load into a database "
            f"of your own, e.g. --table default.{table.name}"
            + ("" if len(parts) == 2 else " (a bare name goes to the --target URL's database)")
        )
    return table


@dataclass(frozen=True, slots=True)
class Plan:
    """What a run will do: which files to load, how many it skips, how to read them.

    Built whole: `decide` splits the files; once the table is prepared, the caller
    makes the complete plan with `replace(plan, to_load=..., columns=..., ...)`.
    Skipped files are counted, not kept: a rerun over a long history holds only
    what it loads.
    """

    to_load: list[SourceFile]
    skipped: int = 0  # files the ledger has loaded as they are now
    changed: set[str] = field(default_factory=set)  # uris loaded before with another identity
    refused: dict[str, str] = field(default_factory=dict)  # changed, not loaded: uri -> why
    columns: list[Column] = field(default_factory=list)  # table columns, in data order
    read_columns: list[Column] = field(default_factory=list)  # how the engine reads the data
    created_table: bool = False


def decide(files: Iterable[SourceFile | Skipped], known: KnownUnits, force: bool,
           release: Callable[[list[SourceFile]], None] = lambda files: None,
           reload_changed: bool = False) -> Plan:
    """Split files into load, skip and refuse by the ledger: exactly once per file.

    `files` is taken as it comes (a listing, streamed) and `known` holds the ledger's
    units as keys (commit/known.py), so memory grows with what is new, not with what
    was loaded before; files the listing itself found known and unchanged come
    counted (`Skipped`: the local walk's compiled loop). A file met twice (a second
    spelling, a second pattern) counts once; `release` gets the second (what its
    listing made for it).

    A file loaded before under another identity (a log that grew, a file rewritten) is
    refused, not loaded again: its earlier rows are still in the table, and loading it
    whole would double them. `--force` loads it (and every file) again, as asked;
    `reload_changed` (--mode replace-partitions: its rows replace the earlier ones)
    loads it again too.
    """
    to_load: dict[str, SourceFile] = {}
    changed: dict[str, SourceFile] = {}
    skipped = 0
    for f in files:
        if isinstance(f, Skipped):
            skipped += f.count
            continue
        if f.is_stream:  # (stdin: named once)
            to_load[f.uri] = f
            continue
        i = known.find((f.uri, *f.aliases))  # (aliases: an older spelling of its uri)
        if i < 0 or not known.meet(i):
            if f.uri in to_load or f.uri in changed or i >= 0:
                release([f])  # met already
            else:
                to_load[f.uri] = f
        elif not known.same_identity(i, f.identity):
            changed[f.uri] = f
        elif force:
            to_load[f.uri] = f
        else:
            skipped += 1
    refused: dict[str, str] = {}
    before = known.events([u for f in changed.values() for u in (f.uri, *f.aliases)]
                          ) if changed else {}
    for uri, f in list(changed.items()):
        event = next((before[u] for u in (uri, *f.aliases) if u in before), None)
        if event is None:  # another uri's key (a collision of hashes): a new file
            del changed[uri]
            to_load[uri] = f
        elif force or reload_changed:
            to_load[uri] = f
        else:
            refused[uri] = _changed_message(f, event)
    return Plan(list(to_load.values()), skipped, set(changed), refused)


def _changed_message(f: SourceFile, before: FileEvent) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(before.seq / 1e9))
    return (f"{f.uri}: changed since it was loaded ({before.rows:,} rows, {when}); not "
            "loaded again, which would add those rows twice: pass --force to load it whole "
            "again, after deleting its earlier rows if they must not stay")


def prepare_table(
    target: Target, table: TableName, files: Sequence[SourceFile], *,
    existing: list[Column] | None, schema: str | None, order_by: str | None,
    partition_by: str | None, audit: bool, create: bool = True,
    budget: ErrorBudget | None = None, described: list[Column] | None = None,
    dates_told: bool = False, sources: RunSources | None = None,
    added: AddColumns | None = None, evolved: list[Column] | None = None,
    upsert: Upsert | None = None,
) -> tuple[list[Column], list[Column], bool]:
    """Create the table if needed; return (table columns, read columns, created).
    `existing`: the table's columns (target.table_columns), None if it does not exist.
    `described`: the data's columns as its source says them (Source.columns: a
    database table's), read as given like --schema's; None: inferred by the engine.

    With `create=False` (validation) a missing table is not created: the data's own
    columns are used. With an error `budget`, inference keeps a text column of
    numbers-but-a-few numeric (sample.numeric_type). `dates_told`: the run sets
    date_time_input_format, so a column of NN/NN/YYYY dates is read as told
    (sample.date_order).

    Where the loader's engine reads a file (the embedded target, a push into a server),
    a narrow integer column (8 to 32 bits) is read as Int64 and inserted through
    accurateCast (fit.widened, fit.insert_expr), so a number its column cannot hold
    fails the file anywhere in it, not only in the start fit.py samples; a server that
    parses a file itself (18.16, raw) wraps it past that start. A typed file's own
    narrow types are read as they are (_wider_in_files).

    `evolved` (--on-new-column add or ignore: core/evolve.py): the table's columns that
    the files name, read with the table's types; a table column no file names loads as
    NULL or its default. `upsert` (--upsert-key): the table created is its engine,
    ordered by its key, once the data is seen to hold the key and version.
    """
    tolerate = budget.allows if budget and budget.allows_errors else None
    given = parse_structure(schema) if schema else described
    if schema and described is not None:
        _same_names(files, described, given or [])
    data = given if given is not None else evolved if evolved is not None else _data_columns(
        target, files, existing, tolerate, dates_told)
    if audit and files and added is not None:  # columns a stream's reader adds
        data = added(target, data, files[0].format.name, given is None)
    created = False
    if existing is None and not create:
        return data, data, False
    if existing is None:
        columns = data + ([Column(n, t) for n, t in AUDIT_COLUMNS.items()] if audit else [])
        target.command(f"CREATE DATABASE IF NOT EXISTS {quote_ident(table.database)}")
        if upsert is None:
            target.create_table(table.sql, columns, order_by, partition_by)
        else:
            upsert.check_data(table.display, data)
            target.create_table(table.sql, columns, upsert.order_by, partition_by, upsert.engine)
        existing = target.table_columns(table.sql) or columns
        created = True
    matched = match_columns(table.display, existing, data, audit,
                            missing_ok=evolved is not None)
    read = data if given is not None else matched
    if files and all(f.format.name in NAMED_FORMATS for f in files):
        read = fit.widened(read, _wider_in_files(target, files, read, sources))
    elif (files and all(f.format.name in LINE_FORMATS for f in files)
          and sources is not None and sources.reads_in_place(files)):
        read = fit.widened(read, {c.name for c in read if fit.narrow_int(c.type)})
    return matched, read, created


def infer_file(target: Target, f: SourceFile) -> list[Column]:
    """One file's columns as a new table would get them (core/evolve.py types a new
    column by the file that brought it)."""
    return declared(f, _infer(target, f, True, None))


def _wider_in_files(target: Target, files: Sequence[SourceFile], read: Sequence[Column],
                    sources: RunSources | None) -> set[str]:
    """The narrow integer columns (fit.widened) that a typed file holds in another type
    (an Int64 for a UInt8 column), asked of the first and the last file (their footers:
    DESCRIBE), only when the table has such a column: reading every such column wide
    slows typed files that hold their own narrow types, and a DESCRIBE of every file
    delays the first byte (docs/benchmarks.md), so the files between are taken to hold
    what those two do: a file among them holding a wider type is read as before (its
    number wraps). A file that cannot be described is taken as wider."""
    narrow = {c.name: c.type for c in read if fit.narrow_int(c.type)}
    if (not narrow or sources is None or any(f.is_stream for f in files)
            or not sources.reads_in_place(files)):
        return set()  # (stdin, a stream's or a database's units: read as before)

    def wider(f: SourceFile) -> set[str]:
        try:
            rows = target.infer_rows(f"DESCRIBE {target.reader(f, f.format.name, None)}")
        except ChloadError:
            return set(narrow)
        held = {r["name"]: r["type"] for r in rows}
        return {n for n, t in narrow.items() if bare_type(held.get(n, "")) != bare_type(t)}
    ends = list(dict.fromkeys((files[0], files[-1])))
    return set().union(*(wider(f) for f in ends))


def _same_names(files: Sequence[SourceFile], described: list[Column],
                schema: list[Column]) -> None:
    """--schema over a source that says its columns may change their types, not which
    columns the data has (its rows come as the source has them)."""
    names = [c.name for c in described]
    if [c.name for c in schema] != names:
        source = f" ({files[0].uri})" if files else ""
        raise UsageError(f"--schema: name every column of the source{source}, in its "
                         f"order: {', '.join(names)}")


def _data_columns(target: Target, files: Sequence[SourceFile], existing: list[Column] | None,
                  tolerate: Tolerance | None = None, dates_told: bool = False) -> list[Column]:
    """The columns of the data: inferred by the engine, or for an existing table, what
    the rows are read as.

    For an existing table the table's types decide; the data only has to name its
    columns (the first sampled file whose header names only table columns; the others
    are checked file by file: check_headers). Self-describing formats (JSON, Parquet,
    ...) fall back to the table's own columns when a sample cannot be inferred (a
    broken line must not block a load with an error budget).
    """
    failed: tuple[SourceFile, ChloadError] | None = None
    misfit: list[Column] = []
    candidates = samples(files)
    if not candidates:  # every file is empty (0 bytes): nothing to infer from
        return _empty_files(files, existing)
    if existing is not None and candidates[0].format.has_header:
        by_name = {c.name: c for c in existing}
        for sample in candidates:
            fields = first_line(target, sample)  # the names are all that matter
            header = header_columns(fields) if fields else []
            if header and set(header) <= set(by_name):
                return [by_name[n] for n in header]
    for sample in candidates:
        why = sniff.unreadable(sample)
        if why:  # fails alone (check_headers); another sample may decide
            failed = failed or (sample, Unreadable(context=sample.uri, reason=why))
            continue
        try:
            columns = declared(sample, _infer(target, sample, existing is None, tolerate,
                                              dates_told))
        except SampleMisfit as exc:  # the types inferred do not fit the file itself
            raise SchemaError(context=sample.uri, reason=exc.reason) from exc
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
    if isinstance(error, Unreadable):
        raise error
    ragged = re.search(r"number of column names (\d+) differs with the number of types (\d+)",
                       error.reason)
    if ragged:
        raise SourceError(f"{first.uri}: a row has {ragged.group(2)} fields where the header "
                          f"names {ragged.group(1)} columns; fix the file, or pass --schema "
                          f"'name Type, ...' with {KEEP_BAD_ROWS}") from error
    reason = error.reason
    raise SourceError(f"{first.uri}: cannot infer its columns ({reason}); check --format, "
                      "or pass --schema 'name Type, ...'") from error


class Unreadable(SourceError):
    """A file that cannot be read as written (sniff.unreadable): said as it is."""


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


def _infer(target: Target, sample: SourceFile, nulls: bool,
           tolerate: Tolerance | None, dates_told: bool = False) -> list[Column]:
    """One file's columns, as the engine infers them. A CSV/TSV header with an empty or
    repeated name is read by position (schema.SKIP_HEADER) and named by header_columns;
    a file of just a header has String columns of its names."""
    fmt, skip, names = sample.format.name, "", list[str]()
    fields = first_line(target, sample) if sample.format.has_header else None
    if fields:
        names = header_columns(fields)
        if names != fields and fmt.endswith("WithNames"):
            fmt, skip = fmt.removesuffix("WithNames"), SKIP_HEADER
    settings = ", ".join(s for s in (skip, format_settings(sample.format)) if s)
    text = sniff.delimiter(sample.format) is not None  # CSV, TSV: values as written

    def reader(structure: str | None) -> str:
        return target.reader(sample, fmt, parse_structure(structure) if structure else None)
    try:
        return infer(target.infer_rows, reader, nulls=nulls, tolerate=tolerate,
                     settings=settings, names=names if skip else (), header=bool(fields),
                     text=text, dates_told=dates_told)
    except ChloadError:
        if names and just_a_header(target, sample):
            return [Column(name, "String") for name in names]
        rows = rows_before_blank_tail(target, sample) or (
            tolerate and rows_before_bad_json(target, sample))
        if not rows:
            raise
    # The engine's schema reader skips neither trailing blank lines (the loads do:
    # engine.SESSION_SETTINGS) nor, with an error budget, a broken JSON line (the load
    # rejects it); asked to stop before them, it infers from the rows it can read.
    stop = f"input_format_max_rows_to_read_for_schema_inference = {rows}"
    return infer(target.infer_rows, reader, nulls=nulls, tolerate=tolerate,
                 settings=", ".join(s for s in (settings, stop) if s),
                 names=names if skip else (), header=bool(fields), text=text,
                 dates_told=dates_told)


@dataclass(slots=True)
class HeaderCheck:
    """The files whose header fits the run, those refused (with why), and the settings
    every load of the run needs (schema.BY_POSITION, or none)."""

    files: list[SourceFile]
    refused: list[tuple[SourceFile, str]] = field(default_factory=list)
    settings: tuple[tuple[str, str], ...] = ()


def check_headers(target: Target, table: TableName, files: Sequence[SourceFile],
                  table_columns: Sequence[Column], read_columns: Sequence[Column],
                  audit: bool, named: bool = True,
                  settings: Sequence[tuple[str, str]] = (), new_columns: str = "fail",
                  start: Callable[[SourceFile, int], bytes | None] | None = None,
                  ) -> HeaderCheck:
    """Every CSV/TSV file's own header matched against the columns the run reads; with
    `named` (no --schema chose the columns, no setting drops unknown ones), every
    Parquet/ORC/... file's columns against the table's (_extra_columns).

    The engine would read a file whose header names other columns as defaults (chDB
    fills missing columns and skips unknown ones) or by position (18.16 ignores header
    names): such a file fails alone, its message listing the missing and unknown
    columns. If no file fits, that is an error before loading (SchemaError). A local
    file's header costs one short read (sniff.py); a remote file's, one engine query,
    eight at a time. A local text file's first values are held against the table's
    types (fit.py: ClickHouse would store a NULL, or a number or date the type cannot
    hold, as another value); one that does not fit fails the file alone. `settings`:
    the run's, which may ask for defaults in place of NULLs. `new_columns`: the run's
    --on-new-column; with add or ignore a file may lack table columns (NULL or default),
    and with ignore name columns the table lacks (dropped as read). `start`: a remote
    file's first bytes by its source (RunSources.start), read in place of the engine.
    """
    heads = firsts.read(files)  # (their first lines, judged once per distinct one)
    headers = _headers(target, files, heads, start)
    by_position = any(header_columns(h) != h for h in {id(h): h for h in headers if h}.values())
    read = [c.name for c in read_columns]
    checked = HeaderCheck([], settings=BY_POSITION if by_position else ())
    extra = _extra_columns(target, files, table_columns) if named else {}
    problems: dict[object, str] = {}  # a header (its Head, or fields) -> its mismatch

    def after_uri(head: firsts.Head, fields: list[str] | None, fmt: str,
                  wide: list[str] | None) -> str:
        """Why a file is refused, said after its uri ('' if it is not); `wide`: its
        columns the table lacks (_extra_columns)."""
        key = head if fields is head.fields else tuple(fields or ())
        problem = fields and problems.get(key)
        if fields and problem is None:
            problem = problems[key] = firsts.mismatch(header_columns(fields), read,
                                                      table_columns, audit, by_position,
                                                      new_columns)
        if head.unreadable:
            return f": {head.unreadable}"
        if wide:
            return (f": its columns do not fit table {table.display}: columns in the data but "
                    f"not in the table: {', '.join(wide)}. {firsts.NEW_HINT}, or pass --schema "
                    "naming the columns to read")
        if not problem:
            return ""
        new = ("" if "not in the table" not in problem else f" {firsts.NEW_HINT}."
               if new_columns == "fail" else " Their types could not be inferred from the "
               "file to add them: add them yourself (ALTER TABLE ... ADD COLUMN).")
        return (f": its header does not fit table {table.display}: {problem}.{new} Fix the "
                "header or the table; if its first line is data, pass --format "
                f"{fmt.removesuffix('WithNames')}")
    said = {h: after_uri(h, h.fields, f.format.name, None)  # once a first line
            for h, f in dict(zip(heads, files, strict=True)).items()}
    why = [f.uri + s if (s := said[h]) else None for f, h in zip(files, heads, strict=True)]
    asked = {h for h in said if h.named and h.fields is None}  # (the engine read these)
    for i in [i for i, f in enumerate(files) if f.uri in extra] if extra else []:
        asked.add(heads[i])
    for i in [i for i, h in enumerate(heads) if h in asked] if asked else []:
        why[i] = files[i].uri + s if (s := after_uri(heads[i], headers[i], files[i].format.name,
                                                     extra.get(files[i].uri))) else None
    rest = [i for i, w in enumerate(why) if w is None]  # then their first values
    misfits = fit.check_many([files[i] for i in rest], table_columns, read, dict(settings),
                             table.display, target.engine_name)
    for i, misfit in zip(rest, misfits, strict=True):
        why[i] = f"{files[i].uri}: {misfit.message()}" if misfit else None
    checked.files, checked.refused = [f for f, w in zip(files, why, strict=True) if not w], \
        [(f, w) for f, w in zip(files, why, strict=True) if w]
    if checked.refused and not checked.files:
        raise SchemaError(checked.refused[0][1])
    return checked


# Formats whose files name their columns (a schema), which the engine reads by name,
# leaving out without a word a column the table lacks (CSV and JSON refuse it:
# input_format_skip_unknown_fields=0).
NAMED_FORMATS = {"Parquet", "ORC", "Avro", "Arrow", "ArrowStream", "Native"}


def _extra_columns(target: Target, files: Sequence[SourceFile],
                   table_columns: Sequence[Column]) -> dict[str, list[str]]:
    """uri -> the columns a Parquet/ORC/... file has that the table lacks (a column added
    to newer files of a data lake): one DESCRIBE a file (its footer), eight at a time.
    A file that cannot be described is left to its load to report."""
    table = {c.name for c in table_columns}

    def extra(f: SourceFile) -> tuple[str, list[str]]:
        try:
            rows = target.infer_rows(f"DESCRIBE {target.reader(f, f.format.name, None)}")
        except ChloadError:
            return f.uri, []
        return f.uri, [r["name"] for r in rows if r["name"] not in table]
    named = [f for f in files if f.format.name in NAMED_FORMATS and sniff.read_again(f)]
    return {uri: names for uri, names in on_threads(extra, named, 8) if names}


def _headers(target: Target, files: Sequence[SourceFile], heads: Sequence[firsts.Head],
             start: Callable[[SourceFile, int], bytes | None] | None = None,
             ) -> list[list[str] | None]:
    """Each file's header fields: read here (`heads`), else by first_line, 8 at a time."""
    found = [h.fields for h in heads]
    rest = [i for i, h in enumerate(heads) if h.named and h.fields is None]
    for i, fields in on_threads(lambda i: (i, first_line(target, files[i], start)), rest, 8):
        found[i] = fields
    return found


def reads_by_name(schema: str | None, settings: Sequence[tuple[str, str]]) -> bool:
    """Whether a file's columns that the table lacks are refused (check_headers): not
    when --schema chose the columns to read, nor when a setting drops the others."""
    return schema is None and dict(settings).get("input_format_skip_unknown_fields",
                                                 "0").lower() not in ("1", "true")


def known_names(existing: list[Column] | None, schema: str | None) -> list[str]:
    """The column names the data may have, when known before reading it: --schema's,
    else the existing table's."""
    return [c.name for c in (parse_structure(schema) if schema else existing or [])]


def validate_options(compression: str | None, workers: int | None) -> None:
    if compression:
        check_compression(compression)
    if workers is not None and workers < 1:
        raise UsageError(f"--workers {workers}: must be 1 or more")
