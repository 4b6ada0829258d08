"""The public Python API: `load()`, `LoadSpec`, `LoadReport`; `files()`, `sql()`.

    report = chload.load(["data/*.csv.gz"], table="trips")
    print(report.rows_loaded, report.files_failed)

The CLI is a thin skin over these functions; nothing here prints. Progress goes to an
optional listener as `Event`s.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    """`FileCheck`, from core/validate.py when first asked for: a load does not import it."""
    if name == "FileCheck":
        from chload.core.validate import FileCheck

        return FileCheck
    raise AttributeError(f"module 'chload.api' has no attribute {name!r}")


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Everything a load needs, validated once; flags, env and code all end here."""

    sources: tuple[str, ...]
    table: str
    target: str | None = None  # a directory or http(s)://...; None: $CHLOAD_TARGET, ./chload-data
    format: str | None = None  # any ClickHouse input format name; default: from the file name
    compression: str | None = None  # gzip, zstd, ...; default: from the file name
    schema: str | None = None  # 'a UInt32, b String': how to read the data / create the table
    order_by: str | None = None
    partition_by: str | None = None
    audit: bool = False  # add _source_file and _loaded_at, computed by the engine
    settings: tuple[tuple[str, str], ...] = ()  # ClickHouse settings for every INSERT
    workers: int | None = None  # parallel files; None or 'auto': sized by the target, and
    #                             into a server adapted while loading (adaptive.py)
    force: bool = False  # load files the ledger says are loaded already
    on_error: str = "continue"  # continue | abort
    s3_endpoint: str | None = None  # S3-compatible endpoint; None: AWS_ENDPOINT_URL(_S3), AWS
    max_errors: int | None = None  # bad rows a file may have; they go to chload.rejects
    max_error_ratio: float | None = None  # bad rows / all rows a file may have
    kafka_options: tuple[tuple[str, str], ...] = ()  # librdkafka settings; values may be ${VAR}
    follow: bool = False  # kafka://: keep loading until SIGINT/SIGTERM
    batch_rows: int | None = None  # kafka://: messages per unit at most (default 500,000)
    batch_seconds: float | None = None  # kafka:// --follow: a unit at least this often
    query: str | None = None  # a database source: load this query's rows (one unit)
    incremental_by: str | None = None  # a database source: load rows above the ledger's mark
    shards: tuple[tuple[str, str], ...] = ()  # a cluster's replica HOST:TCP_PORT -> its URL
    shard_by: str = "auto"  # a Distributed table: auto (rows by its key) or file

    def __post_init__(self) -> None:
        for name, convert in _SPEC_TYPES.items():  # a Path, a dict of settings, ...
            object.__setattr__(self, name, convert(name, getattr(self, name)))
        if not self.sources:
            raise UsageError("nothing to load: name at least one file, directory, glob or -")
        if self.on_error not in ("continue", "abort"):
            raise UsageError(f"--on-error {self.on_error}: use continue or abort")
        planner.validate_options(self.compression, self.workers)
        planner.parse_table(self.table)
        if self.max_errors is not None and self.max_errors < 0:
            raise UsageError(f"--max-errors {self.max_errors}: must be 0 or more")
        if self.max_error_ratio is not None and not 0 <= self.max_error_ratio <= 1:
            raise UsageError(f"--max-error-ratio {self.max_error_ratio}: must be in [0, 1]")
        if self.batch_rows is not None and self.batch_rows < 1:
            raise UsageError(f"--batch-rows {self.batch_rows}: must be 1 or more")

    @property
    def budget(self) -> ErrorBudget:
        return ErrorBudget(self.max_errors, self.max_error_ratio)


