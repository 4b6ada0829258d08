"""The ledger's tables: their names, the states of an event, their DDL, the rows of JSON
events are appended as (`json_rows`), and the SQL that reads which units a table holds
(Ledger.known, from the summary of commit/known.py or from the events themselves).
ledger.py writes and reads through these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain, groupby
from json.encoder import encode_basestring
from operator import attrgetter
from typing import Any

from chload.commit.known import FEED, LOADED_CODE, REPLACED_CODE, SUMMARY, key, summary_statements
from chload.schema import quote_str

DATABASE = "chload"
FILES = f"{DATABASE}.files"
RUNS = f"{DATABASE}.runs"

LOADING, COMMITTING, LOADED, FAILED = "loading", "committing", "loaded", "failed"
# --mode replace-table (commit/swap.py): a run's new table is about to be swapped in
# (uri: the new table), and the swap done: every `loaded` event of the table before the
# latest TABLE_REPLACED is another table's (superseded), so a later append loads them again
SWAPPING, TABLE_REPLACED, SWAP_ABANDONED = "swapping", "table-replaced", "swap-abandoned"
NO_UNIT = f"state NOT IN ('{SWAPPING}', '{TABLE_REPLACED}', '{SWAP_ABANDONED}')"  # (a swap's)
# The planner's keys of a unit (commit/known.py), computed by the engine as events are
# written; in a ledger made before them, computed as read until parts merge
KEY_COLUMNS = {"uri_key": "UInt64 MATERIALIZED reinterpretAsUInt64(MD5(uri))",
               "identity_key": "UInt64 MATERIALIZED reinterpretAsUInt64(MD5(identity))"}

_FILES_DDL = f"""CREATE TABLE IF NOT EXISTS {FILES} (
    target_table String, uri String, identity String, size UInt64, mtime_ns UInt64,
    state String, rows UInt64, bytes UInt64, error String, run_id String,
    stage String, mark UInt64, seq UInt64, table_uuid String, replaced String,
    at DateTime MATERIALIZED toDateTime(intDiv(seq, 1000000000)),
    {", ".join(f"{name} {kind}" for name, kind in KEY_COLUMNS.items())}
) ENGINE = MergeTree ORDER BY (target_table, uri, seq)"""

_RUNS_DDL = f"""CREATE TABLE IF NOT EXISTS {RUNS} (
    run_id String, target_table String, sources String, started_ns UInt64,
    finished_ns UInt64, files_total UInt64, files_loaded UInt64, files_skipped UInt64,
    files_failed UInt64, rows_loaded UInt64, rows_rejected UInt64, bytes_read UInt64,
    seconds Float64, status String, host String, concurrency String, schema_changes String,
    started DateTime MATERIALIZED toDateTime(intDiv(started_ns, 1000000000))
) ENGINE = MergeTree ORDER BY (target_table, started_ns, run_id)"""


# Columns added after the first version: (table, column) -> type; ADDED_COLUMNS finds
# them in system.columns (an older ledger gets them on first use: Ledger._add_columns)
ADDED = {("files", "table_uuid"): "String", ("runs", "concurrency"): "String",
          ("runs", "schema_changes"): "String", ("files", "replaced"): "String",
          **{("files", name): kind for name, kind in KEY_COLUMNS.items()}}
# What a complete ledger has (`table.column`: the added columns)
LEDGER_TABLES = frozenset({"files", "runs", "rejects", SUMMARY, FEED,
                           *(f"{t}.{c}" for t, c in ADDED)})
ADDED_COLUMNS = "(" + " OR ".join(f"(table = '{t}' AND name = '{c}')" for t, c in ADDED) + ")"

# an ADD COLUMN that another chload ran first: 15 DUPLICATE_COLUMN; 18.16 answers 44
# ILLEGAL_COLUMN ("column with this name already exists")
DUPLICATE_COLUMN = {15, 44}


def create_statements() -> list[str]:
    """The ledger's database and tables, as a new ledger gets them (every column)."""
    return [f"CREATE DATABASE IF NOT EXISTS {DATABASE}", _FILES_DDL, _RUNS_DDL,
            *summary_statements(DATABASE)]


def loaded_where(target_table: str) -> str:
    """The `loaded` events of the table's history: those after its latest swap
    (TABLE_REPLACED: --mode replace-table), which supersedes the ones before."""
    table = quote_str(target_table)
    return (f"target_table = {table} AND state = '{LOADED}' AND seq > (SELECT "
            f"toUInt64(max(seq)) FROM {FILES} WHERE target_table = {table} AND state = "
            f"'{TABLE_REPLACED}')")


KNOWN_SLICE = 1 << 17  # `loaded` events grouped by one query of Ledger.known
# A slice grouped on one thread in one hash table (not split in 256 past 100,000 keys):
# the engine's memory for it stays a small multiple of the slice's keys; read in blocks
# of 8192 rows (each part of the summary read in order holds one)
_ONE_SLICE = ("max_threads = 1, max_block_size = 8192, group_by_two_level_threshold = "
              "1000000, group_by_two_level_threshold_bytes = 1000000000")


