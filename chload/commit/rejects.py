"""Rejected rows: error budgets, and the `chload.rejects` table where bad rows are kept.

Within a budget (`--max-errors`, `--max-error-ratio`) the engine skips rows it cannot
parse (`input_format_allow_errors_num`), writes each to an errors file
(`input_format_record_errors_file_path`) and reads that file into `chload.rejects`;
Python only counts. For JSON lines, which the engine records by row number alone, the
raw line and its error are asked of the engine again, for the first few hundred.

Invariants: a load with a budget parses on one thread (with parallel parsing, row numbers
near a chunk's end are wrong); rejects are keyed by the stage that loaded them, so a file
loaded twice shows only the rejects of the load the ledger says is current.
docs/reading-files.md ("Bad rows and error budgets") is the user's side.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chload.commit.ledger import DATABASE, FILES, LOADED, Sql
from chload.errors import DataError, TerminalError
from chload.formats import JSON_LINES, FileFormat
from chload.schema import quote_str

REJECTS = f"{DATABASE}.rejects"
RAW_LIMIT = 10_000  # characters of a rejected row kept
DETAIL_LIMIT = 300  # JSON rows whose error is asked of the engine one by one
_ENGINE_UNLIMITED = 10**12

# What a load writes into chload.rejects (`at` is computed from seq).
REJECT_COLUMNS = (("target_table", "String"), ("uri", "String"), ("stage", "String"),
                  ("run_id", "String"), ("line", "UInt64"), ("error", "String"),
                  ("raw", "String"), ("seq", "UInt64"))
DDL = f"""CREATE TABLE IF NOT EXISTS {REJECTS} (
    target_table String, uri String, stage String, run_id String, line UInt64,
    error String, raw String, seq UInt64,
    at DateTime MATERIALIZED toDateTime(intDiv(seq, 1000000000))
) ENGINE = MergeTree ORDER BY (target_table, uri, stage, line)"""

# The engine's reason is a multi-line row dump; keep its ERROR line, as
# "column miles (Int64): text "abc" is not like Int64", or else its first line.
_REASON_SQL = (
    "replaceRegexpOne(arrayFirst(l -> position(l, 'ERROR') > 0, "
    "arrayConcat(splitByChar('\\n', reason), [splitByChar('\\n', reason)[1]])), "
    "'^Column \\\\d+,\\\\s+name: ([^,]+),\\\\s+type: ([^,]+),.*?ERROR:\\\\s*', "
    "'column \\\\1 (\\\\2): ')"
)
# The read-only helpers below take the `rows` of the engine that wrote the errors file
# (it is on that engine's machine: the loader's, for a server target).
Rows = Callable[[str], list[dict]]
_ERRORS_FILE_STRUCTURE = ("time String, database Nullable(String), table Nullable(String), "
                          "offset UInt64, reason String, raw String")


@dataclass(frozen=True, slots=True)
class ErrorBudget:
    """How many bad rows a file may have and still load its good rows."""

    max_errors: int | None = None
    max_ratio: float | None = None

    @property
    def allows_errors(self) -> bool:
        return bool(self.max_errors) or bool(self.max_ratio)

    def engine_settings(self, errors_file: str) -> list[tuple[str, str]]:
        # The engine fails a read only when BOTH its limits are exceeded, and checks its
        # ratio as it goes (a bad first row is 100%); so it gets the count limit only,
        # and the ratio is checked here once the whole file is read.
        limit = self.max_errors if self.max_errors is not None else _ENGINE_UNLIMITED
        return [("input_format_allow_errors_num", str(limit)),
                ("input_format_record_errors_file_path", errors_file),
                ("input_format_parallel_parsing", "0")]

    def allows(self, rejected: int, total: int) -> bool:
        """Whether `rejected` bad rows of `total` are within the budget."""
        if self.max_errors is not None and rejected > self.max_errors:
            return False
        return not (self.max_ratio is not None and total and rejected / total > self.max_ratio)

    def check(self, uri: str, rejected: int, loaded: int) -> None:
        """Raise DataError when a file's rejects exceed the budget."""
        total = rejected + loaded
        if self.max_errors is not None and rejected > self.max_errors:
            raise DataError(f"{uri}: {rejected} rejected rows exceed --max-errors "
                            f"{self.max_errors}; nothing loaded from this file")
        if self.max_ratio is not None and total and rejected / total > self.max_ratio:
            raise DataError(f"{uri}: {rejected} of {total} rows rejected "
                            f"({rejected / total:.2%}) exceed --max-error-ratio "
                            f"{self.max_ratio}; nothing loaded from this file")


