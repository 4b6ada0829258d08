"""Schema evolution: the columns a run's files name that its table lacks
(`--on-new-column fail|add|ignore`).

Files of a data lake grow columns over time (v1 `a, b`; v2 adds `c`; v3 adds `d` and
drops `b`). Each file's own columns are read before any row loads: a CSV/TSV header
(its first line), a Parquet/ORC/Avro/Arrow footer or the keys of JSON lines (one
DESCRIBE each). Then, by the mode:

- fail (the default): nothing changes here; check_headers refuses such a file alone,
  naming the column and this flag;
- add: each new column is added to the table as `Nullable(T)`, T the type the file
  that brought it gives (target.add_columns: every shard of a cluster, then its
  Distributed table, waiting until every replica shows it), once, before any unit
  loads: units in flight never race for an ALTER; a column another loader added
  meanwhile is taken as it is;
- ignore: the known columns load and the new ones are dropped as read
  (input_format_skip_unknown_fields=1); the report says so once per column.

With add or ignore a file may also lack columns the table has (a column dropped from
later files): they load as NULL, or the column's default. The run reads the union of
the files' columns, each file by its own names (chDB by header name; an 18.16 server
posted a file's header columns: server/fill.py _raw_names). A database table says its
columns (Source.columns): add adds those the target table lacks, typed as the source
says (evolve_described); ignore is not offered there (the source reads every column).
A Kafka unit is spooled under add or ignore (kafka/source.py `streams`), so its keys
are read like a file's. Units whose bytes cannot be read twice (stdin, a streamed unit)
are not surveyed: a new column in them fails as with fail.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from chload.core.plan import infer_file
from chload.core.reading import sniff
from chload.core.reading.dialect import first_line
from chload.core.run import on_threads
from chload.errors import ChloadError, UsageError
from chload.formats import JSON_LINES
from chload.schema import AUDIT_COLUMNS, Column, bare_type, format_settings, header_columns
from chload.sources.base import SourceFile
from chload.targets.base import Target

MODES = ("fail", "add", "ignore")
FLAG = "--on-new-column"
SKIP_UNKNOWN = "input_format_skip_unknown_fields"
# Formats whose files name their columns in a footer or header block (DESCRIBE reads it)
NAMED = frozenset({"Parquet", "ORC", "Avro", "Arrow", "ArrowStream", "Native"})
# Types that cannot be inside Nullable(...): added as the file gives them
_NOT_NULLABLE = re.compile(r"^(Array|Map|Tuple|Nested|JSON|Object|Variant|Dynamic)\b")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise UsageError(f"{FLAG} {mode}: use fail, add or ignore")


@dataclass(frozen=True, slots=True)
class Change:
    """A column this run added: the run history's record of it (chload.runs)."""

    table: str
    column: str
    type: str
    unit: str  # the uri of the first file that named it

    def as_dict(self) -> dict[str, str]:
        return {"table": self.table, "column": self.column, "type": self.type,
                "unit": self.unit}


@dataclass(slots=True)
class Evolution:
    """What the run reads after the table has met its files' columns."""

    existing: list[Column]  # the table's columns, as they are now
    data: list[Column]  # the columns the files name that the table has, in its order
    changes: list[Change] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)  # column -> first uri naming it
    notes: list[str] = field(default_factory=list)


def nullable(typ: str) -> str:
    """The type a new column is added as: `Nullable(T)` (rows loaded before have none),
    T without LowCardinality; a composite type (Array, Map, ...) as it is."""
    bare = bare_type(typ)
    return bare if _NOT_NULLABLE.match(bare) else f"Nullable({bare})"


def evolve(target: Target, table_sql: str, table_display: str, files: Sequence[SourceFile],
           existing: list[Column], mode: str) -> Evolution | None:
    """The table after its files' new columns are added (add) or set aside (ignore);
    None when no file could say its columns (the run goes as with fail)."""
    names = columns_of(target, files)
    if not names:
        return None
    new = _first_naming(files, names, {c.name for c in existing} | set(AUDIT_COLUMNS))
    evolution = Evolution(existing, [])
    if new and mode == "add":
        evolution = _add(target, table_sql, table_display, files, new, existing)
    elif new:
        evolution.ignored = new
        evolution.notes = [f"column {n} (first in {uri}) is not in table {table_display}: "
                           f"left out of every file ({FLAG} ignore)" for n, uri in new.items()]
    named = {n for f in names.values() for n in f}
    evolution.data = [c for c in evolution.existing if c.name in named
                      and not c.default_kind and c.name not in AUDIT_COLUMNS]
    return evolution


