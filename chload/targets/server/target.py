"""The server target: a ClickHouse server over HTTP(S), as old as 18.16, exactly once.

At connect the server is asked what it can do (capabilities.py; early, server/early.py).
Per unit, the fastest correct path into a fresh stage
`chload.stage_<machine>_<pid>_<start>_<id>` (`CREATE TABLE ... AS <table>`): *raw*, the
file's bytes posted as they are, or *push*, chDB in this process streaming `Native`
(push.py). Filling is fill.py's, streams and
sealing stages.py's; this module connects, runs SQL and drives each load.
docs/target-server.md is the user's side and argues the exactly-once protocol.

Invariants: a table is created from structured columns in the server's types
(capabilities.server_columns), never DDL text; a stage is attached only by the committer
(committer.py); a failed attempt's stage is dropped, so a retry starts clean; the
password is never in a message, the ledger, or `display`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace

from chload.commit import rejects
from chload.commit.batch import CommitBatcher
from chload.commit.committer import Committer, stage_name
from chload.commit.ledger import (
    DATABASE,
    FAILED,
    LEDGER_TABLES,
    LOADED,
    FileEvent,
    Ledger,
    LoadedEvents,
)
from chload.commit.locks import Sql
from chload.commit.rejects import ErrorBudget
from chload.errors import (
    BatchOverlap,
    ChloadError,
    DataError,
    SchemaError,
    TerminalError,
    TransientError,
    UsageError,
)
from chload.formats import JSON_LINES
from chload.runtime.adaptive import Controller
from chload.runtime.engine import Engine
from chload.runtime.faults import crash_point
from chload.runtime.monitor import unit_costs
from chload.schema import (
    Column,
    add_column_sql,
    create_table_sql,
    default_order_by,
    display_table,
    quote_str,
    split_table,
    structure,
)
from chload.sources import identity
from chload.sources.base import SourceFile
from chload.sources.registry import table_function
from chload.targets.base import Loaded, LoadJob, Target, engines_of
from chload.targets.server import early as server_early, groups as server_groups, peers
from chload.targets.server.capabilities import Capabilities, server_columns, storable
from chload.targets.server.fill import StageFilling
from chload.targets.server.http import HttpClient, TargetURL
from chload.targets.server.rejects import LoaderRejects
from chload.targets.server.stages import (
    STAGING,
    ServerWatch,
    Streams,
    most_streams,
    seal,
    streams_for,
)
from chload.targets.vanished import explain_gone

_MERGE_TREE = ("MergeTree", "ReplacingMergeTree", "SummingMergeTree", "AggregatingMergeTree",
               "CollapsingMergeTree", "VersionedCollapsingMergeTree", "GraphiteMergeTree")


# opens the cluster of a Distributed table: (server, table, shards, shard_by, env)
OpenCluster = Callable[["ServerTarget", str, Sequence[tuple[str, str]], str, dict[str, str]],
                       AbstractContextManager[Target]]


# makes a followed table on a cluster (cluster/create.py): (server, table, cluster,
# columns, key, engine, shards, env)
MakeOnCluster = Callable[["ServerTarget", str, str, Sequence[Column], Sequence[str], str,
                          Sequence[tuple[str, str]], Mapping[str, str]], None]


class ServerTarget(StageFilling):
    """A ClickHouse server; the ledger lives in its `chload` database."""

    reads_pipes = True  # a piped unit is posted chunked as it comes (fill.py, is_pipe)
    single_writer = False
    wants_key_order = True  # a one-part stage is sorted after its last byte (18.16)
    notes: Sequence[str] = ()  # for the report of a load: set by for_table

    def __init__(self, url: TargetURL, clusters: OpenCluster | None = None,
                 make_on_cluster: MakeOnCluster | None = None) -> None:
        self.url = url
        self._clusters = clusters  # opens the cluster of a Distributed table (registry)
        self._make_on_cluster = make_on_cluster  # a followed table made on a cluster
        self.database = self.url.database  # what a bare --table name means
        self.where = f"server {self.url.host}:{self.url.port}"
        early = server_early.claim(url)  # asked while the loader imported (cli._load)
        self.client = early.client if early else HttpClient(self.url)
        # SQL -> its answer, asked ahead: given once by `rows`, dropped at any write
        self._ahead: dict[str, list[dict]] = early.answers if early else {}
        self.caps: Capabilities = (early.caps if early and early.caps
                                   else server_early.probe(self.client, self.where))
        self.display = f"ClickHouse {self.caps.version} at {self.url.display}"
        self.ledger = Ledger(self)
        if not LEDGER_TABLES <= self.caps.ledger_tables:
            self.ledger.ensure()
            rejects.ensure(self)
        self.committer = Committer(Sql(self._command_id, self.rows), self.ledger)
        self.batcher = CommitBatcher(self.committer, STAGING)
        self.engine = Engine(None)  # chDB in memory, started on first use
        self.path = tempfile.mkdtemp(prefix="chload-server-")  # spooled stdin lives here
        self.loaded = LoadedEvents(self.ledger)
        self._engines: dict[str, str] = {}
        self._columns_asked: dict[str, list[Column] | None] = {}  # (see _distributed)
        self._width = 0  # columns of the table last asked for (the run's table)
        # table -> ' ENGINE = ...' of its stages: a cluster's Replicated local tables,
        # staged in a plain MergeTree of the same keys (cluster/target.py)
        self.stage_engines: dict[str, str] = {}
        self.insert_params: dict[str, str] = {}  # server settings of every data INSERT
        self.loading: set[str] = set()  # tables loaded into: their parts are watched
        self._undropped: set[str] = set()
        self._started_ns = time.time_ns()  # files committed by other runs after this count
        self._reading = threading.local()
        self._reading_guard = threading.Lock()
        self._streams = Streams(8)  # data requests at once (above)
        self._watch: ServerWatch | None = None  # open_streams with `adapt`, until close
        self.rejects = LoaderRejects(self.engine, self._send)
        self._setup: tuple[int, float] | None = None  # requests before the first stream
        self._units = [0, 0]  # stages committed, files in them

    # -- SQL ---------------------------------------------------------------------------
    def command(self, sql: str) -> None:
        self._ahead.clear()  # what was asked ahead may be stale after any write
        self.client.post(sql, context=self.where)

    def _command_id(self, sql: str, query_id: str) -> None:
        self._ahead.clear()
        self.client.post(sql, context=self.where, query_id=query_id)

    def rows(self, sql: str) -> list[dict]:
        """Small results as dicts, 64-bit integers as numbers (as chDB gives them)."""
        ahead = self._ahead.pop(sql, None)
        if ahead is not None:
            return ahead
        text = server_early.ask(self.client, self.where, sql, "JSONEachRow",
                                server_early.NUMBERS)
        return [json.loads(line) for line in text.splitlines() if line]

    def text(self, sql: str, fmt: str) -> str:
        """The user's SQL, in the URL's database; Pretty formats without ANSI colours
        (18.16 colours them by default, as chDB does not)."""
        params = {"output_format_pretty_color": "0"} if (
            "output_format_pretty_color" in self.caps.settings) else {}
        return self.client.post(sql, context="query", fmt=fmt, in_database=True,
                                params=params).decode(errors="surrogateescape")  # engine._text

    def binary(self, sql: str, fmt: str) -> bytes:
        return self.client.post(sql, context="query", fmt=fmt, in_database=True)

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
        if table in self._columns_asked:  # just asked, to know its engine (_distributed)
            return self._columns_asked.pop(table)
        rows = self.rows(server_early.columns_sql(table))
        for row in rows:
            if row["engine"]:
                self._engines[table] = row["engine"]
        columns = [Column(r["name"], r["type"], r["default_kind"]) for r in rows
                   if not r["engine"]]
        self._width = len(columns) or self._width  # (the run's table: plan_batches)
        return columns or None

    def create_table(self, table: str, columns: Sequence[Column], order_by: str | None,
                     partition_by: str | None, engine: str = "MergeTree") -> None:
        """The table with each type as this server stores it (capabilities.server_type:
        e.g. LowCardinality(T) as T where it is experimental); a type it cannot store is
        a SchemaError naming the column and --schema."""
        stored = server_columns(columns, self.caps, f"table {display_table(table)}")
        self.command(create_table_sql(table, stored, order_by or default_order_by(columns),
                                      partition_by, engine))

    def table_engines(self, table: str) -> list[tuple[str, str]]:
        return engines_of(self.rows, table)

    def create_on_cluster(self, table: str, cluster: str, columns: Sequence[Column],
                          key: Sequence[str], engine: str, shards: Sequence[tuple[str, str]],
                          env: Mapping[str, str]) -> None:
        """A followed table made on `cluster` (--cluster): a local table on every shard,
        the Distributed table here (cluster/create.py)."""
        if self._make_on_cluster is None:
            raise UsageError(f"--cluster {cluster}: this server was opened for one table "
                             "only (open it with open_target)")
        self._columns_asked.pop(table, None)
        self._make_on_cluster(self, table, cluster, columns, key, engine, shards, env)

    def add_columns(self, table: str, columns: Sequence[Column]) -> list[str]:
        """Each column `table` lacks, added as this server stores its type. Another
        loader may add the same column meanwhile: plain ADD COLUMN on every version (18.16
        has no IF NOT EXISTS), and an error of a column now there (15 DUPLICATE_COLUMN;
        44 on 18.16) means it did, so exactly one loader records adding it."""
        stored = server_columns(columns, self.caps, f"table {display_table(table)}")
        have = {c.name for c in self.table_columns(table) or []}
        crash_point("add-columns")  # (tests: two loaders past this read at once)
        added = []
        for column in (c for c in stored if c.name not in have):
            try:
                self.command(add_column_sql(table, column))
            except TerminalError:
                if column.name not in {c.name for c in self.table_columns(table) or []}:
                    raise
                continue
            added.append(column.name)
        return added

    @property
    def workdir(self) -> str:
        return self.path

    @property
    def engine_name(self) -> str:
        return self.caps.version

    def has_type(self, name: str) -> bool:
        return name in self.caps.types

    def default_workers(self, files: Sequence[SourceFile]) -> int:
        return streams_for(len(files), self.caps.max_threads)

    def open_streams(self, streams: int, adapt: Controller | None = None) -> int:
        """Let `streams` data requests run at once; return how many files to keep in
        flight: as many again (at least STAGING), each with its stage created and
        waiting for a stream, so a stream that ends a file starts the next at once
        while the file it ended commits (a dozen small requests). With fewer in
        flight, files of the second round wait for threads still committing.

        With `adapt` (--workers auto) the controller moves the limit while the load
        runs, within `most_streams` of the server's cores, watched by `ServerWatch`
        (host pressure, server backpressure) until the controller is finished; the
        threads are enough for its bound."""
        self._setup = self.client.stats.others()
        self.batcher.slack = max(STAGING, streams)
        if adapt is None:
            self._streams = Streams(streams)
            return streams + max(STAGING, streams)
        adapt.bounded(most_streams(self.caps.max_threads))
        self._streams = Streams(adapt.limit, adapt)
        if self._watch is not None:  # (a Kafka load's earlier round)
            self._watch.stop()
        self._watch = ServerWatch(self, adapt).start()
        return adapt.maximum + max(STAGING, adapt.limit)

    # -- loading -----------------------------------------------------------------------
    def load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> Loaded:
        self._check_engine(job)
        with self.committer.expecting(job.table, [f.uri for f in job.files]):
            return self._load_file(job, progress)

    def _load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> Loaded:
        stage = stage_name(self.committer.holder)
        errors_file = (os.path.join(self.path, f"rejects-{stage}.csv")
                       if job.budget.allows_errors else "")
        try:
            with self.batcher.filling():
                job = self._open_stage(job, stage)
                read = self._budgeted(job, stage, errors_file) if errors_file else self._fill(
                    job, stage)
                rows, partitions = seal(self, stage)
                identity.check_read(job)
                rejected = (self.rejects.keep(job, stage, errors_file, rows)
                            if errors_file else 0)
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
            done = self._commit(job, stage, partitions, [event])
        except TransientError:
            self._drop(stage)  # nothing was committed; the runner may try again
            raise
        if done:
            self.loaded.add([event.moved(LOADED)])
            self._count_unit(1)
        self._drop(stage)
        return Loaded(rows, read, rejected) if done else Loaded(0, read, elsewhere=True)

    def _budgeted(self, job: LoadJob, stage: str, errors_file: str) -> int:
        """With an error budget the loader's engine parses (push): it skips bad rows
        within --max-errors and writes each to `errors_file` (commit/rejects.py); a
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
        """Files in groups of one stage and one commit each (server/groups.py says
        which share one); with an error budget each alone (the engine's errors file
        does not say which file a rejected row came from)."""
        if budget.allows_errors:
            return [(f,) for f in files]
        return server_groups.plan(files, workers, self._pushed, JSON_LINES,
                                  streamed=not self.url.secure, columns=self._width)

    def _open_stage(self, job: LoadJob, stage: str) -> LoadJob:
        """Create `stage` for `job` (as its table, in its stage engine) once its stream
        may start; the job as it will be read."""
        job = identity.as_read(job)
        self.loading.add(job.table)
        self._streams.stage_turn()
        self.command(f"CREATE TABLE {DATABASE}.{stage} AS {job.table}"
                     f"{self.stage_engines.get(job.table, '')}")
        return job

    def _pushed(self, f: SourceFile) -> bool:
        """Must the loader's engine read `f`, whatever the job (fill.py `path_for`)?"""
        return (self.url.path == "push" or not f.local_path
                or not self.caps.parses(f.format.name)
                or not self.caps.accepts(f.format.compression))

    def load_batch(self, job: LoadJob, progress: Callable[[int, int], None]) -> list[Loaded]:
        """Several files through one stage and one commit, each file's rows counted
        as it lands. Any failure before the commit raises, and the runner loads each half
        as a batch (halved again while it fails); after the commit begins nothing is
        retried (rule 5 of committer.py makes a retry of a batch that may have committed
        load nothing)."""
        self._check_engine(job)
        with self.committer.expecting(job.table, [f.uri for f in job.files]):
            return self._load_batch(job, progress)

    def _load_batch(self, job: LoadJob, progress: Callable[[int, int], None]) -> list[Loaded]:
        stage = stage_name(self.committer.holder)
        try:
            with self.batcher.filling():
                job = self._open_stage(job, stage)
                done = self._fill_batch(job, stage)
                rows, partitions = seal(self, stage)
                identity.check_read(job)
        except ChloadError:
            self._drop(stage)
            raise
        progress(rows, sum(d.bytes for d in done))
        events = [_event(replace(job, file=f), "", rows=d.rows, read=d.bytes)
                  for f, d in zip(job.files, done, strict=True)]
        try:
            committed = self._commit(job, stage, partitions, events)
        except TransientError:
            self._drop(stage)
            raise
        if not committed:
            self._drop(stage)
            raise BatchOverlap(f"{job.file.uri}: another load committed some files of this "
                               "batch meanwhile; loading them one by one")
        self.loaded.add(e.moved(LOADED) for e in events)
        self._count_unit(len(events))
        self._drop(stage)
        return done

    def _fill_batch(self, job: LoadJob, stage: str) -> list[Loaded]:
        """Fill one stage with a batch's files; each file's rows and bytes."""
        if self._gathers(job):
            return self._flow(job, stage)
        done: list[Loaded] = []
        total = 0
        for f in job.files:
            read = self._fill(replace(job, file=f, batch=()), stage, fallback=False)
            now = int(self.rows(f"SELECT count() AS n FROM {DATABASE}.{stage}")[0]["n"])
            done.append(Loaded(now - total, read))
            total = now
        return done

    def _commit(self, job: LoadJob, stage: str, partitions: Sequence[str],
                events: Sequence[FileEvent]) -> bool:
        """Commit a filled stage: with others, in fewer groups (batch.py); a unit
        of a stream at once, in its order."""
        self.committer.use_mode(job.table, job.mode, job.run_id)
        if job.follows:
            return self.committer.commit(job.table, job.table_display, stage, partitions,
                                         events, self._started_ns, job.follows)
        return self.batcher.commit(job.table, job.table_display, stage, partitions, events,
                                   self._started_ns)

    def _count_unit(self, files: int) -> None:
        with self._reading_guard:
            self._units[0] += 1
            self._units[1] += files

    def cost_report(self) -> dict:
        """The run's fixed and per-unit costs (LoadReport.costs, monitor.unit_costs); the
        per-unit requests include the watch's query each second."""
        return unit_costs(self.client.stats, self._setup, self._units,
                          self._streams.first_at, self._streams.turns,
                          self._streams.last_at)

    def _check_engine(self, job: LoadJob) -> None:
        engine = self._engines.get(job.table)
        if engine is None:
            database, name = split_table(job.table)
            found = self.rows(f"SELECT engine FROM system.tables WHERE database = "
                              f"{quote_str(database)} AND name = {quote_str(name)}")
            engine = self._engines[job.table] = found[0]["engine"] if found else ""
        if engine.startswith("Replicated") and job.table in self.stage_engines:
            engine = engine.removeprefix("Replicated")
        if engine.startswith("Replicated"):
            raise UsageError(f"table {job.table_display} is {engine}: load replicated tables "
                             "through a cluster target (not built yet)")
        if engine not in _MERGE_TREE:
            raise SchemaError(f"table {job.table_display} has engine {engine or '?'}: chload "
                              "loads exactly once only into MergeTree-family tables (it "
                              "attaches whole partitions); load into a MergeTree table")

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

    def begin_run(self) -> None:
        self._started_ns = time.time_ns()

    def recover(self, table: str) -> int:
        return self.committer.start(table, display_table(table))

    def for_table(self, table: str, shards: Sequence[tuple[str, str]], shard_by: str,
                  env: Mapping[str, str]) -> AbstractContextManager[Target]:
        """This server, or the cluster of `table`'s shards when it is Distributed."""
        self.notes = []
        if not shards and shard_by in ("auto", "file") and not self._distributed(table):
            if self._columns_asked.get(table, []) is None:  # no such table: created here
                self.notes = self._distributed_elsewhere(table)
            return nullcontext(self)  # the cluster modules stay unimported
        if self._clusters is None:
            raise UsageError(f"{display_table(table)}: a Distributed table; this server was "
                             "opened for one table only (open it with open_target)")
        return self._clusters(self, table, shards, shard_by, dict(env))

    def _distributed(self, table: str) -> bool:
        """Is `table` Distributed? Asked with its columns, which the planner asks next
        (kept for that one call): a round trip less before the first byte."""
        self._columns_asked[table] = self.table_columns(table)
        if self._engines.get(table) != "Distributed":
            return False
        self._ahead.clear()  # asked for this table: the cluster's targets ask their own
        return True

    def _distributed_elsewhere(self, table: str) -> list[str]:
        """A note for the report when the other servers of a cluster of this server hold
        a Distributed table of the name (peers.py), which is then made here plain."""
        found = peers.distributed_elsewhere(self.rows, table, peers.clusters_of(self.rows))
        return [peers.creating_note(table, self.url.display, found)] if found else []

    def shard_report(self) -> list[dict]:
        return []

    def close(self, failed: bool = False) -> None:
        try:
            self.flush()
            for stage in list(self._undropped):
                self._drop(stage)
        finally:
            if self._watch is not None:  # (its last look uses the client)
                self._watch.stop()
            self.engine.close()
            self.client.close()
            shutil.rmtree(self.path, ignore_errors=True)


def _event(job: LoadJob, state: str, rows: int = 0, read: int = 0,
           error: str = "") -> FileEvent:
    f = job.file
    return FileEvent(job.table_display, f.uri, f.identity, f.size, f.mtime_ns, state,
                     rows, read, error, job.run_id)
