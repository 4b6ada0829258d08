"""The embedded target: ClickHouse in this process (chDB), persistent in a directory.

Exactly once per file, without a column of ours in the user's table: the engine fills a
fresh stage `chload.stage_<machine>_<pid>_<start>_<id>` shaped like the table; the committer
(committer.py, the same as a server's) logs `committing` with the mark and attaches its
partitions (commit/attach.py); then `loaded` (in batches) and the stage is dropped.
docs/target-embedded.md ("How a file is loaded") is the user's side.

Invariants: a crash before `committing` leaves only a stage, which the next run drops; a
crash after it is settled by the mark rule. This process is the directory's only writer
(engine.py holds a `flock`), so the commit lock is in-process (locks.ProcessLock).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from chload.commit import rejects
from chload.commit.committer import Committer, stage_name
from chload.commit.known import KnownUnits
from chload.commit.ledger import (
    DATABASE,
    FAILED,
    LOADED,
    FileEvent,
    Ledger,
    LoadedEvents,
    TableState,
    create_statements,
    moved,
)
from chload.commit.locks import ProcessLock, Sql
from chload.commit.rejects import ErrorBudget
from chload.core.reading import fit
from chload.core.reading.ranges import CHDB
from chload.errors import (
    BatchOverlap,
    ChloadError,
    DataError,
    TransientError,
    UsageError,
    pinpointed,
)
from chload.runtime.engine import BLOCK_SETTINGS, SESSION_SETTINGS, Engine
from chload.runtime.monitor import unit_costs
from chload.schema import (
    AUDIT_COLUMNS,
    Column,
    add_column_sql,
    create_table_sql,
    display_table,
    quote_ident,
    quote_str,
    settings_sql,
    split_table,
    structure,
)
from chload.sources import identity
from chload.sources.base import SourceFile
from chload.sources.registry import source_for, table_function, table_function_many
from chload.targets.base import Loaded, LoadJob, Target, engines_of
from chload.targets.embedded.groups import plain_text, plan_groups
from chload.targets.vanished import check_present, explain_gone, reading

if TYPE_CHECKING:
    from chload.runtime.adaptive import Controller

# An insert whose data may hold more than this in memory (stored bytes, times
# _EXPANSION when compressed or columnar; unknown for a stream) has its blocks bounded by
# bytes (engine.BLOCK_SETTINGS): below it, its blocks are no bigger than its data, and
# the bound would only cut its parts smaller (more CPU for wide rows).
LARGE_UNIT_BYTES = 256 << 20
_EXPANSION = 6

# Settings every load runs with; user --setting values come after and win.
LOAD_SETTINGS: tuple[tuple[str, str], ...] = (
    ("input_format_parallel_parsing", "1"),
    ("max_insert_threads", "2"),
)


class EmbeddedTarget:
    """chDB in a directory; the ledger lives in its `chload` database."""

    database = "default"  # what a bare --table name means
    reads_pipes = True  # the engine is in this process: a fetched unit may be a pipe
    single_writer = True  # the directory's flock (engine.py)
    # it reads as /dev/fd/N while the source writes (SourceContext.pipes)
    wants_key_order = False  # it writes as rows come; an ordered read was a loss here
    notes: Sequence[str] = ()  # (nothing to say of a table here)

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.display = f"embedded ClickHouse in {path}"
        new = not os.path.isdir(self.path)
        # What this run makes, which close(failed=True) removes if nothing committed:
        # the directory, or all it holds (an empty one given), or nothing (a target).
        self.made = "directory" if new else "" if os.listdir(self.path) else "contents"
        self.engine = Engine(self.path, SESSION_SETTINGS)  # block bounds: _settings_sql
        self.ledger: Ledger = _Ledger(self)
        if new:  # every table of the ledger and of rejected rows, in one call
            self.command(";\n".join((*create_statements(), rejects.DDL)))
        elif not self.ledger.complete():
            self.ledger.ensure()
            rejects.ensure(self)
        sql = Sql(lambda statement, _query_id: self.command(statement), self.rows)
        # a stage's partitions are moved into the table: an attach in chDB would cancel
        # the table's merges at every commit (commit/attach.py)
        self.committer = Committer(sql, self.ledger, lock=ProcessLock(sql), moves=True)
        self.loaded = LoadedEvents(self.ledger)
        self._started_ns = time.time_ns()  # files committed by other runs after this count
        # A directory this process made holds only the ledger until it creates a table:
        # no table to describe, no commit to settle (two queries less at start-up).
        self.fresh = new
        self._kept = False  # a table was made (a message may name it) or a commit began
        self._units = [0, 0]  # committed units (stages) and their files, for cost_report
        self._units_guard = threading.Lock()

    # -- SQL ---------------------------------------------------------------------------
    def command(self, sql: str) -> None:
        self.engine.query(sql, "TSV", f"target {self.path}")

    def rows(self, sql: str) -> list[dict]:
        return self.engine.rows(sql, f"target {self.path}")

    def text(self, sql: str, fmt: str) -> str:
        self.fresh = False  # the user's SQL may create a table
        return self.engine.query(sql, fmt, "query")

    def binary(self, sql: str, fmt: str) -> bytes:
        return self.engine.answer(sql, fmt, "query")

    infer_rows = rows

    def reader(self, file: SourceFile, fmt: str, columns: Sequence[Column] | None) -> str:
        return table_function(file, fmt, structure(columns) if columns else None)

    def table_columns(self, table: str) -> list[Column] | None:
        if self.fresh:
            return None
        database, name = split_table(table)
        rows = self.rows(
            f"SELECT name, type, default_kind FROM system.columns WHERE database = "
            f"{quote_str(database)} AND table = {quote_str(name)} ORDER BY position"
        )
        return [Column(r["name"], r["type"], r["default_kind"]) for r in rows] or None

    def create_table(self, table: str, columns: Sequence[Column], order_by: str | None,
                     partition_by: str | None, engine: str = "MergeTree") -> None:
        self.fresh, self._kept = False, True
        self.command(create_table_sql(table, columns, order_by, partition_by, engine))

    def table_engines(self, table: str) -> list[tuple[str, str]]:
        return engines_of(self.rows, table)

    def add_columns(self, table: str, columns: Sequence[Column]) -> list[str]:
        """One process holds the directory (engine.py's flock), and the planner adds a
        run's columns before any unit loads: what it lacks now is ours to add."""
        have = {c.name for c in self.table_columns(table) or []}
        added = [c for c in columns if c.name not in have]
        for column in added:
            self.command(add_column_sql(table, column, if_not_exists=True))
        return [c.name for c in added]

    @property
    def workdir(self) -> str:
        return self.path

    @property
    def engine_name(self) -> str:
        return CHDB

    def has_type(self, name: str) -> bool:
        return True

    def open_streams(self, streams: int, adapt: Controller | None = None) -> int:
        if adapt is not None:
            adapt.freeze("fixed: the embedded engine's threads are the cores")
        return streams  # a file in flight is a file loading: none waits staged

    def default_workers(self, files: Sequence[SourceFile]) -> int:
        # Parallel per-file inserts beat one glob query; more than 2 per core adds
        # nothing.
        return max(1, min(len(files), max(2, os.cpu_count() or 2)))

    # -- loading -----------------------------------------------------------------------
    def load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> Loaded:
        stage = stage_name(self.committer.holder)
        errors_file = self._errors_file(stage) if job.budget.allows_errors else ""
        try:
            job = identity.as_read(job)
            self._create_stage(stage, job.table)
            rows, rejected, read = self._insert(stage, job, errors_file)
            identity.check_read(job)
        except ChloadError as exc:
            error = explain_gone(job.file, exc)
            self.ledger.record([_event(job, FAILED, stage, error=str(error))])
            self._drop(stage)
            if error is exc:
                raise
            raise error from exc
        finally:
            if errors_file and os.path.exists(errors_file):
                os.remove(errors_file)
        read = job.file.size or read  # as stored (compressed); a pipe's: as the engine read
        progress(rows, read)
        done = self._commit(job, stage, [_event(job, "", rows=rows, read=read)])
        # no rows when another load committed it meanwhile
        return Loaded(rows, read, rejected) if done else Loaded(0, read)

    def _commit(self, job: LoadJob, stage: str, events: Sequence[FileEvent]) -> bool:
        """Attach the stage through the committer (committer.py), then queue `loaded` and
        drop it; False when another load committed one of the files meanwhile.

        A TransientError means nothing was committed: the stage is dropped and the
        runner may try again. Any other error leaves the `committing` event and the
        stage for the committer to settle (some partitions may be attached already).
        """
        self._kept = True
        self.committer.use_mode(job.table, job.mode, job.run_id)
        try:
            done = self.committer.commit(job.table, job.table_display, stage, None, events,
                                         self._started_ns, job.follows)
        except TransientError:
            self._drop(stage)
            raise
        if done:
            self.loaded.add(moved(events, LOADED))
            with self._units_guard:
                self._units[0] += 1
                self._units[1] += len(events)
        self._drop(stage)
        return done

    def _create_stage(self, stage: str, table: str, then: Sequence[str] = ()) -> None:
        """A stage shaped like `table`, which never merges: its parts are attached as
        they are (committer.py rule 2), so a merge there is wasted work, and its DROP
        waits for the merge running. (The switch lives in the table object only:
        nothing to undo after a crash.)
        `then`: statements to run in the same call (a group's views)."""
        self.command(";\n".join((f"CREATE TABLE {DATABASE}.{stage} AS {table}",
                                  f"SYSTEM STOP MERGES {DATABASE}.{stage}", *then)))

    def _drop(self, *stages: str) -> None:
        """Drop a stage (or a group's views and tables, in one call). Never raises: after
        its commit, an error must not make the runner load its files again; a stage left
        behind is the next run's orphan."""
        with contextlib.suppress(ChloadError):
            self.command("DROP TABLE IF EXISTS " + ", ".join(f"{DATABASE}.{s}" for s in stages))

    def _insert(self, stage: str, job: LoadJob, errors_file: str) -> tuple[int, int, int]:
        """Parse the file into the stage (chload.<stage>); keep rejected rows within the
        budget, under the stage's name (as the ledger logs it). (rows, rejected, bytes
        the engine read)."""
        extra = job.budget.engine_settings(errors_file) if errors_file else []
        try:
            sql = _insert_sql(f"{DATABASE}.{stage}", job, self.reader, extra)
            rows, read = self.engine.execute(sql, job.file.uri)
        except DataError as exc:
            if errors_file and rejects.budget_spent(self.rows, job.budget, errors_file,
                                                    job.file.format.delimiter):
                raise rejects.over_budget(self.rows, job.file.uri, job.file.format, job.budget,
                                          errors_file) from exc
            raise self._diagnose(job, exc) from exc
        if not errors_file:
            return rows, 0, read
        rejected = rejects.count_errors(self.rows, errors_file, job.file.format.delimiter)
        job.budget.check(job.file.uri, rejected, rows)
        rejects.check_accounted(self.rows, job.file.uri, job.file.format,
                                self.reader(job.file, "LineAsString", None), rows, rejected,
                                errors_file)
        if rejected:
            rejects.record(self, errors_file, table=job.table_display, uri=job.file.uri,
                           stage=stage, run_id=job.run_id, fmt=job.file.format,
                           lines_sql=self.reader(job.file, "LineAsString", None),
                           parse_sql=lambda text: rejects.parse_one_sql(
                               job.file.format, structure(job.read_columns), text),
                           seq=time.time_ns(), line_base=job.line_base)
        return rows, rejected, read

    def _diagnose(self, job: LoadJob, exc: DataError) -> DataError:
        """Name the exact line and column of a parse error.

        Parallel parsing numbers rows per segment, so the failed file is read once more
        on one thread (only files that failed pay for this).
        """
        source = self.reader(job.file, job.file.format.name, job.read_columns)
        try:
            self.engine.query(f"SELECT * FROM {source} SETTINGS input_format_parallel_parsing"
                              f" = 0 FORMAT Null", "TSV", job.file.uri)
        except DataError as again:
            return pinpointed(again, job.file.uri, rejects.header_lines(job.file.format))
        except ChloadError:
            return exc
        return exc

    def _errors_file(self, stage: str) -> str:
        os.makedirs(os.path.join(self.path, "tmp"), exist_ok=True)
        return os.path.join(self.path, "tmp", f"rejects-{stage.rsplit('_', 1)[-1]}.csv")

    # -- many small files as one -------------------------------------------------------
    def plan_batches(self, files: Sequence[SourceFile], budget: ErrorBudget,
                     workers: int) -> list[tuple[SourceFile, ...]]:
        return plan_groups(files, budget, workers)

    def load_batch(self, job: LoadJob, progress: Callable[[int, int], None]) -> list[Loaded]:
        """Load several files with one parse, one stage and one commit (_load_flow)."""
        return self._load_flow(job, progress)

    def _load_flow(self, job: LoadJob, progress: Callable[[int, int], None]) -> list[Loaded]:
        """Several files parsed by one INSERT, in one pass: into a Null table with two
        materialized views, one writing the rows into the stage, one counting them per
        file (so per-file row counts are exact). Either all files of the batch are
        committed or none is; a batch that fails is halved by the runner until the bad
        file is alone.
        The engine reads a file gone since listing as empty, so a file without rows is
        looked at again before the commit (vanished.py).

        Cheaper than one INSERT per file into a shared stage (each writes its own
        parts) and than parsing into a Memory table and copying it into the stage.
        The file column is LowCardinality: a String costs narrow tables per row."""
        holder = self.committer.holder
        stage, raw, counts, to_stage, to_counts = (stage_name(holder) for _ in range(5))
        names = ", ".join(_names(job))
        views = (to_stage, to_counts, raw, counts)
        try:
            job = identity.as_read(job)
            self._create_stage(stage, job.table, then=(
                f"CREATE TABLE {DATABASE}.{raw} ENGINE = Null AS SELECT {names}, "
                f"toLowCardinality('') AS _chload_file FROM {job.table} LIMIT 0",
                f"CREATE TABLE {DATABASE}.{counts} (f String, n UInt64) ENGINE = Memory",
                f"CREATE MATERIALIZED VIEW {DATABASE}.{to_stage} TO {DATABASE}.{stage} "
                f"({names}) AS SELECT {names} FROM {DATABASE}.{raw}",
                f"CREATE MATERIALIZED VIEW {DATABASE}.{to_counts} TO {DATABASE}.{counts} AS "
                f"SELECT _chload_file AS f, count() AS n FROM {DATABASE}.{raw} GROUP BY f"))
            rows = {r["f"]: int(r["n"]) for r in self.engine.execute_rows(
                f"INSERT INTO {DATABASE}.{raw} {_batch_select_sql(job, self.reader)} "
                f"SETTINGS {_settings_sql(job)};\n"
                f"SELECT f, sum(n) AS n FROM {DATABASE}.{counts} GROUP BY f",
                f"batch of {len(job.files)} files from {job.file.uri}")}
            check_present(job.files, rows, reading(self.engine, self.reader, job.read_columns))
            identity.check_read(job)
        except ChloadError:
            self._drop(stage)
            raise
        finally:
            self._drop(*views)
        done = [Loaded(rows.get(f.uri, 0), f.size) for f in job.files]
        progress(sum(d.rows for d in done), sum(d.bytes for d in done))
        self._commit_group(job, stage, done)
        return done

    def _commit_group(self, job: LoadJob, stage: str, done: Sequence[Loaded]) -> None:
        table, run_id = job.table_display, job.run_id  # (`_event` of each file, inline)
        events = [FileEvent(table, f.uri, f.identity, f.size, f.mtime_ns, "", d.rows, d.bytes,
                            "", run_id, "") for f, d in zip(job.files, done, strict=True)]
        if not self._commit(job, stage, events):
            raise BatchOverlap(f"{job.file.uri}: another load committed some files of this "
                               "batch meanwhile; loading them one by one")

    # -- recovery ----------------------------------------------------------------------
    def recover(self, table: str) -> int:
        """Settle what interrupted commits left (committer.py); return how many files."""
        if self.fresh:
            return 0
        settled = self.committer.start(table, display_table(table))
        self.engine.give_back()  # (the first look grouped the table's whole ledger)
        return settled

    def flush(self) -> None:
        """Write the `loaded` events still waiting (ledger.LoadedEvents)."""
        self.loaded.flush()

    def begin_run(self) -> None:
        self._started_ns = time.time_ns()

    def for_table(self, table: str, shards: Sequence[tuple[str, str]], shard_by: str,
                  env: Mapping[str, str]) -> AbstractContextManager[Target]:
        """One target, no shards: `--shard` makes no sense here."""
        if shards:
            raise UsageError("--shard: only for a Distributed table on a server target")
        return contextlib.nullcontext(self)

    def shard_report(self) -> list[dict]:
        return []

    def cost_report(self) -> dict:
        """The run's fixed and per-unit costs (LoadReport.costs), as a server target's:
        seconds from the process's start to the first INSERT into a stage; queries before
        it (ledger, probe, table); per committed unit (a stage: one file or a group), the
        queries other than the INSERT (stage create and drop, the group's views, commit,
        ledger) and their seconds, summed over threads; and the engine's sessions (one
        per thread) with the seconds they took to open (the first imports chDB)."""
        stats = self.engine.stats
        setup = stats.setup or stats.others()
        return {**unit_costs(stats, setup, self._units, stats.first_data_at, stats.data_calls),
                "setup_seconds": round(setup[1], 4),
                "data_seconds": round(stats.data_seconds, 3),
                "sessions": stats.sessions,
                "session_open_seconds": round(stats.open_seconds, 3)}

    def close(self, failed: bool = False) -> None:
        """Flush and close; after a run that `failed` before it made a table or began a
        commit, the directory it made (the ledger's tables only) is removed: a typo in a
        source's name leaves nothing on disk. A directory that held anything is kept."""
        try:
            self.flush()
        finally:
            self.engine.close()
        if failed and self.made and not self._kept:
            _remove(self.path, self.made == "contents")


class _Ledger(Ledger):
    """The ledger of an embedded target: in a directory this process made, until it
    creates a table, no table exists and no file was loaded into one (two queries less
    at start-up)."""

    def __init__(self, target: EmbeddedTarget) -> None:
        super().__init__(target)
        self._target = target

    def table_state(self, database: str, name: str) -> TableState:
        return TableState(False) if self._target.fresh else super().table_state(database, name)

    def loaded(self, target_table: str) -> dict[str, FileEvent]:
        return {} if self._target.fresh else super().loaded(target_table)

    def known(self, target_table: str, table: TableState) -> tuple[KnownUnits, str]:
        return (KnownUnits(), "") if self._target.fresh else super().known(target_table, table)

    def sliced(self) -> None:
        self._target.engine.give_back()


def _remove(path: str, contents_only: bool) -> None:
    """Remove the directory, or only what it holds."""
    if not contents_only:
        shutil.rmtree(path, ignore_errors=True)
        return
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(entry.path)


def _names(job: LoadJob) -> list[str]:
    """The columns an insert fills: the data's, then the audit columns."""
    names = [quote_ident(c.name) for c in job.columns]
    return names + ([quote_ident(n) for n in AUDIT_COLUMNS] if job.audit else [])


def _select_sql(job: LoadJob, file: SourceFile, reader: Callable[..., str],
                tag: bool = False) -> str:
    """SELECT the data of one file, with audit columns and (tag) the file's uri."""
    exprs = _column_exprs(job)
    if job.audit:
        exprs += ["_path" if source_for(file).reads_at_uri(file)
                  else quote_str(file.uri), "now()"]  # not stdin's spool, a link, an object
    if tag:
        exprs.append(quote_str(file.uri))
    return (f"SELECT {', '.join(exprs)} "
            f"FROM {reader(file, file.format.name, job.read_columns)}")


def _column_exprs(job: LoadJob) -> list[str]:
    """The table's columns as read: each by name, or refused where a typed file's number
    does not fit its column (fit.insert_expr; the insert would wrap it)."""
    read = {c.name: c.type for c in job.read_columns}
    return [fit.insert_expr(quote_ident(c.name), read.get(c.name, c.type), c.type)
            or quote_ident(c.name) for c in job.columns]


def _batch_select_sql(job: LoadJob, reader: Callable[..., str]) -> str:
    """SELECT the data of a batch with each row's uri last: one table function over all
    the files where the source has one (object stores: one query plan, no listing),
    else a UNION ALL of one SELECT per file."""
    formats = {f.format for f in job.files}
    many = None
    if len(formats) == 1:
        many = table_function_many(job.files, job.file.format.name,
                                   structure(job.read_columns))
    if many is None:
        return " UNION ALL ".join(_select_sql(job, f, reader, tag=True) for f in job.files)
    source, uri = many
    exprs = _column_exprs(job)
    exprs += [uri, "now()"] if job.audit else []
    return f"SELECT {', '.join(exprs)}, {uri} FROM {source}"


def _settings_sql(job: LoadJob, extra: Sequence[tuple[str, str]] = ()) -> str:
    threads: tuple[tuple[str, str], ...] = ()
    if job.threads:  # parallel parsing only pays when a file has cores to itself: a
        # batch of as many files as threads is read a file per thread, each parsing its own
        parallel = job.threads > len(job.files)
        threads = (("max_threads", str(job.threads)), ("max_insert_threads", str(job.threads)),
                   ("input_format_parallel_parsing", "1" if parallel else "0"))
    blocks = BLOCK_SETTINGS if _large(job.files) else ()
    pairs = dict((*LOAD_SETTINGS, *blocks, *threads, *extra, *job.settings))
    return settings_sql(pairs.items())


def _large(files: Sequence[SourceFile]) -> bool:
    """Whether an insert of `files` may hold more than LARGE_UNIT_BYTES in memory."""
    if any(f.is_stream or not f.size for f in files):
        return True
    return sum(f.size * (1 if plain_text(f) else _EXPANSION) for f in files) >= LARGE_UNIT_BYTES


def _insert_sql(stage: str, job: LoadJob, reader: Callable[..., str],
                extra: Sequence[tuple[str, str]] = ()) -> str:
    return (f"INSERT INTO {stage} ({', '.join(_names(job))}) "
            f"{_select_sql(job, job.file, reader)} SETTINGS {_settings_sql(job, extra)}")



def _event(job: LoadJob, state: str, stage: str = "", rows: int = 0, read: int = 0,
           error: str = "", file: SourceFile | None = None) -> FileEvent:
    """`file`'s event (job.file's by default)."""
    f = file or job.file
    return FileEvent(job.table_display, f.uri, f.identity, f.size, f.mtime_ns, state,
                     rows, read, error, job.run_id, stage)
