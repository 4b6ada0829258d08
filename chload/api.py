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
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import MISSING, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from chload import formats
from chload.commit.ledger import COMMITTING, FileEvent, own_history
from chload.commit.rejects import ErrorBudget
from chload.core import options
from chload.core import plan as planner
from chload.core import run as runner
from chload.core.finish import (
    _check_settings,
    _finish,
    _job_settings,
    _refuse,
    _run_record,
    _summarize,
    _threads_per_file,
)
from chload.core.report import (
    Concurrency,
    Costs,
    LoadReport,
    LoadSpec,
    OnError,
    Pairs,
    Saturation,
    ServerSaturation,
    Settings,
    ShardBy,
    ShardLoad,
    Sources,
    StreamChange,
    TargetName,
    concurrency_of,
    costs_of,
    saturation_of,
    shards_of,
)
from chload.core.run import Event, FileResult, Listener
from chload.errors import UsageError
from chload.runtime.adaptive import MAX_STREAMS, Controller
from chload.runtime.monitor import Monitor
from chload.sources import registry
from chload.sources.base import SourceContext, SourceFile, Stream
from chload.sources.registry import kind_of
from chload.sources.run import RunSources
from chload.targets.base import LoadJob, Target
from chload.targets.registry import TargetSpec, open_target

if TYPE_CHECKING:
    from chload.core.validate import FileCheck as FileCheck

__all__ = ["load", "validate", "files", "sql", "history", "errors", "run_files", "LoadSpec",
           "LoadReport", "FileResult", "FileEvent", "FileCheck", "Event", "Listener",
           "Saturation", "Concurrency", "StreamChange", "Costs", "ShardLoad",
           "ServerSaturation", "Sources", "TargetName", "Settings"]


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
         shard_by: ShardBy = "auto", listener: Listener | None = None) -> LoadReport:
    """Load files into a table, exactly once per file; the options are the CLI's flags
    (`--max-errors` is `max_errors`). A wrong value is a UsageError naming the option.

    :param sources: files, directories, globs, ``-`` (stdin) or URLs (s3://, hdfs://,
        http(s)://, kafka://, postgresql://, mysql://): a str or pathlib.Path, or a list of
        them; or a LoadSpec, then with no other option (``listener`` aside).
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
    :param follow: kafka://: keep loading new messages until SIGINT/SIGTERM.
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
    :param listener: called with each progress `Event` (plan, start, progress, done,
        skip, fail, lag).
    :return: what the load did; ``report.ok`` is False when a file failed.

    A flag only some kinds of source read (query, incremental_by, follow, batch_rows,
    batch_seconds, kafka_options) is refused when no source of the load reads it.
    """
    spec = _spec_of("load", sources, locals())
    _refuse_unread(spec, {name for pattern in spec.sources
                          for name in registry.source_for(pattern).options})
    early = _begin_early(spec)
    try:  # (a database's snapshot is taken while the target opens)
        opened = open_target(_target_spec(spec.target))
        try:
            return _load_into(spec, opened, listener)
        finally:
            opened.close()
    finally:
        early()


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
    _refuse_unread(spec, {name for pattern in spec.sources
                          for name in registry.source_for(pattern).options})
    return _validate(spec)


# LoadSpec fields only some kinds of source read (Source.options): flag, who reads it.
_SOURCE_OPTIONS = {"query": ("--query", "a postgresql:// or mysql:// source"),
                   "incremental_by": ("--incremental-by", "a postgresql:// or mysql:// source"),
                   "follow": ("--follow", "a kafka:// source"),
                   "batch_rows": ("--batch-rows", "a kafka:// source"),
                   "batch_seconds": ("--batch-seconds", "a kafka:// source"),
                   "kafka_options": ("--kafka-option", "a kafka:// source")}