def ensure(sql: Sql) -> None:
    sql.command(DDL)


def parse_one_sql(fmt: FileFormat, structure: str, text: str) -> str:
    """SQL that parses one row of `text` the way a load of `fmt` does."""
    return f"format({fmt.name}, {quote_str(structure)}, {quote_str(text)})"


def header_lines(fmt: FileFormat) -> int:
    return 1 + fmt.name.endswith("WithNamesAndTypes") if fmt.has_header else 0


def _from_errors(errors_file: str, delimiter: str, tail: str = "") -> str:
    """`FROM` the engine's errors file. The engine writes it as CSV with the load's own
    format settings: a load read with format_csv_delimiter wrote it with that delimiter."""
    settings = f" SETTINGS format_csv_delimiter = {quote_str(delimiter)}" if delimiter else ""
    return (f"FROM file({quote_str(errors_file)}, CSV, {quote_str(_ERRORS_FILE_STRUCTURE)})"
            f"{tail}{settings}")


def count_errors(rows: Rows, errors_file: str, delimiter: str = "") -> int:
    """How many rows the engine rejected (`delimiter`: the load's FileFormat.delimiter)."""
    if not os.path.exists(errors_file) or not os.path.getsize(errors_file):
        return 0
    return int(rows(f"SELECT count() AS n {_from_errors(errors_file, delimiter)}")[0]["n"])


def record(sql: Sql, errors_file: str, *, table: str, uri: str, stage: str, run_id: str,
           fmt: FileFormat, lines_sql: str, parse_sql: Callable[[str], str], seq: int,
           line_base: int = 0) -> None:
    """Copy the engine's errors file into chload.rejects (the engine reads it).

    `lines_sql` reads the source as `LineAsString`; `parse_sql(text)` is SQL that parses
    one row of text the way the load did. `line_base` is added to each row's number (a
    Kafka unit's rows are kept under their offsets: line_base = first offset - 1).
    """
    skip = header_lines(fmt) + line_base
    sql.command(
        f"INSERT INTO {REJECTS} (target_table, uri, stage, run_id, line, error, raw, seq) "
        f"SELECT {quote_str(table)}, {quote_str(uri)}, {quote_str(stage)}, "
        f"{quote_str(run_id)}, offset + {skip}, {_REASON_SQL}, substring(raw, 1, {RAW_LIMIT}), "
        f"{seq} {_from_errors(errors_file, fmt.delimiter)}"
    )
    if not fmt.name.startswith(("CSV", "TSV", "TabSeparated")):
        _fill_in(sql, table=table, uri=uri, stage=stage, lines_sql=lines_sql,
                 parse_sql=parse_sql, line_base=line_base)


def _fill_in(sql: Sql, *, table: str, uri: str, stage: str, lines_sql: str,
             parse_sql: Callable[[str], str], line_base: int = 0) -> None:
    """Formats whose errors file lacks raw text and reason: ask the engine per line."""
    where = (f"target_table = {quote_str(table)} AND uri = {quote_str(uri)} "
             f"AND stage = {quote_str(stage)}")
    lines = [int(r["line"]) for r in sql.rows(
        f"SELECT line FROM {REJECTS} WHERE {where} ORDER BY line LIMIT {DETAIL_LIMIT}")]
    if not lines:
        return
    raw = {int(r["n"]): r["line"] for r in sql.rows(
        f"SELECT n, line FROM (SELECT rowNumberInAllBlocks() + {1 + line_base} AS n, line FROM "
        f"{lines_sql}) WHERE n IN ({', '.join(map(str, lines))}) "
        f"SETTINGS max_threads = 1, input_format_parallel_parsing = 0")}
    updates: list[tuple[int, str, str]] = []
    for line in lines:
        text = str(raw.get(line, ""))
        updates.append((line, text[:RAW_LIMIT], _row_error(sql, parse_sql(text))))
    sql.command(f"ALTER TABLE {REJECTS} UPDATE "
                f"raw = {_case(updates, 1)}, error = {_case(updates, 2)} "
                f"WHERE {where} AND line IN ({', '.join(str(u[0]) for u in updates)}) "
                f"SETTINGS mutations_sync = 1")