# What each LoadSpec field may be given as, and the one type it holds (options.py).
_SPEC_TYPES = {
    "sources": options.sources, "table": options.text, "target": options.optional_path,
    "format": options.optional_text, "compression": options.optional_text,
    "schema": options.optional_text, "order_by": options.optional_text,
    "partition_by": options.optional_text, "audit": options.flag,
    "settings": options.settings, "workers": options.workers, "force": options.flag,
    "on_error": options.text, "s3_endpoint": options.optional_text,
    "max_errors": options.optional_whole, "max_error_ratio": options.optional_ratio,
    "kafka_options": options.settings, "follow": options.flag,
    "batch_rows": options.optional_whole, "batch_seconds": options.optional_seconds,
    "query": options.optional_text, "incremental_by": options.optional_text,
    "shards": options.settings, "shard_by": options.text,
}
Sources = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
TargetName = str | os.PathLike[str] | None


def _spec(function: str, sources: object, table: object, given: dict[str, Any]) -> LoadSpec:
    """The LoadSpec of a call's arguments; an unknown keyword is a UsageError listing
    the options."""
    names = [f.name for f in fields(LoadSpec) if f.name not in ("sources", "table")]
    options.no_unknown(function, given, names)
    if table is None:
        raise UsageError(f"{function}() needs table=, e.g. table='trips'")
    return LoadSpec(sources=sources, table=table, **given)  # type: ignore[arg-type]