def evolve_described(target: Target, table_sql: str, table_display: str,
                     described: Sequence[Column], existing: list[Column], unit: str,
                     ) -> Evolution:
    """A source that says its columns (a database table): `add` of those the table
    lacks, typed as the source says, brought by `unit` (the run's first)."""
    known = {c.name for c in existing}
    new = {c.name: c.type for c in described if c.name not in known}
    if not new:
        return Evolution(existing, list(described))
    added = set(target.add_columns(table_sql, [Column(n, nullable(t)) for n, t in new.items()]))
    now = target.table_columns(table_sql) or existing
    types = {c.name: c.type for c in now}
    return Evolution(now, list(described), [Change(table_display, n, types.get(n, t), unit)
                                            for n, t in new.items() if n in added])


def _first_naming(files: Sequence[SourceFile], names: dict[str, list[str]],
                  known: set[str]) -> dict[str, str]:
    """column -> the first file (uri) that names it, for the columns not `known`."""
    new: dict[str, str] = {}
    for f in files:
        for name in names.get(f.uri, []):
            if name not in known:
                new.setdefault(name, f.uri)
    return new


def _add(target: Target, table_sql: str, table_display: str, files: Sequence[SourceFile],
         new: dict[str, str], existing: list[Column]) -> Evolution:
    """ALTER TABLE ... ADD COLUMN for each new column (target.add_columns), typed by the
    file that brought it."""
    by_uri = {f.uri: f for f in files}
    typed: dict[str, str] = {}
    for uri in dict.fromkeys(new.values()):
        typed.update({c.name: c.type for c in _file_types(target, by_uri[uri])})
    # A column whose file cannot be inferred is not added: that file fails alone, as
    # any file naming a column the table lacks (check_headers, or its load)
    new = {n: uri for n, uri in new.items() if n in typed}
    columns = [Column(n, nullable(typed[n])) for n in new]
    if not columns:
        return Evolution(existing, [])
    added = set(target.add_columns(table_sql, columns))
    now = target.table_columns(table_sql) or existing
    types = {c.name: c.type for c in now}
    return Evolution(now, [], [Change(table_display, n, types.get(n, typed[n]), new[n])
                               for n in new if n in added])


def _file_types(target: Target, f: SourceFile) -> list[Column]:
    """A file's columns with the types the engine infers for them (core/reading/sample.py's
    refinement for CSV/TSV, as a new table's columns get)."""
    try:
        return infer_file(target, f)
    except ChloadError:
        return []


def columns_of(target: Target, files: Sequence[SourceFile]) -> dict[str, list[str]]:
    """uri -> the names of its columns, for each file that can say them cheaply: a
    CSV/TSV header; a Parquet/ORC/Avro/Arrow file's or JSON lines' DESCRIBE (eight at a
    time). A file that cannot be read twice or described is left out (its load says)."""
    found: dict[str, list[str]] = {}
    readable = [f for f in files if sniff.read_again(f) and not f.is_stream]
    headed = [f for f in readable if f.format.has_header and sniff.delimiter(f.format)]
    for f, fields in on_threads(lambda f: (f, first_line(target, f)), headed, 8):
        if fields:
            found[f.uri] = header_columns(fields)
    described = [f for f in readable if f.format.name in NAMED | JSON_LINES]
    for uri, names in on_threads(lambda f: (f.uri, _described(target, f)), described, 8):
        if names:
            found[uri] = names
    return found


def _described(target: Target, f: SourceFile) -> list[str]:
    settings = format_settings(f.format)
    try:
        rows = target.infer_rows(f"DESCRIBE {target.reader(f, f.format.name, None)}"
                                 + (f" SETTINGS {settings}" if settings else ""))
    except ChloadError:
        return []
    return [r["name"] for r in rows]


def job_settings(mode: str, files: Sequence[SourceFile], settings: Sequence[tuple[str, str]],
                 given: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The run's settings for `mode`: ignore drops unknown fields as read (unless the
    user set it); with add or ignore an Avro file may lack a field (a column dropped
    from later files), as Parquet, ORC and Arrow may by default."""
    if mode == "fail":
        return tuple(settings)
    told = {name for name, _ in given}
    out = [s for s in settings if not (mode == "ignore" and s[0] == SKIP_UNKNOWN
                                       and SKIP_UNKNOWN not in told)]
    if mode == "ignore" and SKIP_UNKNOWN not in told:
        out.append((SKIP_UNKNOWN, "1"))
    if any(f.format.name == "Avro" for f in files) and "input_format_avro_allow_missing_fields" \
            not in told:
        out.append(("input_format_avro_allow_missing_fields", "1"))
    return tuple(out)