def _row_error(sql: Sql, parse: str) -> str:
    """The engine's error for one row parsed alone, or a generic reason."""
    try:
        sql.rows(f"SELECT * FROM {parse}")
    except TerminalError as exc:
        return exc.reason
    return "row rejected by the engine"


def _case(updates: Sequence[tuple[int, str, str]], index: int) -> str:
    branches = " ".join(f"WHEN line = {u[0]} THEN {quote_str(str(u[index]))}" for u in updates)
    return f"CASE {branches} ELSE {'raw' if index == 1 else 'error'} END"


def listing(sql: Sql, table: str, limit: int = 10_000) -> list[dict]:
    """Rejected rows of the current load of each file of a table (`line` an int on every
    target: a server may quote 64-bit integers in JSON)."""
    rows = sql.rows(
        f"SELECT uri AS file, line, error, raw FROM {REJECTS} "
        f"WHERE target_table = {quote_str(table)} AND (uri, stage) IN ("
        f"SELECT uri, argMax(stage, seq) FROM {FILES} WHERE target_table = "
        f"{quote_str(table)} GROUP BY uri HAVING argMax(state, seq) = {quote_str(LOADED)}) "
        f"ORDER BY file, line LIMIT {int(limit)}"
    )
    return [{**row, "line": int(row["line"])} for row in rows]


def check_accounted(rows: Rows, uri: str, fmt: FileFormat, lines_sql: str, loaded: int,
                    rejected: int, errors_file: str) -> None:
    """JSON lines with rejected rows: every non-blank line loaded or rejected, else a
    DataError (the file fails whole: nothing lost). The engine's JSON reader, meeting a
    line cut off inside a string (`{"id":3,"n`), reads the next line into that bad row
    and skips both, while its errors file keeps only the first. Only where a row is a
    line: in a file of objects spread over lines (pretty-printed) fewer lines than rows
    loaded are whole JSON, and lines do not count rows."""
    if fmt.name not in JSON_LINES or not rejected:
        return
    found = rows(f"SELECT countIf(match(line, '\\S')) AS n, countIf(isValidJSON(line)) AS "
                 f"whole FROM {lines_sql}")
    if not found or int(found[0]["whole"]) < loaded:
        return
    missing = int(found[0]["n"]) - loaded - rejected
    if missing <= 0:
        return
    bad = first(rows, errors_file, fmt, 1)
    where = f" after line {bad[0]['line']}" if bad else ""
    raise DataError(f"{uri}: {missing} line(s){where} neither loaded nor rejected (a broken "
                    "line took the next with it); nothing loaded from this file: fix the "
                    "broken line and load it again")


def budget_spent(rows: Rows, budget: ErrorBudget, errors_file: str,
                 delimiter: str = "") -> bool:
    """Did the engine stop because rows beyond --max-errors were bad (not, say, a broken
    gzip stream)?"""
    limit = budget.max_errors
    return limit is not None and count_errors(rows, errors_file, delimiter) >= limit


def over_budget(rows: Rows, uri: str, fmt: FileFormat, budget: ErrorBudget,
                errors_file: str) -> DataError:
    found = first(rows, errors_file, fmt, 1)
    where = f"; the first at line {found[0]['line']}: {found[0]['error']}" if found else ""
    return DataError(f"{uri}: more than {budget.max_errors} rejected rows exceed --max-errors "
                     f"{budget.max_errors}; nothing loaded from this file{where}")


def first(rows: Rows, errors_file: str, fmt: FileFormat, limit: int = 5) -> list[dict]:
    """The first rejected rows of an errors file of a load of `fmt`: line, error, raw."""
    if not os.path.exists(errors_file) or not os.path.getsize(errors_file):
        return []
    return rows(f"SELECT offset + {header_lines(fmt)} AS line, {_REASON_SQL} AS error, "
                f"substring(raw, 1, 500) AS raw "
                + _from_errors(errors_file, fmt.delimiter, f" ORDER BY line LIMIT {int(limit)}"))