@dataclass(slots=True)
class LoadReport:
    """What a load did. `ok` is False when any file failed."""

    table: str
    target: str
    run_id: str
    files_total: int = 0
    files_loaded: int = 0
    files_skipped: int = 0
    files_failed: int = 0
    files_changed: int = 0  # loaded before under another identity: failed, or --force
    table_reset: str = ""  # why the ledger's earlier loads into the table were set aside
    rows_loaded: int = 0
    rows_rejected: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    created_table: bool = False
    recovered: int = 0
    saturation: dict = field(default_factory=dict)  # CPU, disk, network; see monitor.py
    concurrency: dict = field(default_factory=dict)  # streams: mode, range, changes, bound
    costs: dict = field(default_factory=dict)  # a server: fixed and per-unit costs (cost_report)
    shards: list[dict] = field(default_factory=list)  # a cluster: per shard rows, bytes, s
    notes: list[str] = field(default_factory=list)  # worth knowing, not errors (slow paths)
    files: list[FileResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.files_failed == 0

    @property
    def rows_per_second(self) -> float:
        return self.rows_loaded / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["rows_per_second"] = round(self.rows_per_second, 1)
        data["seconds"] = round(self.seconds, 3)
        return data


def load(sources: Sources | LoadSpec, table: str | None = None, *,
         listener: Listener | None = None, **options: object) -> LoadReport:
    """Load files into a table, exactly once per file. See LoadSpec for the options.

    Sources and target may be str or pathlib.Path; settings a dict or (name, value)
    pairs. A wrong type or an unknown option is a UsageError naming it.
    """
    spec = sources if isinstance(sources, LoadSpec) else _spec("load", sources, table, options)
    early = _begin_early(spec)
    try:  # (a database's snapshot is taken while the target opens)
        target = open_target(_target_spec(spec.target))
        try:
            return _load_into(spec, target, listener)
        finally:
            target.close()
    finally:
        early()


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
        report.shards = t.shard_report()
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
    report.saturation = monitor.stop().to_dict() if jobs else {}
    report.concurrency = adapt.summary() if jobs else {}
    report.costs = target.cost_report() if jobs else {}
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


# LoadSpec fields only some kinds of source read (Source.options): flag, who reads it.
_SOURCE_OPTIONS = {"query": ("--query", "a postgresql:// or mysql:// source"),
                   "incremental_by": ("--incremental-by", "a postgresql:// or mysql:// source")}


def _list_sources(spec: LoadSpec, sources: RunSources) -> list[SourceFile]:
    """Every file the sources name, each once (by uri), in the order named; all of
    them listed before anything loads, so a pattern that matches nothing stops the run.
    Each source is listed by this run's object for its kind (RunSources), which
    releases what listing made (stdin's spool, links) when the caller closes it."""
    if spec.sources.count("-") > 1:
        raise UsageError("-: standard input can be read once; name - once")
    for pattern in spec.sources:
        sources.of(pattern)  # unknown schemes, before anything is listed
    for name, (flag, who) in _SOURCE_OPTIONS.items():
        if getattr(spec, name) is not None and name not in sources.options():
            raise UsageError(f"{flag}: only for {who}; no source of this load reads it")
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


def files(table: str, target: TargetName = None, shards: object = (),
          **unknown: object) -> list[FileEvent]:
    """The ledger: each file's latest state for a table (a Distributed table's: each
    file's on each shard, `target_table` naming the shard; `shards` as LoadSpec's)."""
    options.no_unknown("files", unknown, ["table", "target", "shards"])
    name = options.text("table", table)
    planner.parse_table(name)
    with _opened(target) as t:
        table_name = planner.parse_table(name, _default_database(t))
        with t.for_table(table_name.sql, options.settings("shards", shards), "auto",
                         os.environ) as c:
            return c.ledger.latest(table_name.display)


def sql(query: str, target: TargetName = None, fmt: str = "TSV", **unknown: object) -> str:
    """Run SQL against the target and return the engine's formatted answer."""
    options.no_unknown("sql", unknown, ["query", "target", "fmt"])
    query, fmt = options.text("query", query), options.text("fmt", fmt)
    with _opened(target) as t:
        return t.text(query, fmt)


def history(table: str | None = None, target: TargetName = None, limit: int = 50,
            **unknown: object) -> Sequence[dict]:
    """One entry per run of `load` (newest first)."""
    options.no_unknown("history", unknown, ["table", "target", "limit"])
    table, limit = options.optional_text("table", table), options.whole("limit", limit)
    if table:
        planner.parse_table(table)
    with _opened(target) as t:
        name = planner.parse_table(table, _default_database(t)).display if table else None
        return t.ledger.runs(name, limit)


def errors(table: str, target: TargetName = None, limit: int = 10_000,
           **unknown: object) -> list[dict]:
    """Rejected rows of a table's current loads: file, line, error, raw."""
    from chload.commit import rejects

    options.no_unknown("errors", unknown, ["table", "target", "limit"])
    name, limit = options.text("table", table), options.whole("limit", limit)
    planner.parse_table(name)
    with _opened(target) as t:
        return rejects.listing(t, planner.parse_table(name, _default_database(t)).display,
                               limit)


def run_files(run_id: str, target: TargetName = None, **unknown: object) -> list[FileEvent]:
    """Per-file detail of one run: the final event of each file it touched."""
    options.no_unknown("run_files", unknown, ["run_id", "target"])
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


_VALIDATE_OPTIONS = ("target", "format", "compression", "schema", "max_errors",
                     "max_error_ratio", "s3_endpoint")


def validate(sources: Sources | LoadSpec, table: str | None = None, *,
             target: TargetName = None, format: str | None = None,
             compression: str | None = None, schema: str | None = None,
             max_errors: int | None = None, max_error_ratio: float | None = None,
             s3_endpoint: str | None = None, **unknown: object) -> list[FileCheck]:
    """Parse every row of every source against the table's (or the inferred) schema.

    Takes what load() takes: sources and table= with options, or the LoadSpec a load
    would be given (its options that only shape a load, such as order_by, workers or
    settings, change nothing here).

    Writes nothing to the table or the ledger: bad rows are counted by the engine into
    a temporary errors file, outside the target. With an error budget, each file says
    whether a load with that budget would take it, and inference is the load's. Before
    the first load into an embedded target (no directory yet) the data is checked in a
    scratch engine, removed after: nothing is left behind.
    """
    from chload.core.validate import check_files

    options.no_unknown("validate", unknown, _VALIDATE_OPTIONS)
    given = dict(target=target, format=format, compression=compression, schema=schema,
                 max_errors=max_errors, max_error_ratio=max_error_ratio,
                 s3_endpoint=s3_endpoint)
    if isinstance(sources, LoadSpec):
        if table is not None or any(v is not None for v in given.values()):
            raise UsageError("validate(): given a LoadSpec, put the table and options in it")
        spec = sources
    else:
        spec = _spec("validate", sources, table, given)
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
