"""The server target: a ClickHouse server over HTTP(S), as old as 18.16, exactly once.

    chload load 'data/*.csv.gz' --table trips --target http://loader@ch:8123/analytics
    CLICKHOUSE_PASSWORD=... chload load 'x/*.parquet' -t events --target https://ch:8443/db

At connect the server is asked what it can do (capabilities.py). Then, per file, the
fastest correct path into a fresh stage table `chload.stage_<machine>_<pid>_<id>`
(`CREATE TABLE ... AS <table>`, so its structure and keys are the table's):

- *raw*: the server parses the format and the compression (gzip CSV into 18.16): the
  file's bytes are posted as they are, with `Content-Encoding`, streamed from disk.
  Measured on 2 cores, 10M rows of gzip CSV into 18.16: 2.6 s of CPU in all, against
  2.8 s in chDB plus 1.7 s in the server when chDB parses and pushes Native.
- *push*: it cannot (Parquet, ORC, Avro, zstd/xz into 18.16; --audit columns, which the
  engine computes; or the server rejected the bytes, e.g. a CSV dialect 18.16 does not
  read): chDB in this process reads the file and streams `Native` (push.py),
  compressed with gzip when the server is not on this machine.

Then the stage is attached into the table under the commit lock (commit.py: the
exactly-once protocol and why it holds with several loader hosts), and the ledger says
`loaded`. The ledger is `chload.files` on the server, so any host can resume.

Retries: network errors, timeouts and transient server codes are `TransientError`s
(http.py), retried by the runner with backoff and jitter; the stage of a failed attempt
is dropped, so a retry starts clean. Bad data, unknown tables and bad credentials fail
at once, one line, with the server's own message. The password is never in a message,
the ledger, or `display`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial

from chload import rejects, sniff
from chload.capabilities import Capabilities, check_create, downgrade_ddl, probe, storable
from chload.engine import Engine
from chload.errors import (
    ChloadError,
    DataError,
    SchemaError,
    TransientError,
    UsageError,
)
from chload.ledger import DATABASE, FAILED, LOADED, FileEvent, Ledger, LoadedEvents
from chload.records import replace
from chload.rejects import ErrorBudget
from chload.schema import (
    AUDIT_COLUMNS,
    Column,
    display_table,
    header_columns,
    quote_ident,
    quote_str,
    settings_sql,
    split_table,
    structure,
)
from chload.sources import SourceFile, identity, table_function
from chload.targets import (
    BATCH_FILES,
    SMALL_FILE_BYTES,
    Loaded,
    LoadJob,
    group_small_files,
)
from chload.targets.commit import BatchOverlap, Committer, Sql, stage_name
from chload.targets.http import HttpClient, parse_target_url
from chload.targets.loader_rejects import LoaderRejects
from chload.targets.push import (
    PUSH_SETTINGS,
    push_error,
    push_sql,
    select_many_sql,
    select_sql,
    stream_push,
)
from chload.targets.vanished import check_present, explain_gone, open_listed, reading

RAW, PUSH = "raw", "push"
JSON_LINES = frozenset({"JSONEachRow", "JSONLines", "NDJSON"})
_NUMERIC = re.compile(r"^(Nullable\()?(U?Int\d+|Float\d+|Decimal.*)\)?$")
STAGING = 2  # files in flight beyond the streams, at least (see open_streams)
PART_BYTES = 128 << 20  # rows in memory per part the server writes for a stage ...
DEFAULT_PART_ROWS, MAX_PART_ROWS = 1 << 20, 1 << 26  # ... within these (server default)
_MERGE_TREE = ("MergeTree", "ReplacingMergeTree", "SummingMergeTree", "AggregatingMergeTree",
               "CollapsingMergeTree", "VersionedCollapsingMergeTree", "GraphiteMergeTree")


class ServerTarget:
    """A ClickHouse server; the ledger lives in its `chload` database."""

    def __init__(self, value: str) -> None:
        self.url = parse_target_url(value)
        self.database = self.url.database  # what a bare --table name means
        self.client = HttpClient(self.url)
        self.where = f"server {self.url.host}:{self.url.port}"
        self.caps: Capabilities = probe(lambda sql: self._ask(sql, "TSV"),
                                        self._accepts_encoding)
        self.display = f"ClickHouse {self.caps.version} at {self.url.display}"
        self.ledger = Ledger(self)
        if not {"files", "runs", "rejects", "files.table_uuid"} <= self.caps.ledger_tables:
            self.ledger.ensure()
            rejects.ensure(self)
        self.committer = Committer(Sql(self._command_id, self.rows), self.ledger)
        self.engine = Engine(None)  # chDB in memory, started on first use
        self.path = tempfile.mkdtemp(prefix="chload-server-")  # spooled stdin lives here
        self.loaded = LoadedEvents(self.ledger)
        self._engines: dict[str, str] = {}
        self._undropped: set[str] = set()
        self._started_ns = time.time_ns()  # files committed by other runs after this count
        self._reading = threading.local()
        self._streams = _Streams(8)  # data requests at once (above)
        self.rejects = LoaderRejects(self.engine, self._send)

    # -- SQL ---------------------------------------------------------------------------
    def command(self, sql: str) -> None:
        check_create(sql, self.caps)
        self.client.post(downgrade_ddl(sql, self.caps), context=self.where)

    def _command_id(self, sql: str, query_id: str) -> None:
        self.client.post(sql, context=self.where, query_id=query_id)

    def rows(self, sql: str) -> list[dict]:
        """Small results as dicts, 64-bit integers as numbers (as chDB gives them)."""
        text = self._ask(sql, "JSONEachRow", {"output_format_json_quote_64bit_integers": "0"})
        return [json.loads(line) for line in text.splitlines() if line]

    def _ask(self, sql: str, fmt: str, params: dict[str, str] | None = None) -> str:
        """chload's own query, answered as text.

        18.16 lists system.tables (and parts) by name and fails the whole query with
        "Table X doesn't exist" when X, any table of a listed database, is dropped
        meanwhile: another stream's stage, after its commit. Asked again, it answers.
        """
        attempt = 0
        while True:
            try:
                return self.client.post(sql, context=self.where, fmt=fmt,
                                        params=params).decode()
            except SchemaError as exc:
                if not _dropped_meanwhile(sql, str(exc)):
                    raise
                if attempt == _SYSTEM_RETRIES:
                    raise TransientError(str(exc)) from None
            time.sleep(0.01 * 2 ** attempt)
            attempt += 1

    def text(self, sql: str, fmt: str) -> str:
        """The user's SQL, in the URL's database; Pretty formats without ANSI colours
        (18.16 colours them by default, as chDB does not)."""
        params = {"output_format_pretty_color": "0"} if (
            "output_format_pretty_color" in self.caps.settings) else {}
        return self.client.post(sql, context="query", fmt=fmt, in_database=True,
                                params=params).decode()

    def infer_rows(self, sql: str) -> list[dict]:
        """Inference runs in chDB here; types come back as this server stores them (where
        that changes no value; CREATE TABLE refuses the rest in one line)."""
        rows = self.engine.rows(sql, getattr(self._reading, "uri", "schema inference"))
        if sql.lstrip().upper().startswith("DESCRIBE"):
            for row in rows:
                row["type"] = storable(row["type"], self.caps)
        return rows

    def reader(self, file: SourceFile, fmt: str, columns: Sequence[Column] | None) -> str:
        self._reading.uri = file.uri
        return table_function(file, fmt, structure(columns) if columns else None)

    def table_columns(self, table: str) -> list[Column] | None:
        """The table's columns (None: no such table); its engine is noted on the way."""
        database, name = split_table(table)
        where = f"database = {quote_str(database)} AND "
        rows = self.rows(f"SELECT name, type, default_kind, '' AS engine FROM system.columns "
                         f"WHERE {where}table = {quote_str(name)} UNION ALL SELECT '', '', "
                         f"'', engine FROM system.tables WHERE {where}name = {quote_str(name)}")
        for row in rows:
            if row["engine"]:
                self._engines[table] = row["engine"]
        return [Column(r["name"], r["type"], r["default_kind"]) for r in rows
                if not r["engine"]] or None

    def default_workers(self, files: Sequence[SourceFile]) -> int:
        return streams_for(len(files), self.caps.max_threads)

    def open_streams(self, streams: int) -> int:
        """Let `streams` data requests run at once; return how many files to keep in
        flight: as many again (at least STAGING), each with its stage created and
        waiting for a stream, so a stream that ends a file starts the next at once
        while the file it ended commits (a dozen small requests, 100 ms and more while
        the server is busy).

        Measured into 18.16 on 2 cores, 10 gzip CSV files of 1M rows, 5 streams: with
        2 files more in flight, two of the second round's files started 37 and 108 ms
        after their stream was free (their threads were still committing); with 5
        more, none waits."""
        self._streams = _Streams(streams)
        return streams + max(STAGING, streams)

    # -- loading -----------------------------------------------------------------------
    def load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> Loaded:
        self._check_engine(job)
        stage = stage_name(self.committer.holder)
        errors_file = (os.path.join(self.path, f"rejects-{stage}.csv")
                       if job.budget.allows_errors else "")
        try:
            job = identity.as_read(job)
            self._streams.stage_turn()
            self.command(f"CREATE TABLE {DATABASE}.{stage} AS {job.table}")
            read = self._budgeted(job, stage, errors_file) if errors_file else self._fill(
                job, stage)
            rows, partitions = self._seal(stage)
            identity.check_read(job)
            rejected = self.rejects.keep(job, stage, errors_file, rows) if errors_file else 0
        except ChloadError as exc:
            error = explain_gone(job.file, exc)
            if not isinstance(error, TransientError):
                self.ledger.record([_event(job, FAILED, error=str(error))])
            self._drop(stage)
            if error is exc:
                raise
            raise error from exc
        finally:
            if errors_file and os.path.exists(errors_file):
                os.remove(errors_file)
        progress(rows, read)
        event = _event(job, "", rows=rows, read=read)
        try:
            done = self.committer.commit(job.table, job.table_display, stage, partitions,
                                         [event], self._started_ns, job.follows)
        except TransientError:
            self._drop(stage)  # nothing was committed; the runner may try again
            raise
        if done:
            self.loaded.add([event.moved(LOADED)])
        self._drop(stage)
        return Loaded(rows, read, rejected) if done else Loaded(0, read, elsewhere=True)

    def _budgeted(self, job: LoadJob, stage: str, errors_file: str) -> int:
        """With an error budget the loader's engine parses (push): it skips bad rows
        within --max-errors and writes each to `errors_file` (loader_rejects.py); a
        server parsing the bytes itself could not say which rows it skipped."""
        try:
            return self._push(job, stage, extra=job.budget.engine_settings(errors_file))
        except DataError as exc:
            over = self.rejects.over_budget(job, errors_file)
            if over is None:
                raise
            raise over from exc

    def plan_batches(self, files: Sequence[SourceFile], budget: ErrorBudget,
                     workers: int) -> list[tuple[SourceFile, ...]]:
        """Group small files: one stage and one commit for up to 256 of them (16 MB),
        and at least as many groups as streams, so every stream has work.

        Large files load alone: a stage holding several would need its parts merged into
        one per partition before the attach (commit.py rule 2), a rewrite of the data.
        """
        if budget.allows_errors:
            return [(f,) for f in files]
        small = sum(f.size < SMALL_FILE_BYTES for f in files)
        per_stream = -(-small // max(1, workers))  # every stream gets work
        return group_small_files(files, min(BATCH_FILES, max(1, per_stream)))

    def load_batch(self, job: LoadJob, progress: Callable[[int, int], None]) -> list[Loaded]:
        """Several small files through one stage and one commit, each file's rows counted
        as it lands. Any failure before the commit raises, and the runner loads the files
        one by one; after the commit begins nothing is retried (rule 5 of commit.py makes
        a file-by-file retry of a batch that may have committed load nothing)."""
        self._check_engine(job)
        stage = stage_name(self.committer.holder)
        done: list[Loaded] = []
        try:
            job = identity.as_read(job)
            self._streams.stage_turn()
            self.command(f"CREATE TABLE {DATABASE}.{stage} AS {job.table}")
            if self._gathers(job):
                done = self._gather(job, stage)
            else:
                total = 0
                for f in job.files:
                    read = self._fill(replace(job, file=f, batch=()), stage, fallback=False)
                    now = int(self.rows(f"SELECT count() AS n FROM {DATABASE}.{stage}")[0]["n"])
                    done.append(Loaded(now - total, read))
                    total = now
            rows, partitions = self._seal(stage)
            identity.check_read(job)
        except ChloadError:
            self._drop(stage)
            raise
        progress(rows, sum(d.bytes for d in done))
        events = [_event(replace(job, file=f), "", rows=d.rows, read=d.bytes)
                  for f, d in zip(job.files, done, strict=True)]
        try:
            committed = self.committer.commit(job.table, job.table_display, stage, partitions,
                                              events, self._started_ns, job.follows)
        except TransientError:
            self._drop(stage)
            raise
        if not committed:
            self._drop(stage)
            raise BatchOverlap(f"{job.file.uri}: another load committed some files of this "
                               "batch meanwhile; loading them one by one")
        self.loaded.add(e.moved(LOADED) for e in events)
        self._drop(stage)
        return done

    def path_for(self, job: LoadJob) -> str:
        """raw when the server reads the bytes as they are; else push through chDB."""
        f = job.file
        if self.url.path == PUSH:  # ?path=push in the target URL
            return PUSH
        known = all(name in self.caps.settings for name, _ in job.settings)
        if (not job.audit and f.local_path and known and self.caps.parses(f.format.name)
                and self.caps.accepts(f.format.compression)):
            return RAW
        return PUSH

    def _fill(self, job: LoadJob, stage: str, fallback: bool = True) -> int:
        """Fill the stage; return the bytes read from the source."""
        if self.path_for(job) == RAW:
            try:
                return self._post_raw(job, stage)
            except DataError:
                if not fallback:
                    raise
                # 18.16 reads fewer dialects than chDB: let the loader's engine try.
                self.command(f"TRUNCATE TABLE {DATABASE}.{stage}")
        return self._push(job, stage)

    def _post_raw(self, job: LoadJob, stage: str) -> int:
        f = job.file
        assert f.local_path is not None
        names = ", ".join(quote_ident(name) for name in _raw_names(job))
        headers = {}
        if f.format.compression != "none":
            headers["Content-Encoding"] = f.format.compression
        params = {"max_insert_block_size": str(self._part_rows(job)), **dict(job.settings)}
        with os.fdopen(open_listed(f), "rb") as body:
            if not f.size:  # no rows to post (and sendfile refuses a length of 0)
                return 0
            with self._streams.data():
                self.client.request(f"INSERT INTO {DATABASE}.{stage} ({names}) FORMAT "
                                    f"{f.format.name}", body, length=f.size,
                                    headers=headers, params=params, context=f.uri)
        return f.size

    def _part_rows(self, job: LoadJob) -> int:
        """Rows per part the server writes: one part per file up to ~128 MB of rows in
        memory, so most stages need no merge before the attach (commit.py rule 2)."""
        width = sum(_width(c.type) for c in job.columns) + (64 if job.audit else 0)
        return max(DEFAULT_PART_ROWS, min(MAX_PART_ROWS, PART_BYTES // max(1, width)))

    def _gathers(self, job: LoadJob) -> bool:
        """Gather a batch in the loader's engine (below) when it would push anyway, and
        for JSON lines with other than numeric columns. Measured into 18.16 on 2 cores:
        200 files of stream snapshots (strings, dates, an array): 18.16 spent 6 s of CPU
        parsing 600,000 rows, chDB gathering 2.4-3.1 s in all against 6.6-7.9 s a
        request per file. Numbers only (4M trips rows in 16 files): a request per file
        1.45 s, gathered 1.9-2.4 s; gzip CSV likewise (raw 0.94-1.0 s, gathered 1.7 s)."""
        if self.path_for(job) == PUSH:
            return True
        return (job.file.format.name in JSON_LINES
                and not all(_NUMERIC.match(c.type) for c in job.columns))

    def _gather(self, job: LoadJob, stage: str) -> list[Loaded]:
        """A batch of small files through the loader's engine: one query reads every file
        into a Memory table that keeps each row's file (exact rows per file), then one
        Native stream fills the stage. The stage gets one part and needs no merge; a
        request per file made a part per file, merged before the attach (measured into
        18.16: 200 gzip JSON files of 3,000 rows, 6.6-7.9 s one request per file)."""
        columns, audit = self._push_columns(job)
        memory = f"chload_batch_{os.urandom(6).hex()}"
        context = f"batch of {len(job.files)} files from {job.file.uri}"
        union = select_many_sql(job.files, job.columns, job.read_columns, audit,
                                "_chload_file") or " UNION ALL ".join(
            f"SELECT *, {quote_str(f.uri)} AS _chload_file FROM "
            f"({select_sql(f, job.columns, job.read_columns, audit)})" for f in job.files)
        self.engine.query(f"CREATE TABLE {memory} ({structure(columns)}, _chload_file String) "
                          "ENGINE = Memory", "TSV", context)
        try:
            self.engine.execute(f"INSERT INTO {memory} {union} SETTINGS "
                                f"{settings_sql(self._push_settings(job))}", context)
            counts = {r["f"]: int(r["n"]) for r in self.engine.rows(
                f"SELECT _chload_file AS f, count() AS n FROM {memory} GROUP BY f", context)}
            check_present(job.files, counts, reading(self.engine, self.reader, job.read_columns))
            names = ", ".join(quote_ident(c.name) for c in columns)
            self._push(job, stage, f"SELECT {names} FROM {memory}")
        finally:
            self.engine.query(f"DROP TABLE IF EXISTS {memory}", "TSV", context)
        return [Loaded(counts.get(f.uri, 0), f.size) for f in job.files]


    def _push_columns(self, job: LoadJob) -> tuple[list[Column], dict[str, str] | None]:
        """The stage's columns a push fills, with the audit columns' types (if any)."""
        columns = list(job.columns)
        audit = None
        if job.audit:
            table = {c.name: c.type for c in self.table_columns(job.table) or []}
            audit = {name: table.get(name, typ) for name, typ in AUDIT_COLUMNS.items()}
            columns += [Column(n, t) for n, t in audit.items()]
        return columns, audit

    def _push_settings(self, job: LoadJob, extra: Sequence[tuple[str, str]] = (),
                       ) -> tuple[tuple[str, str], ...]:
        """The loader's settings for a push; `extra` before the user's, which win."""
        return (*PUSH_SETTINGS, ("session_timezone", self.caps.timezone), *extra,
                *job.settings)

    def _push(self, job: LoadJob, stage: str, select: str | None = None,
              extra: Sequence[tuple[str, str]] = ()) -> int:
        """Fill the stage through the loader's engine: `select` (default: the file's
        rows, cast to the table's types) as one Native stream; `extra` settings for the
        loader's read (before the user's --setting values, which win)."""
        columns, audit = self._push_columns(job)
        names = ", ".join(quote_ident(c.name) for c in columns)
        insert = f"INSERT INTO {DATABASE}.{stage} ({names}) FORMAT Native"
        squash = {"min_insert_block_size_rows": str(self._part_rows(job)),
                  "min_insert_block_size_bytes": str(PART_BYTES)}
        select = select or select_sql(job.file, job.columns, job.read_columns, audit)
        read = self._send(insert, columns, select, self._push_settings(job, extra),
                          job.file.uri, squash)
        return read or job.file.size

    def _send(self, insert: str, columns: Sequence[Column], select: str,
              settings: Sequence[tuple[str, str]], context: str,
              squash: dict[str, str] | None = None) -> int:
        """The loader's engine runs `select` and the server `insert` (FORMAT Native) on
        its rows: through chDB's url() over http, through our own client over https.
        Returns the bytes the engine read from storage, where it says (0 otherwise)."""
        with self._streams.data():
            if self.url.secure:
                stream_push(self.engine, self.client, insert, select, settings, context,
                            squash)
                return 0
            sql = push_sql(self.url, insert, columns, select, self._push_encoding(),
                           settings, squash)
            errors = partial(push_error, context=context, url=self.url)
            return self.engine.execute(sql, context, errors)[1]

    def _push_encoding(self) -> str:
        """No compression on this machine (CPU is the limit); gzip over a network."""
        if self.url.is_loopback or not self.caps.accepts("gzip"):
            return "none"
        return "gzip"

    def _seal(self, stage: str) -> tuple[int, list[str]]:
        """Rows in the stage and its partitions, each merged to one part (commit.py rule 2)."""
        for _ in range(5):
            rows = self.rows(f"SELECT partition_id, count() AS parts, sum(rows) AS rows FROM "
                             f"system.parts WHERE active AND database = '{DATABASE}' AND "
                             f"table = {quote_str(stage)} GROUP BY partition_id")
            split = [r["partition_id"] for r in rows if int(r["parts"]) > 1]
            if not split:
                return sum(int(r["rows"]) for r in rows), sorted(r["partition_id"] for r in rows)
            for partition in split:
                self.client.post(f"OPTIMIZE TABLE {DATABASE}.{stage} PARTITION ID "
                                 f"{quote_str(partition)} FINAL", context=self.where,
                                 params={"optimize_throw_if_noop": "1"})
        raise TransientError(f"stage {stage}: could not merge its parts to one per partition")

    def _check_engine(self, job: LoadJob) -> None:
        engine = self._engines.get(job.table)
        if engine is None:
            database, name = split_table(job.table)
            found = self.rows(f"SELECT engine FROM system.tables WHERE database = "
                              f"{quote_str(database)} AND name = {quote_str(name)}")
            engine = self._engines[job.table] = found[0]["engine"] if found else ""
        if engine.startswith("Replicated"):
            raise UsageError(f"table {job.table_display} is {engine}: load replicated tables "
                             "through a cluster target (not built yet)")
        if engine not in _MERGE_TREE:
            raise SchemaError(f"table {job.table_display} has engine {engine or '?'}: chload "
                              "loads exactly once only into MergeTree-family tables (it "
                              "attaches whole partitions); load into a MergeTree table")

    def _accepts_encoding(self, method: str, body: bytes) -> bool:
        self.client.request(None, body, context=self.where,
                            headers={"Content-Encoding": method})
        return True

    def _drop(self, stage: str) -> None:
        """Drop a stage; one the server did not drop now (it is down) is tried at close."""
        try:
            self.command(f"DROP TABLE IF EXISTS {DATABASE}.{stage}")
            self._undropped.discard(stage)
        except ChloadError:
            self._undropped.add(stage)

    # -- ledger ------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the `loaded` events still waiting (ledger.LoadedEvents)."""
        self.loaded.flush()

    def recover(self, table: str) -> int:
        return self.committer.start(table, display_table(table))

    def close(self) -> None:
        try:
            self.flush()
            for stage in list(self._undropped):
                self._drop(stage)
        finally:
            self.engine.close()
            self.client.close()
            shutil.rmtree(self.path, ignore_errors=True)


def _raw_names(job: LoadJob) -> list[str]:
    """The columns a posted file fills, in the file's order: its header's, as a server
    as old as 18.16 reads a header's columns by position (the planner checked they are
    the table's), else the run's."""
    fields = sniff.header_names(job.file) if job.file.format.has_header else None
    return header_columns(fields) if fields else [c.name for c in job.columns]


_WIDTHS = {"UInt8": 1, "Int8": 1, "Enum8": 1, "UInt16": 2, "Int16": 2, "Enum16": 2, "Date": 2,
           "UInt32": 4, "Int32": 4, "Float32": 4, "DateTime": 4, "Decimal32": 4, "UInt64": 8,
           "Int64": 8, "Float64": 8, "Decimal64": 8, "UUID": 16, "Decimal128": 16}


def _width(typ: str) -> int:
    """Bytes a value takes in memory, roughly (strings and arrays: 64)."""
    nullable = typ.startswith("Nullable(")
    inner = typ[len("Nullable("):-1] if nullable else typ
    family = inner.split("(", 1)[0]
    if family == "Decimal":
        digits = int((inner.split("(", 1)[1].split(",")[0] or "38").strip() or 38)
        size = 4 if digits <= 9 else 8 if digits <= 18 else 16
    elif family == "FixedString":
        size = int(inner[len("FixedString("):-1] or 16)
    else:
        size = _WIDTHS.get(family, 64)
    return size + nullable


_SYSTEM_RETRIES = 5
_MISSING_TABLE = re.compile(r"Table (\S+?)\.? doesn't exist")


def _dropped_meanwhile(sql: str, message: str) -> bool:
    """A query over system tables failed because a table it does not name was dropped
    while the server listed them (see ServerTarget._ask)."""
    missing = _MISSING_TABLE.search(message)
    if "system." not in sql or missing is None:
        return False
    name = missing.group(1).replace("`", "").rpartition(".")[2]
    return f"'{name}'" not in sql


def _event(job: LoadJob, state: str, rows: int = 0, read: int = 0,
           error: str = "") -> FileEvent:
    f = job.file
    return FileEvent(job.table_display, f.uri, f.identity, f.size, f.mtime_ns, state,
                     rows, read, error, job.run_id)


class _Streams:
    """Data requests at once, and when the files beyond them create their stages.

    Those files (STAGING) wait until every stream has begun its first request, at most a
    second: 18.16 runs DDL one statement at a time, and at the start of a load 7 stage
    CREATEs at once took 13-48 ms each on a busy machine, so the last stream began 30 ms
    after the first, behind stages that would wait for a stream anyway.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._slots = threading.BoundedSemaphore(count)
        self._lock = threading.Lock()
        self._tickets = self._begun = 0
        self._all_begun = threading.Event()

    def stage_turn(self) -> None:
        with self._lock:
            ticket, self._tickets = self._tickets, self._tickets + 1
        if ticket >= self.count:
            self._all_begun.wait(1.0)

    @contextlib.contextmanager
    def data(self) -> Iterator[None]:
        with self._slots:
            with self._lock:
                self._begun += 1
                if self._begun >= self.count:
                    self._all_begun.set()
            yield


def streams_for(files: int, cores: int) -> int:
    """Data requests at once into a server with `cores` (its max_threads).

    A server parses one INSERT on one thread, and each waits at times on its disk or its
    client, so a server takes more streams than it has cores: curl posting 10 gzip CSV
    files into 18.16 on 2 cores was 1.08x as fast 4 at a time as 2 at a time, 1.10x 5 at
    a time, 1.09-1.17x all 10 at once. Up to 4 per core and 8 in all (more adds server
    memory: each INSERT holds a block), spread evenly over the rounds the files need:
    10 files go 5 and 5, not 8 and then 2 on a half-idle server.
    """
    cap = max(1, min(8, 4 * cores))
    rounds = max(1, -(-files // cap))
    return max(1, -(-files // rounds))
