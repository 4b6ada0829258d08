"""The file ledger and the run history: tables in the target, next to the data.

State lives with the data: any host can resume a load and anyone can inspect it with SQL.
Invariants: the ledger is an append-only event log, a unit's state its latest event
(`argMax(..., seq)`): a transition is one INSERT, never an UPDATE or DELETE; the SQL here
runs unchanged on chDB 26 and on a ClickHouse 18.16 server (no DateTime64, no lightweight
DELETE, no Nullable keys); `committing` carries the stage and the `mark` that settle a
crash (commit/committer.py), so `loaded` events may wait and go in batches
(`LoadedEvents`); events name their table by `table_uuid` where the engine has one, and
events under another uuid are another table's history (`TableState`,
planner.own_history). The states and why: docs/architecture.md ("The ledger's shape").
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from operator import attrgetter
from typing import Protocol

from chload.commit.known import (
    SUMMARY,
    KnownUnits,
    backfill_statement,
    rebuild_statements,
    summary_check,
    summary_statements,
)

# (the names others import from here, kept: the tables and states are the ledger's)
from chload.commit.tables import (
    ADDED,
    ADDED_COLUMNS as ADDED_COLUMNS,
    COMMITTING as COMMITTING,
    DATABASE as DATABASE,
    DUPLICATE_COLUMN,
    FAILED as FAILED,
    FILES as FILES,
    FILES_COLUMNS,
    LEDGER_TABLES as LEDGER_TABLES,
    LOADED as LOADED,
    LOADING as LOADING,
    NO_UNIT,
    RUNS as RUNS,
    SWAP_ABANDONED as SWAP_ABANDONED,
    SWAPPING as SWAPPING,
    TABLE_REPLACED as TABLE_REPLACED,
    create_statements as create_statements,
    json_rows,
    known_sql,
    loaded_where,
    rows_sql,
    slices,
)
from chload.errors import ChloadError, EngineError
from chload.schema import quote_str

# Events logged with their mark in one statement (INSERT ... SELECT, one arm per event),
# at most: 18.16 plans a UNION ALL of many arms slowly, under the commit lock; more
# are appended after reading the mark first. A raw load's groups (a file a stage, at
# most a stage per stream: 8) stay inline.
_INLINE_EVENTS = 8
# One encoder for every row (json.dumps with an option builds an encoder a call: a batch
# of many small files writes two events a file)
_encode = json.JSONEncoder(ensure_ascii=False).encode
_INLINE_BYTES = 128 << 10  # and never a statement near the server's max_query_size (256 KiB)


class Sql(Protocol):
    """The two things the ledger's writes need from a target: run a statement, read rows."""

    def command(self, sql: str) -> None: ...

    def rows(self, sql: str) -> list[dict]: ...


class LedgerSql(Sql, Protocol):
    """And its reads: a long answer as bytes (the keys of the units a table holds:
    `Ledger.known`)."""

    def binary(self, sql: str, fmt: str) -> bytes: ...


@dataclass(slots=True)
class FileEvent:
    """One transition of one file, as stored in `chload.files`."""

    target_table: str
    uri: str
    identity: str
    size: int
    mtime_ns: int
    state: str
    rows: int = 0
    bytes: int = 0
    error: str = ""
    run_id: str = ""
    stage: str = ""
    mark: int = 0
    seq: int = field(default_factory=time.time_ns)
    table_uuid: str = ""  # the target table's uuid when the event was written ('' unknown)
    # --mode replace-partitions: the partition ids this commit replaces (comma-separated;
    # the stage's others are attached): commit/attach.py; a swap's marker: commit/swap.py
    replaced: str = ""

    def moved(self, state: str, error: str = "") -> FileEvent:
        """The same file in a later state (a new event, with its own sequence number)."""
        return FileEvent(self.target_table, self.uri, self.identity, self.size, self.mtime_ns,
                         state, self.rows, self.bytes, error, self.run_id, self.stage,
                         self.mark, time.time_ns(), self.table_uuid, self.replaced)


def moved(events: Iterable[FileEvent], state: str) -> list[FileEvent]:
    """`FileEvent.moved(state)` of each event, in one pass (a batch's `loaded` events:
    one a file)."""
    now = time.time_ns
    return [FileEvent(e.target_table, e.uri, e.identity, e.size, e.mtime_ns, state, e.rows,
                      e.bytes, "", e.run_id, e.stage, e.mark, now(), e.table_uuid, e.replaced)
            for e in events]


