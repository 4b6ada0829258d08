"""The public Python API: `load()` and `validate()`, which take a LoadSpec's fields as
keyword parameters (or a LoadSpec), and the readers of what loads did: `files()`,
`sql()`, `history()`, `errors()`, `run_files()`.

    report = chload.load(["data/*.csv.gz"], table="trips")
    print(report.rows_loaded, report.files_failed)

The CLI is a thin layer over these functions; nothing here prints. Progress goes to an
optional listener as `Event`s. The types a call returns live in core/report.py (the
spec and the report), core/run.py (Event, FileResult), commit/ledger.py (FileEvent) and
core/validate.py (FileCheck), and are exported here and from `chload`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any, Literal

from chload import options, queries
from chload.commit.ledger import FileEvent
from chload.core import follow as following, load as steps, metrics, plan as planner
from chload.core.finish import UNWRITTEN_LOADED
from chload.core.report import (
    MODE_EFFECT,
    Concurrency,
    Costs,
    LoadReport,
    LoadSpec,
    Mode,
    OnError,
    OnNewColumn,
    Pairs,
    Saturation,
    ServerSaturation,
    Settings,
    ShardBy,
    ShardLoad,
    Sources,
    StreamChange,
    TargetName,
)
from chload.core.run import Event, FileResult, Listener, Poll
from chload.dispatch import begin_early, engine_credentials, load_into, source_context
from chload.errors import ChloadError, UsageError
from chload.queries import errors, files, history, run_files, sql
from chload.sources import registry
from chload.sources.run import RunSources
from chload.targets.base import Target
from chload.targets.registry import TargetSpec, open_target

if TYPE_CHECKING:
    from chload.core.validate import FileCheck as FileCheck

__all__ = ["load", "validate", "files", "sql", "history", "errors", "run_files", "LoadSpec",
           "LoadReport", "FileResult", "FileEvent", "FileCheck", "Event", "Listener",
           "Saturation", "Concurrency", "StreamChange", "Costs", "ShardLoad",
           "ServerSaturation", "Sources", "TargetName", "Settings", "Poll", "MODE_EFFECT"]


def __getattr__(name: str) -> Any:
    """`FileCheck`, from core/validate.py when first asked for: a load does not import
    it."""
    if name == "FileCheck":
        from chload.core.validate import FileCheck

        return FileCheck
    raise AttributeError(f"module 'chload.api' has no attribute {name!r}")


def _spec(function: str, sources: object, table: object, given: dict[str, Any]) -> LoadSpec:
    """The LoadSpec of a call's arguments; an unknown keyword is a UsageError listing
    the options."""
    names = [f.name for f in fields(LoadSpec) if f.name not in ("sources", "table")]
    options.no_unknown(function, given, names)
    if table is None:
        raise UsageError(f"{function}() needs table=, e.g. table='trips'")
    return LoadSpec(sources=sources, table=table, **given)  # type: ignore[arg-type]


# What a LoadSpec field holds when the caller did not give it.
_UNSET: dict[str, object] = {f.name: f.default for f in fields(LoadSpec)
                             if f.default is not MISSING}


def _spec_of(function: str, sources: Sources | LoadSpec, call: dict[str, Any]) -> LoadSpec:
    """The LoadSpec of a call (`call`: its locals, the keyword parameters named as the
    LoadSpec fields): `sources` itself when it is one, with no option beside it."""
    given = {name: value for name, value in call.items() if name in _UNSET or name == "table"}
    if not isinstance(sources, LoadSpec):
        return _spec(function, sources, given.pop("table"), given)
    beside = [name for name, value in given.items() if value != _UNSET.get(name)]
    if beside:
        raise UsageError(f"{function}(): given a LoadSpec, put {beside[0]}= in it")
    return sources


def load(sources: Sources | LoadSpec, *, table: str | None = None, target: TargetName = None,
         format: str | None = None, compression: str | None = None, schema: str | None = None,
         order_by: str | None = None, partition_by: str | None = None, audit: bool = False,
         settings: Settings = (), workers: int | Literal["auto"] | None = None,
         force: bool = False, on_error: OnError = "continue", s3_endpoint: str | None = None,
         max_errors: int | None = None, max_error_ratio: float | None = None,
         kafka_options: Settings = (), follow: bool = False, batch_rows: int | None = None,
         batch_seconds: float | None = None, query: str | None = None,
         incremental_by: str | None = None, shards: Pairs = (),
         shard_by: ShardBy = "auto", cluster: str | None = None,
         after_last_key: bool = False, on_new_column: OnNewColumn = "fail",
         upsert_key: str | None = None,
         version: str | None = None, mode: Mode = "append",
         poll: float | None = None, listener: Listener | None = None,
         metrics_port: int | None = None) -> LoadReport:
    """Load files into a table, exactly once per file; the options are the CLI's flags
    (`--max-errors` is `max_errors`). A wrong value is a UsageError naming the option.

    :param sources: files, directories, globs, ``-`` (stdin) or URLs (s3://, az://, gs://,
        hdfs://, http(s)://, kafka://, postgresql://, mysql://): a str or pathlib.Path, or a list of
        them; or a LoadSpec, then with no other option (``listener`` and
        ``metrics_port`` aside).
    :param table: the table, ``name`` or ``db.name``; created when missing.
    :param target: a directory of the embedded ClickHouse or http(s)://[user@]host:port[/db];
        default ``$CHLOAD_TARGET``, else ``./chload-data``.
    :param format: any ClickHouse input format; default: from each file's name.
    :param compression: gzip, zstd, bz2, xz, lz4 or none; default: from each file's name.
    :param schema: ``'a UInt32, b String'``: how to read the data, and the columns of a
        table chload creates.
    :param order_by: ORDER BY of a table chload creates.
    :param partition_by: PARTITION BY of a table chload creates.
    :param audit: add the columns _source_file and _loaded_at.
    :param settings: ClickHouse settings for the inserts: a dict or (name, value) pairs.
    :param workers: files loaded in parallel (into a server, data requests at a time);
        None or "auto": sized by the target and, into a server, adapted while loading.
    :param force: load files the ledger says are loaded already.
    :param on_error: after a failed file, "continue" with the others or "abort".
    :param s3_endpoint: an S3-compatible endpoint; default AWS_ENDPOINT_URL_S3,
        AWS_ENDPOINT_URL, else AWS.
    :param max_errors: bad rows a file may have (default 0); they go to chload.rejects.
    :param max_error_ratio: bad rows / all rows a file may have, in [0, 1].
    :param kafka_options: librdkafka settings for kafka:// sources, a dict or pairs;
        a value ``${VAR}`` is read from the environment.
    :param follow: keep loading what comes until SIGINT/SIGTERM: kafka://, new messages;
        files (directories, globs, s3://, az://, gs:// and hdfs:// prefixes), new files,
        listed again every ``poll`` seconds (a local file once unchanged since the poll before).
        Either signal ends the unit in flight (committed or not at all) and returns the
        report; the signal handlers are set only when called on the main thread.
    :param batch_rows: kafka://: messages per commit at most (default 500,000).
    :param batch_seconds: kafka:// with follow: commit at least this often (default 5).
    :param query: a postgresql:// or mysql:// source: load the rows of this SELECT.
    :param incremental_by: a database source: load the rows whose column (one that only
        grows) is above what was loaded.
    :param shards: a Distributed table's replicas (HOST:TCP_PORT as system.clusters
        names them) and their HTTP URLs, a dict or pairs; default: each host, the
        target's port.
    :param shard_by: a Distributed table: "auto" (rows by its sharding key) or "file"
        (whole files by weight).
    :param cluster: with follow of a postgresql:// or mysql:// table into a server: a
        table that does not exist is made on this cluster (system.clusters): a
        ReplacingMergeTree ``<table>_local`` on every shard and the Distributed table
        over them, sharded by cityHash64 of the key (docs/target-cluster.md).
    :param after_last_key: s3://, gs://, az://: list each prefix only after the greatest key
        already loaded under it (S3 StartAfter), for buckets whose keys grow in order (dates,
        sequence numbers); an object added or changed under an earlier key is then not
        seen. Default: the whole prefix is listed.
    :param on_new_column: a file naming a column the table lacks (a CSV/TSV header,
        Parquet/ORC/Avro/Arrow, JSON lines): "fail" it (the default), "add" the column
        (``Nullable(T)``, T as the file gives it; on every shard of a cluster) and load it,
        or "ignore" the column and load the others. With add or ignore a file may lack
        table columns (NULL or their default). Each added column is in
        ``report.schema_changes`` and the run's record in ``chload.runs``.
    :param upsert_key: keep the latest row of each key: the key's columns (``"id"``,
        ``"tenant,id"``); the table chload creates is a ``ReplacingMergeTree`` ordered by
        them; an existing table (a cluster: each shard's local one) must be one. Read the
        latest with ``SELECT ... FINAL``: older versions stay until a background merge.
    :param version: with upsert_key: the column whose greatest value wins (default: the
        row loaded last).
    :param mode: "append" (the default): units add rows. "replace-partitions": each
        unit's partitions replace the table's (REPLACE PARTITION under the commit lock,
        with the ledger entry), so a re-exported day file replaces that day; a changed
        file is loaded again rather than refused; the table must have a PARTITION BY
        (or be created with ``partition_by``). "replace-table": every unit listed into a
        new table, swapped in for the table at the end in one statement; the ledger's
        earlier units of the table are superseded. docs/modes.md.
    :param poll: files with follow: seconds between listings (default 30); each poll
        is a ``poll`` Event (``event.poll``: files, rows, listing calls, changed files).
    :param listener: called with each progress `Event` (plan, start, progress, done,
        skip, fail, lag, poll).
    :param metrics_port: serve the load's metrics (OpenMetrics, for Prometheus) on
        http://127.0.0.1:PORT/metrics while it runs (docs/metrics.md); loads of one
        process given the same port share it.
    :return: what the load did; ``report.ok`` is False when a file failed.

    A flag only some kinds of source read (query, incremental_by, follow, poll,
    batch_rows, batch_seconds, kafka_options, after_last_key) is refused when no source
    of the load reads it.
    """
    spec = _spec_of("load", sources, locals())
    steps.refuse_unread(spec, {name for pattern in spec.sources
                          for name in registry.source_for(pattern).options})
    port = options.optional_whole("metrics_port", metrics_port)
    with metrics.observed(port, spec.table, _source_label(spec), listener) as observed:
        return _load(spec, observed)


def planned(sources: Sources, table: str, given: dict[str, Any]) -> LoadSpec:
    """The LoadSpec `load(sources, table=table, **given)` would run, checked as `load`
    checks it (values; an option no source of the load reads), touching nothing: a
    pipelines file's load (chload/pipelines). `given` holds LoadSpec fields only."""
    spec = _spec("load", sources, table, given)
    steps.refuse_unread(spec, {name for pattern in spec.sources
                          for name in registry.source_for(pattern).options})
    return spec


def where(target: TargetName) -> tuple[str, str | None]:
    """A target as shown (no password) and, for an embedded one, its directory made
    absolute (None: a server): which loads share one engine in a process."""
    spec = queries.target_spec(options.optional_path("target", target))
    return spec.display, None if spec.url is not None else os.path.abspath(spec.where)


@contextlib.contextmanager
def shared_target(target: TargetName) -> Iterator[Target]:
    """An embedded target opened once for loads that run at once in this process
    (`load_on`): chDB holds one engine path a process, and the directory's lock one
    opening of it."""
    opened = open_target(queries.target_spec(options.optional_path("target", target)))
    try:
        yield opened
    finally:
        with contextlib.suppress(ChloadError):  # each load's report has its errors
            opened.close()


def load_on(opened: Target, spec: LoadSpec, *, listener: Listener | None = None,
            metrics_port: int | None = None) -> LoadReport:
    """`load(spec)` into a target already open (`shared_target`), left open."""
    with metrics.observed(metrics_port, spec.table, _source_label(spec), listener) as observed:
        early = begin_early(spec)
        try:
            report = load_into(spec, opened, observed)
        finally:
            early()
    try:  # its `loaded` events now, not when the last load sharing the target ends
        opened.flush()
    except ChloadError as exc:
        if not report.errors:
            report.errors.append(f"{exc}: {UNWRITTEN_LOADED}")
    return report


def _source_label(spec: LoadSpec) -> str:
    """The load's sources as a metrics label: as shown in its record, never a secret."""
    return ",".join(metrics.without_secrets(registry.display(p)) for p in spec.sources)


def _load(spec: LoadSpec, listener: Listener | None) -> LoadReport:
    """`load` of a spec: the target opened, loaded into and closed."""
    early = begin_early(spec)
    try:  # (a database's snapshot is taken while the target opens)
        with _stopped_by_signals(spec) as stop:
            opened = open_target(queries.target_spec(spec.target))
            try:
                report = load_into(spec, opened, listener, stop)
            except BaseException:
                opened.close(failed=True)  # a directory made for it: removed
                raise
            _close_reported(opened, report)
            return report
    finally:
        early()


@contextlib.contextmanager
def _stopped_by_signals(spec: LoadSpec) -> Iterator[threading.Event]:
    """Files that follow: SIGINT and SIGTERM, from before the target opens, end the run
    after the units in flight (core/follow.py `on_signals`). A Kafka stream sets its own."""
    stop = threading.Event()
    if not spec.follow or registry.stream_of(spec.sources) is not None:
        yield stop
        return
    with following.on_signals(stop):
        yield stop


def _close_reported(target: Target, report: LoadReport) -> None:
    """Close the target after a load; its error (the `loaded` events it writes last, to
    a server gone) is the report's, as the run's last writes' are (core/finish.py): the
    report says what was committed, and says it once."""
    try:
        target.close()
    except ChloadError as exc:
        if not report.errors:
            report.errors.append(f"{exc}: {UNWRITTEN_LOADED}")


def follows(*, target: TargetName = None, max_retained: int | None = None,
            drop: str | None = None, shards: Pairs = ()) -> list[dict[str, Any]]:
    """Each table the target follows (--follow of a database table): its source, slot,
    position, lag in bytes and seconds, the WAL its slot retains, and a warning above
    `max_retained` bytes (default 10 GB).

    :param target: as `load`'s; the target must exist.
    :param max_retained: bytes of WAL a slot may retain before the warning.
    :param drop: a followed table (``name`` or ``db.name``): drop its replication slot
        at the source (the table keeps its rows; follow into a new table to start again).
    :param shards: the replicas and URLs of the target's Distributed tables, as `load`'s:
        a follow into a cluster is read from its shards' ledgers.
    """
    with queries.opened(target) as t:
        return registry.follows(t, os.environ, max_retained, drop,
                                options.settings("shards", shards))


def validate(sources: Sources | LoadSpec, *, table: str | None = None,
             target: TargetName = None, format: str | None = None,
             compression: str | None = None, schema: str | None = None,
             max_errors: int | None = None, max_error_ratio: float | None = None,
             s3_endpoint: str | None = None) -> list[FileCheck]:
    """Parse every row of every source against the table's (or the inferred) schema,
    as `load` with the same options would; write nothing (core/validate.py).

    :param sources: as `load`'s; or the LoadSpec a load would be given (its options
        that only shape a load, such as order_by or workers, change nothing here).
    :param table: the table whose columns the rows must fit; if it does not exist, the
        columns a load would create.
    :param target: as `load`'s.
    :param format: as `load`'s.
    :param compression: as `load`'s.
    :param schema: as `load`'s.
    :param max_errors: the error budget of `load`'s of the same name.
    :param max_error_ratio: the error budget of `load`'s of the same name.
    :param s3_endpoint: as `load`'s.
    :return: one FileCheck a file: rows that parse, rows that do not, the first errors,
        and whether a load with that error budget would take the file.
    """
    spec = _spec_of("validate", sources, locals())
    steps.refuse_unread(spec, {name for pattern in spec.sources
                          for name in registry.source_for(pattern).options})
    return _validate(spec)


def _validate(spec: LoadSpec) -> list[FileCheck]:
    """validate() of a spec: the target (or a scratch one), its sources listed, each
    file checked (core/validate.py)."""
    from chload.core.validate import check_files

    with _validating(spec.target) as t:
        name = planner.parse_table(spec.table, steps.default_database(t))
        existing = t.table_columns(name.sql)
        context = source_context(spec, t)
        run_sources = RunSources(context, registry)
        try:
            listed = steps.list_sources(spec, run_sources)
            with engine_credentials(context):
                return check_files(t, spec, name, existing, run_sources, listed)
        finally:
            run_sources.close()


@contextlib.contextmanager
def _validating(target: str | None) -> Iterator[Target]:
    """The target to validate against: the named one if it exists; an embedded one not
    made yet (before the first load) is a scratch directory, removed after (no table
    there: the data's own columns are checked)."""
    import shutil
    import tempfile

    spec = queries.target_spec(target, create=False)
    if spec.url is not None or os.path.isdir(spec.where):
        with queries.opened(target) as t:
            yield t
        return
    scratch = tempfile.mkdtemp(prefix="chload-validate-")
    try:
        t = open_target(TargetSpec(scratch))
        try:
            yield t
        finally:
            t.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