def _refuse_unread(spec: LoadSpec, read: Collection[str]) -> None:
    """A field of `_SOURCE_OPTIONS` given while no source of the load reads it (`read`:
    the fields its sources read): a UsageError naming the flag, before anything opens."""
    for name, (flag, who) in _SOURCE_OPTIONS.items():
        if getattr(spec, name) != _UNSET[name] and name not in read:
            raise UsageError(f"{flag}: only for {who}; no source of this load reads it")

def _begin_early(spec: LoadSpec) -> Callable[[], None]:
    """A PostgreSQL source's session begun while the target opens (sources/databases/
    early.py), and its cleanup. Imported only for such a URL: files do not need it."""
    pattern = spec.sources[0] if len(spec.sources) == 1 else ""
    if "://" not in pattern or registry.SCHEMES.get(pattern.split("://")[0].lower()) != "postgres":
        return lambda: None  # MySQL/MariaDB: begun where the run lists (early.py says why)
    from chload.sources.databases import early as db_early
    from chload.sources.databases.base import DatabaseSource

    source = registry.source_for(pattern)
    assert isinstance(source, DatabaseSource)
    return db_early.begin(pattern, source, SourceContext(
        select=spec.query, incremental_by=spec.incremental_by, workers=spec.workers, pipes=True))


def _target_spec(target: str | None, create: bool = True) -> TargetSpec:
    """--target (else $CHLOAD_TARGET, else the default) and the server password
    ($CLICKHOUSE_PASSWORD, where the URL has none), read here once for the whole run."""
    return TargetSpec.resolve(target, os.environ, create)


def _load_into(spec: LoadSpec, target: Target, listener: Listener | None = None) -> LoadReport:
    """`load` into a target already open (kept open): any `targets.Target`, e.g. the
    unit tests' in-memory one. `spec.target` is not looked at."""
    stream = registry.stream_of(spec.sources)
    if stream is not None:  # a stream: its units round by round
        return _load_stream(spec, target, listener or (lambda event: None), stream)
    # A pipe is read once: not where rejected rows are read again (an error budget)
    pipes = target.reads_pipes and not spec.budget.allows_errors
    context = replace(_source_context(spec, target), pipes=pipes)
    sources = RunSources(context, registry)
    try:
        listed = _list_sources(spec, sources)
        with _engine_credentials(context):
            return _load(spec, target, sources, listed, listener or (lambda event: None))
    finally:
        sources.close()  # what listing made, and what a source kept for the run


def _load_stream(spec: LoadSpec, target: Target, listener: Listener,
                 stream: Stream) -> LoadReport:
    """A stream's load (a Kafka topic): each round's units through `_load`, one run."""
    started_ns, clock = time.time_ns(), time.monotonic()
    table = planner.parse_table(spec.table, _default_database(target))
    report = LoadReport(table.display, target.display, os.urandom(6).hex())
    sources = RunSources(_source_context(spec, target), registry)  # spooled units: local files
    added = stream.audit_columns if spec.audit else None
    try:
        stream.rounds(spec, target, listener, lambda units, workers, schema: _load(
            replace(spec, workers=spec.workers or workers, schema=schema or spec.schema),
            target, sources, units, listener, run_id=report.run_id, record=False,
            added=added), table, report)
    finally:
        sources.close()
    report.seconds = time.monotonic() - clock
    _finish(target, _run_record(spec, report, started_ns, sources))
    return report


def _load(spec: LoadSpec, target: Target, sources: RunSources, listed: list[SourceFile],
          listener: Listener, run_id: str = "", record: bool = True,
          added: planner.AddColumns | None = None) -> LoadReport:
    """Into `target`, or into each shard of its Distributed table (targets/cluster.py)."""
    table = planner.parse_table(spec.table, _default_database(target))
    with target.for_table(table.sql, spec.shards, spec.shard_by, os.environ) as t:
        report = _load_table(spec, t, table, sources, listed, listener, run_id, record,
                             added)
        report.shards = shards_of(t.shard_report())
        return report