def known_sql(table: str, uuid: str, summed: bool, lo: int, hi: int) -> str:
    """The keys of the units (the uri key and the identity key of its latest `loaded`
    event) of `table` (a literal) whose uri key is in [lo, hi], when that event is the
    table's as it is now (own_history). From the summary (`summed`): its latest event
    by uri key, read in the order the summary keeps (no grouping); else grouped from
    the ledger itself."""
    if summed:
        return (f"SELECT unit, ident FROM (SELECT unit, ident, owner FROM {DATABASE}."
                f"{SUMMARY} WHERE target_table = {table} AND code = {LOADED_CODE} AND unit "
                f"BETWEEN {lo} AND {hi} AND {_after_swap(table, True)} ORDER BY unit, seq "
                f"DESC LIMIT 1 BY unit) WHERE owner IN (0, {key(uuid) if uuid else 0}) "
                f"SETTINGS {_ONE_SLICE}")
    return (f"SELECT uri_key AS u, argMax(identity_key, seq) AS i FROM {FILES} WHERE "
            f"target_table = {table} AND state = '{LOADED}' AND {_after_swap(table, False)} "
            f"AND uri_key BETWEEN {lo} AND "
            f"{hi} GROUP BY u HAVING argMax(table_uuid IN ('', {quote_str(uuid)}), seq) "
            f"ORDER BY u SETTINGS {_ONE_SLICE}")


def rows_sql(table: str, uuid: str, summed: bool) -> str:
    """The most rows the latest `loaded` event of a unit of the table as it is now
    says (Ledger.known: a table emptied since)."""
    if summed:
        return (f"SELECT max(rows) AS r FROM (SELECT rows, owner FROM {DATABASE}.{SUMMARY} "
                f"WHERE target_table = {table} AND code = {LOADED_CODE} AND "
                f"{_after_swap(table, True)} ORDER BY unit, seq DESC LIMIT 1 BY unit) WHERE "
                f"owner IN (0, {key(uuid) if uuid else 0})")
    return (f"SELECT max(r) AS r FROM (SELECT argMax(rows, seq) AS r, argMax(table_uuid IN "
            f"('', {quote_str(uuid)}), seq) AS mine FROM {FILES} WHERE target_table = {table}"
            f" AND state = '{LOADED}' AND {_after_swap(table, False)} GROUP BY uri) WHERE mine")


def _after_swap(table: str, summed: bool) -> str:
    """Events after the table's latest swap (TABLE_REPLACED: --mode replace-table), which
    supersedes the loads before it; `table` a literal; from the summary or the ledger."""
    if summed:
        return (f"seq > (SELECT toUInt64(max(seq)) FROM {DATABASE}.{SUMMARY} WHERE "
                f"target_table = {table} AND code = {REPLACED_CODE})")
    return (f"seq > (SELECT toUInt64(max(seq)) FROM {FILES} WHERE target_table = {table} "
            f"AND state = '{TABLE_REPLACED}')")


def slices(count: int) -> list[tuple[int, int]]:
    """Ranges of the 64-bit key space, enough that each holds about KNOWN_SLICE of
    `count` keys; in order, so their answers end to end stay sorted."""
    n = -(-count // KNOWN_SLICE)
    step = (1 << 64) // n
    return [(k * step, (k + 1) * step - 1 if k < n - 1 else (1 << 64) - 1) for k in range(n)]


# The columns an event fills, in order (ledger.FileEvent's fields), and the ints among them
FILES_COLUMNS = ("target_table", "uri", "identity", "size", "mtime_ns", "state", "rows",
                 "bytes", "error", "run_id", "stage", "mark", "seq", "table_uuid", "replaced")
_INT_FIELDS = ("size", "mtime_ns", "rows", "bytes", "mark", "seq")
_int_values = attrgetter(*_INT_FIELDS)
# The text columns a batch's events share (all but the file's uri and identity)
_SHARED_FIELDS = ("target_table", "state", "error", "run_id", "stage", "table_uuid",
                  "replaced")
_shared_values = attrgetter(*_SHARED_FIELDS)


def json_rows(events: Sequence[Any], uuids: Mapping[str, str], top: int) -> str | None:
    """Events (ledger.FileEvent) as rows of JSONEachRow of `chload.files`, one a line,
    byte for byte as ledger's `_encode` writes `Ledger._own_values` as a dict (the same
    keys in the same order, its separators, strings by the same escaping function, ints
    as `int` writes them), each mark raised by `top`, a table named by the uuid stamped
    for it in `uuids` unless its event names one; None when a value is not of its
    column's type (a str for a String, an int for a UInt64): `_encode` then. A format a
    row, the text the events of a run share written into it once, instead of the encoder
    walking a dict a row (a batch of many small files logs two events a file)."""
    if type(top) is not int or not {*map(type, chain.from_iterable(
            map(_int_values, events)))} <= {int}:
        return None
    q, rows = encode_basestring, []
    try:
        for shared, run in groupby(events, _shared_values):
            row = _row_format(shared, uuids)
            rows += [row % (q(e.uri), q(e.identity), e.size, e.mtime_ns, e.rows, e.bytes,
                            e.mark + top, e.seq) for e in run]
    except TypeError:  # (encode_basestring takes a str only)
        return None
    return "\n".join(rows)


def _row_format(shared: tuple, uuids: Mapping[str, str]) -> str:
    """A row of JSON with the `shared` values written in, the others left to fill."""
    values = dict(zip(_SHARED_FIELDS, shared, strict=True))
    if not values["table_uuid"]:
        values["table_uuid"] = uuids.get(values["target_table"], "")
    return "{" + ", ".join(
        f"{encode_basestring(name)}: " + (encode_basestring(values[name]).replace("%", "%%")
                                          if name in values else
                                          "%d" if name in _INT_FIELDS else "%s")
        for name in FILES_COLUMNS) + "}"