@dataclass(slots=True)
class RunRecord:
    """One run of `chload load`, as stored in `chload.runs` (the load history)."""

    run_id: str
    target_table: str
    sources: str
    started_ns: int
    finished_ns: int
    files_total: int
    files_loaded: int
    files_skipped: int
    files_failed: int
    rows_loaded: int
    rows_rejected: int
    bytes_read: int
    seconds: float
    status: str
    host: str
    concurrency: str = ""  # JSON: streams at start and end, each change and why (adaptive.py)
    schema_changes: str = ""  # JSON: the columns the run added (core/evolve.py Change)


@dataclass(frozen=True, slots=True)
class TableState:
    """A target table as it is now, to tell whether the ledger's loads are its own."""

    exists: bool
    uuid: str = ""  # '' where the engine has none (18.16: Ordinary databases)
    rows: int = 0  # in its active parts


class Ledger:
    """Reads and appends file events and run records in the target."""

    def __init__(self, sql: LedgerSql) -> None:
        self._sql = sql
        self._uuids: dict[str, str] = {}  # target_table -> uuid, stamped on events

    def complete(self) -> bool:
        """Whether every table (and column) `ensure` and rejects.ensure make is there: one
        query instead of their five statements."""
        present = {r["name"] for r in self._sql.rows(
            f"SELECT name FROM system.tables WHERE database = '{DATABASE}' UNION ALL "
            "SELECT concat(table, '.', name) FROM system.columns WHERE database = "
            f"'{DATABASE}' AND {ADDED_COLUMNS}")}
        return LEDGER_TABLES <= present

    def ensure(self) -> None:
        """Make what is missing; a ledger made before its summary (known.py) gets it with
        its events, so its first run reads the summary, not the events grouped."""
        had = bool(self._sql.rows(f"SELECT name FROM system.tables WHERE database = "
                                  f"'{DATABASE}' AND name = '{SUMMARY}'"))
        summary = summary_statements(DATABASE)
        for statement in create_statements()[:-len(summary)]:
            self._sql.command(statement)
        self._add_columns()  # (before the view, which reads them)
        for statement in summary:
            self._sql.command(statement)
        if not had:
            self._sql.command(backfill_statement(DATABASE))
            self.sliced()

    def _add_columns(self) -> None:
        """A ledger made before events carried `table_uuid`, runs their `concurrency`,
        or events their keys (KEY_COLUMNS), gets the column (18.16 has no ADD COLUMN IF
        NOT EXISTS: ask first, one query for all; two chloads may both add one)."""
        have = {(r["table"], r["name"]) for r in self._sql.rows(
            f"SELECT table, name FROM system.columns WHERE database = '{DATABASE}' AND "
            f"{ADDED_COLUMNS}")}
        for table, column in sorted(set(ADDED) - have):
            try:
                self._sql.command(f"ALTER TABLE {DATABASE}.{table} ADD COLUMN {column} "
                                  f"{ADDED[table, column]}")
            except EngineError as exc:
                if exc.code not in DUPLICATE_COLUMN:
                    raise

    def table_state(self, database: str, name: str) -> TableState:
        """Whether the table exists, its uuid (chDB: also from its data path, as the
        `default` database there reports none) and the rows it holds, in one query."""
        where = f"database = {quote_str(database)} AND table = {quote_str(name)}"
        rows = self._sql.rows(
            f"SELECT (SELECT toUInt64(sum(rows)) FROM system.parts WHERE active AND {where})"
            f" AS _chload_rows, * FROM system.tables WHERE database = {quote_str(database)} "
            f"AND name = {quote_str(name)}")
        if not rows:
            return TableState(False)
        row = rows[0]
        uuid = str(row.get("uuid") or "")
        if not uuid.strip("0-"):
            found = _STORE_UUID.search(str(row.get("data_paths") or ""))
            uuid = found.group(1) if found else ""
        return TableState(True, uuid, int(row["_chload_rows"] or 0))

    def stamp(self, target_table: str, uuid: str) -> None:
        """Events recorded from now on for `target_table` name the table by `uuid`."""
        self._uuids[target_table] = uuid

    def record(self, events: Sequence[FileEvent],
               mark_of: tuple[str, str] | None = None) -> None:
        """Append events. With `mark_of` (database, table), each event's `mark` is that
        table's highest block number plus the event's own `mark` (an offset: 0, or a
        group commit's parts attached before it). The caller holds the table's commit
        lock, so no attach comes between reading the mark and logging it: a few events
        read it in the statement that appends them, more read it first (_INLINE_EVENTS)."""
        if not events:
            return
        if mark_of is None:
            self._insert_events(events)
            return
        database, table = mark_of
        tuples = "" if len(events) > _INLINE_EVENTS else ", ".join(
            "(" + ", ".join(_literal(v) for v in self._own_values(e)) + ")" for e in events)
        if len(events) > _INLINE_EVENTS or len(tuples) > _INLINE_BYTES:  # read the mark,
            # then append (the caller holds the commit lock)
            top = int(self._sql.rows(f"SELECT (SELECT toUInt64(max(max_block_number)) FROM "
                                     f"system.parts WHERE active AND database = "
                                     f"{quote_str(database)} AND table = "
                                     f"{quote_str(table)}) AS mark")[0]["mark"])
            self._insert_events(events, top)
            return
        # One scan of system.parts for the whole group, the events ARRAY JOINed to it:
        # a UNION ALL of a SELECT per event, each with its own scalar subquery, costs
        # 18.16 about twice the CPU (a group's log, under the lock)
        values = ", ".join(f"m + e.{i}" if k == "mark" else f"e.{i}"
                           for i, k in enumerate(_EVENT_FIELDS, start=1))
        columns = ", ".join(f.name for f in fields(FileEvent))
        self._sql.command(
            f"INSERT INTO {FILES} ({columns}) SELECT {values} FROM (SELECT toUInt64(max("
            f"max_block_number)) AS m FROM system.parts WHERE active AND database = "
            f"{quote_str(database)} AND table = {quote_str(table)}) ARRAY JOIN [{tuples}] "
            "AS e")

    def _own_values(self, event: FileEvent) -> tuple:
        """The event's values in column order, naming its table by the uuid stamped
        (unless it does)."""
        values = _event_values(event)
        if values[_UUID]:
            return values
        return (*values[:_UUID], self._uuids.get(event.target_table, ""),
                *values[_UUID + 1:])

    def _insert_events(self, events: Sequence[FileEvent], top: int | None = None) -> None:
        """Append events as they are (each naming its table: `_own_values`), their marks
        raised by `top`: rows of JSON as one encoder would write them (tables.json_rows)."""
        body = json_rows(events, self._uuids, top or 0)
        if body is None:  # (a value of another type than its column's: as json writes it)
            rows = [dict(zip(_EVENT_FIELDS, self._own_values(e), strict=True))
                    for e in events]
            for row in rows if top is not None else ():
                row["mark"] += top
            body = "\n".join(_encode(r) for r in rows)
        self._sql.command(f"INSERT INTO {FILES} FORMAT JSONEachRow\n{body}\n")

    def record_run(self, run: RunRecord) -> None:
        self._insert(RUNS, [asdict(run)])

    def _insert(self, table: str, rows: Iterable[dict]) -> None:
        body = "\n".join(_encode(r) for r in rows)
        self._sql.command(f"INSERT INTO {table} FORMAT JSONEachRow\n{body}\n")

    def latest(self, target_table: str, states: Sequence[str] | None = None) -> list[FileEvent]:
        """Each file's latest event for a table (optionally only those in `states`)."""
        having = ""
        if states:
            having = f"HAVING last_state IN ({', '.join(quote_str(s) for s in states)})"
        return self._latest(f"target_table = {quote_str(target_table)} AND {NO_UNIT}",
                            having)

    def of_run(self, run_id: str) -> list[FileEvent]:
        """The last event of each file that one run touched."""
        return self._latest(f"run_id = {quote_str(run_id)} AND {NO_UNIT}")

    def _latest(self, where: str, having: str = "") -> list[FileEvent]:
        fields = ", ".join(f"argMax({f}, seq) AS last_{f}" for f in _LATEST_FIELDS)
        rows = self._sql.rows(
            f"SELECT target_table, uri, {fields}, max(seq) AS last_seq FROM {FILES} "
            f"WHERE {where} GROUP BY target_table, uri {having} ORDER BY uri"
        )
        return [_event(r) for r in rows]

    def loaded(self, target_table: str) -> dict[str, FileEvent]:
        """uri -> the latest `loaded` event of every file ever loaded into the table,
        whatever came after it: a `--force` reload that failed leaves the rows of the
        load before it in the table."""
        return {e.uri: e for e in self._latest(
            f"{loaded_where(target_table)}")}

    def known(self, target_table: str, table: TableState) -> tuple[KnownUnits, str]:
        """The units loaded into the table as it is now, as compact keys (known.py), and
        why the ledger's other loads are not the table's ('' when all are): the rules of
        `own_history`, applied by the engine, so no event is held in Python.

        Read from the ledger's summary (known.py: one range of an ordered table) once it
        sums to the ledger, rebuilt for the table first when it does not; from the
        ledger itself while it still does not. The keys come in slices of the key space,
        each at most KNOWN_SLICE units, so the engine's memory for the grouping is
        bounded too (the embedded engine's is this process's)."""
        literal = quote_str(target_table)
        count, whole = self.summed(target_table)
        if not count:
            return KnownUnits(), ""
        if not table.exists:
            return KnownUnits(), DROPPED
        if not whole:
            for statement in rebuild_statements(DATABASE, literal):
                self._sql.command(statement)
            self.sliced()
            count, whole = self.summed(target_table)
        uris, identities = array("Q"), array("Q")
        for lo, hi in slices(count):
            # RowBinary: 16 bytes a unit, no text to parse or decode; a slice's pairs
            # split as they come, so the whole answer is never held twice
            answer = self._sql.binary(known_sql(literal, table.uuid, whole, lo, hi),
                                      "RowBinary")
            self.sliced()  # (the engine's memory for the slice given back before the split)
            pairs = array("Q", answer)
            del answer
            if sys.byteorder != "little":  # (RowBinary is little-endian)
                pairs.byteswap()
            uris.extend(pairs[0::2])
            identities.extend(pairs[1::2])
            del pairs
        known = KnownUnits(uris, identities, lambda uris: self.loaded_of(target_table, uris))
        if not known:
            return known, RECREATED
        if table.rows == 0 and int(self._sql.rows(rows_sql(literal, table.uuid, whole)
                                                  )[0]["r"] or 0):
            return KnownUnits(), TRUNCATED
        return known, ""

    def loaded_since(self, target_table: str, table: TableState, since_ns: int,
                     own_run: str, own_since_ns: int) -> array | None:
        """The keys (known.py: uri's, identity's, in pairs, in the order of the uri's) of
        each unit committed into the table as it is now (`known`'s rules) after
        `since_ns`: its latest `committing` or `loaded` event since then (a `committing`
        one is written under the commit lock before the attach, at once, where `loaded`
        may wait: committer.py rule 1), less those whose latest is run `own_run`'s from
        before `own_since_ns` (a run that asked then has them): what a following run
        learns between two polls (core/follow.py). None where the answer is not this
        ledger's to give (a cluster's shards each keep their own)."""
        pairs = array("Q", self._sql.binary(
            f"SELECT uri_key AS u, argMax(identity_key, seq) AS i FROM {FILES} PREWHERE seq > "
            f"{int(since_ns)} WHERE target_table = {quote_str(target_table)} AND state IN "
            f"('{COMMITTING}', '{LOADED}') GROUP BY u HAVING argMax(table_uuid IN "
            f"('', {quote_str(table.uuid)}), seq) AND (max(seq) > {int(own_since_ns)} OR "
            f"argMax(run_id, seq) != {quote_str(own_run)}) ORDER BY u", "RowBinary"))
        if sys.byteorder != "little":  # (RowBinary is little-endian)
            pairs.byteswap()
        return pairs

    def summed(self, target_table: str) -> tuple[int, bool]:
        """How many `loaded` events the ledger holds for a table, and whether its summary
        holds every event of the table (known.summary_check): Ledger.known's first
        question, asked ahead on a server (server/early.py)."""
        rows = {r["s"]: r for r in self._sql.rows(summary_check(DATABASE,
                                                                quote_str(target_table)))}
        files, summary = rows.get("files", {}), rows.get(SUMMARY, {})
        whole = all(str(files.get(k)) == str(summary.get(k)) for k in ("n", "loaded", "h"))
        return int(files.get("loaded") or 0), whole

    def sliced(self) -> None:
        """After each slice of `known`: an engine in this process gives back what its
        grouping kept (embedded/target.py); nothing for a server."""

    def last_loaded(self, target_table: str, table: TableState, prefix: str) -> str:
        """The greatest uri beginning with `prefix` loaded into the table as it is now
        (own_history's rules: '' when the table is gone or empty, loads under another
        uuid set aside); '' if none."""
        if not table.exists or table.rows == 0:
            return ""
        rows = self._sql.rows(
            f"SELECT max(uri) AS last FROM {FILES} WHERE {loaded_where(target_table)} AND "
            f"uri >= {quote_str(prefix)}"
            f" AND substring(uri, 1, {len(prefix.encode())}) = {quote_str(prefix)} AND "
            f"table_uuid IN ('', {quote_str(table.uuid)})")
        return str(rows[0]["last"] or "") if rows else ""

    def loaded_of(self, target_table: str, uris: list[str]) -> dict[str, FileEvent]:
        """uri -> the latest `loaded` event of each of `uris` (as `loaded`), in
        statements well under a server's max_query_size."""
        found: dict[str, FileEvent] = {}
        for i in range(0, len(uris), 500):
            listed = ", ".join(quote_str(u) for u in uris[i:i + 500])
            found.update((e.uri, e) for e in self._latest(
                f"{loaded_where(target_table)} AND "
                f"uri IN ({listed})"))
        return found

    def loaded_identities(self, target_table: str) -> dict[str, str]:
        """uri -> identity of every file loaded into the table (see `loaded`)."""
        return {uri: e.identity for uri, e in self.loaded(target_table).items()}

    def runs(self, target_table: str | None, limit: int = 50) -> list[dict]:
        where = f"WHERE target_table = {quote_str(target_table)}" if target_table else ""
        return self._sql.rows(
            f"SELECT * FROM {RUNS} {where} ORDER BY started_ns DESC LIMIT {int(limit)}"
        )