def _load_table(spec: LoadSpec, target: Target, table: planner.TableName, sources: RunSources,
                listed: list[SourceFile], listener: Listener, run_id: str = "",
                record: bool = True, added: planner.AddColumns | None = None) -> LoadReport:
    started_ns, clock = time.time_ns(), time.monotonic()
    _check_settings(target, spec.settings)
    report = LoadReport(table.display, target.display, run_id or os.urandom(6).hex())
    untold = [(f, formats.untold(f.uri)) for f in listed if not f.format.name]
    listed = [f for f in listed if f.format.name]
    existing = target.table_columns(table.sql)
    described = sources.columns(listed)  # a source that knows its columns: no inference
    files = planner.resolve_format(target, listed, planner.known_names(existing, spec.schema),
                                   forced=spec.format is not None or described is not None,
                                   delimiter=dict(spec.settings).get("format_csv_delimiter"))
    report.recovered = target.recover(table.sql)
    state = target.ledger.table_state(table.database, table.name)
    loaded, report.table_reset = own_history(state,
                                                     target.ledger.loaded(table.display))
    plan = planner.decide(files, loaded, spec.force)
    refused = _refuse(target, table, untold, report.run_id, listener)
    settings = (*_job_settings(spec), *planner.csv_settings(files, spec.settings))
    if plan.to_load:
        columns, read_columns, created = planner.prepare_table(
            target, table, plan.to_load, existing=existing, schema=spec.schema,
            order_by=spec.order_by or sources.sorting_key(plan.to_load),
            partition_by=spec.partition_by, audit=spec.audit, budget=spec.budget,
            described=described, sources=sources, added=added,
            dates_told="date_time_input_format" in dict(spec.settings),
        )
        if not state.exists:
            state = target.ledger.table_state(table.database, table.name)
        checked = planner.check_headers(target, table, plan.to_load,
                                        existing or columns, read_columns, spec.audit,
                                        named=planner.reads_by_name(spec.schema,
                                                                    spec.settings),
                                        settings=spec.settings)
        to_load, settings = checked.files, (*checked.settings, *settings)
        refused += _refuse(target, table, checked.refused, report.run_id, listener)
        if refused and spec.on_error == "abort":
            refused += [FileResult(f.uri, "not-started") for f in to_load]
            to_load = []
        plan = replace(plan, to_load=to_load, columns=columns, read_columns=read_columns,
                       created_table=created)
        sources.stored(columns, read_columns, target.engine_name, spec.budget.allows_errors)
    target.ledger.stamp(table.display, state.uuid)
    listener(Event("plan", files_total=len(plan.to_load),
                   bytes_total=sum(f.size for f in plan.to_load)))
    estimate = target.default_workers(plan.to_load)
    workers = spec.workers or estimate
    adapt = Controller(workers, workers, fixed=spec.workers is not None)
    groups = _groups(target, sources, plan.to_load, spec.budget, workers)
    threads = _threads_per_file(workers, len(groups))
    jobs = [LoadJob(file=group[0], table=table.sql, table_display=table.display,
                    columns=plan.columns, read_columns=plan.read_columns, audit=spec.audit,
                    settings=settings, run_id=report.run_id, budget=spec.budget,
                    batch=group if len(group) > 1 else (), threads=threads)
            for group in groups]
    if spec.workers is None:
        adapt.bounded(MAX_STREAMS)  # the target bounds it by what it knows (its cores)
    in_flight = target.open_streams(workers, None if adapt.fixed else adapt)
    monitor = Monitor(target.workdir).start()
    try:
        results = runner.run(target, jobs, in_flight, listener,
                             abort_on_error=spec.on_error == "abort", changed=plan.changed,
                             sources=sources)
    finally:
        adapt.finished.set()
    report.saturation = saturation_of(monitor.stop().to_dict()) if jobs else None
    report.concurrency = concurrency_of(adapt.summary()) if jobs else None
    report.costs = costs_of(target.cost_report()) if jobs else None
    results += refused + [FileResult(f.uri, "skipped") for f in plan.skipped]
    results += [FileResult(uri, "failed", error=why, changed=True)
                for uri, why in plan.refused.items()]
    _summarize(report, results, plan, time.monotonic() - clock)
    if record:
        _finish(target, _run_record(spec, report, started_ns, sources))
    return report