class LoadedEvents:
    """`loaded` events waiting to be written: every second or so, and at flush().

    After a commit, `committing` (with the stage and mark) already settles a crash
    (commit/committer.py), so `loaded` may wait and share one INSERT with others; on a
    server that is a round trip less per file. `add` never raises: the file is
    committed, and an error here must not make the runner load it again (events that
    could not be written are tried again by the next write).
    """

    def __init__(self, ledger: Ledger, every: float = 1.0) -> None:
        self.ledger, self.every = ledger, every
        self._events: list[FileEvent] = []
        self._guard = threading.Lock()
        self._written = time.monotonic()

    def add(self, events: Iterable[FileEvent]) -> None:
        with self._guard:
            self._events.extend(events)
            due = time.monotonic() - self._written > self.every
        if due:
            with contextlib.suppress(ChloadError):
                self.flush()

    def flush(self) -> None:
        """Write every waiting event; on an error they wait for the next write."""
        with self._guard:
            events, self._events = self._events, []
            self._written = time.monotonic()
        try:
            self.ledger.record(events)
        except ChloadError:
            with self._guard:
                self._events[:0] = events
            raise


_EVENT_FIELDS = tuple(f.name for f in fields(FileEvent))
_event_values = attrgetter(*_EVENT_FIELDS)
_UUID = _EVENT_FIELDS.index("table_uuid")
assert _EVENT_FIELDS == FILES_COLUMNS  # (tables.json_rows writes an event's in this order)