def _default_database(target: Target) -> str:
    """What a bare table name means: a server target's URL may name a database."""
    return target.database


def _groups(target: Target, sources: RunSources, files: Sequence[SourceFile],
            budget: ErrorBudget, workers: int) -> list[tuple[SourceFile, ...]]:
    """Files grouped into batches where the target can load several as one; a unit its
    source commits alone (Source.loads_alone: a database range) in a group of its own."""
    alone = [f for f in files if sources.loads_alone(f)]
    rest = [f for f in files if not sources.loads_alone(f)] if alone else files
    return [(f,) for f in alone] + (target.plan_batches(rest, budget, workers) if rest else [])


def _source_context(spec: LoadSpec, target: Target) -> SourceContext:
    """What listing needs, resolved here once: S3 settings from the environment and
    --s3-endpoint (only when a source is s3://: resolving reads ~/.aws, may import
    botocore), and the engine that lists HDFS: the target's, as chDB allows one engine
    path per process (hdfs.py)."""
    s3 = None
    if any(kind_of(s) == "s3" for s in spec.sources):
        from chload.sources.files import aws

        s3 = aws.resolve(os.environ, spec.s3_endpoint)
    return SourceContext(format=spec.format, compression=spec.compression,
                         workdir=os.path.join(target.workdir, "tmp"),
                         s3=s3, query=target.infer_rows, patterns=spec.sources,
                         select=spec.query, incremental_by=spec.incremental_by,
                         force=spec.force, workers=spec.workers,
                         key_order=target.wants_key_order, schema=spec.schema,
                         committed=lambda: _committed(spec, target))


def _committed(spec: LoadSpec, target: Target) -> dict[str, str]:
    """uri -> identity of the units the ledger has committed into the spec's table as it
    is now (own_history), `committing` ones included: recovery, before any load, settles
    each of them loaded (the mark rule)."""
    table = planner.parse_table(spec.table, _default_database(target))
    events = dict(target.ledger.loaded(table.display))
    events.update((e.uri, e) for e in target.ledger.latest(table.display, [COMMITTING]))
    own, _ = own_history(target.ledger.table_state(table.database, table.name),
                                 events)
    return {uri: e.identity for uri, e in own.items()}


def _engine_credentials(context: SourceContext) -> contextlib.AbstractContextManager[None]:
    """The S3 credentials handed to the engine while it reads (aws.hand_to_engine)."""
    if context.s3 is None:
        return contextlib.nullcontext()
    from chload.sources.files import aws

    return aws.hand_to_engine(context.s3.credentials, os.environ)


def _list_sources(spec: LoadSpec, sources: RunSources) -> list[SourceFile]:
    """Every file the sources name, each once (by uri), in the order named; all of
    them listed before anything loads, so a pattern that matches nothing stops the run.
    Each source is listed by this run's object for its kind (RunSources), which
    releases what listing made (stdin's spool, links) when the caller closes it."""
    if spec.sources.count("-") > 1:
        raise UsageError("-: standard input can be read once; name - once")
    for pattern in spec.sources:
        sources.of(pattern)  # unknown schemes, before anything is listed
    _refuse_unread(spec, sources.options())
    files: dict[str, SourceFile] = {}
    for pattern in spec.sources:
        for f in sources.list(pattern):
            if f.uri in files:
                sources.release([f])  # another spelling of a file named already
            else:
                files[f.uri] = f
    return _told(list(files.values()), sources)