def _literal(value: object) -> str:
    """A ledger value as SQL: one type per column in every row of a UNION ALL."""
    return f"toUInt64({value})" if isinstance(value, int) else quote_str(str(value))


_LATEST_FIELDS = ("identity", "size", "mtime_ns", "state", "rows", "bytes", "error", "run_id",
                  "stage", "mark", "table_uuid", "replaced")
_STORE_UUID = re.compile(r"/store/[0-9a-f]{3}/([0-9a-f]{8}-[0-9a-f-]{27})/")
_INTS = {"size", "mtime_ns", "rows", "bytes", "mark", "seq"}


def _event(row: dict) -> FileEvent:
    values = {k.removeprefix("last_"): v for k, v in row.items()}
    return FileEvent(**{k: int(v) if k in _INTS else v for k, v in values.items()})  # type: ignore[arg-type]


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
        return {}, DROPPED
    own = {uri: e for uri, e in loaded.items() if e.table_uuid in ("", table.uuid)}
    if not own:
        return own, RECREATED
    if table.rows == 0 and any(e.rows for e in own.values()):
        return {}, TRUNCATED
    return own, ""


# Why the ledger's loads are not the table's (own_history, Ledger.known)
DROPPED = "table was dropped since the last load: loading all files again"
RECREATED = "table was re-created since the last load: loading all files again"
TRUNCATED = ("table holds no rows (truncated or re-created since the last load): loading "
             "all files again")