def _told(files: list[SourceFile], sources: RunSources) -> list[SourceFile]:
    """The files, less those whose name does not tell their format and that hold
    nothing (Spark's _SUCCESS). The others stay, to fail alone (_load_table): a
    directory's README.txt must not stop its data loading, nor vanish unreported. If no
    file tells its format (an empty one named alone too), the run stops, as for one
    file named."""
    untold = [f for f in files if not f.format.name]
    if untold and len(untold) == len(files):
        raise UsageError(formats.untold(untold[0].uri))
    marks = [f for f in untold if f.size == 0 and not f.is_stream]
    sources.release(marks)
    return [f for f in files if f not in marks]


def files(table: str, *, target: TargetName = None,
          shards: Pairs = ()) -> list[FileEvent]:
    """The ledger: each file's latest state for a table.

    :param table: ``name`` or ``db.name``.
    :param target: as `load`'s; the target must exist.
    :param shards: a Distributed table's replicas and URLs, as `load`'s; its ledger has
        each file's state on each shard, `target_table` naming the shard.
    """
    name = options.text("table", table)
    planner.parse_table(name)
    with _opened(target) as t:
        table_name = planner.parse_table(name, _default_database(t))
        with t.for_table(table_name.sql, options.settings("shards", shards), "auto",
                         os.environ) as c:
            return c.ledger.latest(table_name.display)


def sql(query: str, *, target: TargetName = None, format: str = "TSV") -> str:
    """Run SQL against the target and return the engine's answer as text.

    :param query: any SQL statement.
    :param target: as `load`'s; the target must exist.
    :param format: any ClickHouse output format: TSV, JSON, CSV, PrettyCompact ...
    """
    query, format = options.text("query", query), options.text("format", format)
    with _opened(target) as t:
        return t.text(query, format)


def history(table: str | None = None, *, target: TargetName = None,
            limit: int = 50) -> Sequence[dict[str, Any]]:
    """One entry per run of `load`, newest first, as the ledger records it.

    :param table: only the runs into this table; None: every table's.
    :param target: as `load`'s; the target must exist.
    :param limit: runs at most.
    """
    table, limit = options.optional_text("table", table), options.whole("limit", limit)
    if table:
        planner.parse_table(table)
    with _opened(target) as t:
        name = planner.parse_table(table, _default_database(t)).display if table else None
        return t.ledger.runs(name, limit)


def errors(table: str, *, target: TargetName = None,
           limit: int = 10_000) -> list[dict[str, Any]]:
    """Rejected rows of a table's current loads: file, line, error, raw.

    :param table: ``name`` or ``db.name``.
    :param target: as `load`'s; the target must exist.
    :param limit: rows at most.
    """
    from chload.commit import rejects

    name, limit = options.text("table", table), options.whole("limit", limit)
    planner.parse_table(name)
    with _opened(target) as t:
        return rejects.listing(t, planner.parse_table(name, _default_database(t)).display,
                               limit)


def run_files(run_id: str, *, target: TargetName = None) -> list[FileEvent]:
    """Per-file detail of one run: the final event of each file it touched.

    :param run_id: a run's id, as `history` and LoadReport.run_id give it.
    :param target: as `load`'s; the target must exist.
    """
    run_id = options.text("run_id", run_id)
    with _opened(target) as t:
        return t.ledger.of_run(run_id)


@contextlib.contextmanager
def _opened(target: object) -> Iterator[Target]:
    """An existing target, for commands that only read; closed after."""
    t = open_target(_target_spec(options.optional_path("target", target), create=False))
    try:
        yield t
    finally:
        t.close()


def _validate(spec: LoadSpec) -> list[FileCheck]:
    """validate() of a spec: the target (or a scratch one), its sources listed, each
    file checked (core/validate.py)."""
    from chload.core.validate import check_files

    with _validating(spec.target) as t:
        name = planner.parse_table(spec.table, _default_database(t))
        existing = t.table_columns(name.sql)
        context = _source_context(spec, t)
        run_sources = RunSources(context, registry)
        try:
            listed = _list_sources(spec, run_sources)
            with _engine_credentials(context):
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

    spec = _target_spec(target, create=False)
    if spec.url is not None or os.path.isdir(spec.where):
        with _opened(target) as t:
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
