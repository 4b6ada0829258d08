"""One run of a load: sources listed, the plan made, units run through the target,
the report summed. The API (api.py) opens the target and the sources and hands them
here; nothing in this module names a kind of source or target.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import MISSING, fields, replace

from chload import formats
from chload.commit.known import KnownUnits
from chload.commit.ledger import COMMITTING, FileEvent, TableState, own_history
from chload.commit.rejects import ErrorBudget
from chload.commit.swap import TableSwap
from chload.core import evolve, plan as planner, run as runner
from chload.core.finish import (
    _check_settings,
    _finish_reported,
    _job_settings,
    _refuse,
    _run_record,
    _summarize,
    _threads_per_file,
    versions_note,
)
from chload.core.reading import sniff
from chload.core.report import (
    LoadReport,
    LoadSpec,
    concurrency_of,
    costs_of,
    saturation_of,
    shards_of,
)
from chload.core.run import Event, FileResult, Listener
from chload.errors import SchemaError, UsageError, ValuesRefused
from chload.runtime.adaptive import MAX_STREAMS, Controller
from chload.runtime.monitor import Monitor
from chload.schema import Column
from chload.sources.base import Skipped, SourceFile
from chload.sources.run import RunSources
from chload.targets.base import LoadJob, Target

# The units a table holds by the ledger, for the table as it is now (load_table)
KnownOf = Callable[[TableState], tuple[KnownUnits, str]]

# What a LoadSpec field holds when the caller did not give it.
_UNSET: dict[str, object] = {f.name: f.default for f in fields(LoadSpec)
                             if f.default is not MISSING}

# LoadSpec fields only some kinds of source read (Source.options): flag, who reads it.
SOURCE_OPTIONS = {"query": ("--query", "a postgresql:// or mysql:// source"),
                   "incremental_by": ("--incremental-by", "a postgresql:// or mysql:// source"),
                   "follow": ("--follow", "a kafka://, postgresql://, mysql://, local, s3://,"
                              " az://, gs:// or hdfs:// source"),
                   "poll": ("--poll", "--follow of local, s3://, az://, gs:// or hdfs:// files"),
                   "batch_rows": ("--batch-rows", "a kafka:// or followed mysql:// source"),
                   "batch_seconds": ("--batch-seconds", "a kafka:// or followed mysql:// source"),
                   "kafka_options": ("--kafka-option", "a kafka:// source"),
                   "after_last_key": ("--after-last-key", "an s3://, az:// or gs:// source"),
                   "cluster": ("--cluster", "--follow of a postgresql:// or mysql:// table")}


def refuse_unread(spec: LoadSpec, read: Collection[str]) -> None:
    """A field of `SOURCE_OPTIONS` given while no source of the load reads it (`read`:
    the fields its sources read): a UsageError naming the flag, before anything opens."""
    for name, (flag, who) in SOURCE_OPTIONS.items():
        if getattr(spec, name) != _UNSET[name] and name not in read:
            raise UsageError(f"{flag}: only for {who}; no source of this load reads it")


def load_units(spec: LoadSpec, target: Target, sources: RunSources,
               listed: Iterable[SourceFile | Skipped], listener: Listener, run_id: str = "",
               record: bool = True, added: planner.AddColumns | None = None,
               known_of: KnownOf | None = None, recover: bool = True) -> LoadReport:
    """Into `target`, or into each shard of its Distributed table (targets/cluster/target.py).
    `known_of`, `recover`: as load_table's (a stream's rounds after its first)."""
    table = planner.parse_table(spec.table, default_database(target))
    with target.for_table(table.sql, spec.shards, spec.shard_by, os.environ) as t:
        if spec.mode == "replace-table":
            if t is not target:
                raise UsageError(f"--mode replace-table: {table.display} is a Distributed "
                                 "table, whose shards cannot be swapped at one instant; use "
                                 "--mode replace-partitions, or load each shard's table")
            return replace_table(spec, t, table, sources, listed, listener, run_id, record,
                                 added)
        if t is target:  # (a cluster is refused replace-table: nothing to settle)
            _swap_of(t, table).settle()
        report = load_table(spec, t, table, sources, listed, listener, run_id, record,
                             added, known_of=known_of, recover=recover)
        report.shards = shards_of(t.shard_report())
        return report


def _swap_of(target: Target, table: planner.TableName) -> TableSwap:
    return TableSwap(target, target.ledger, table.database, table.name, table.display,
                     exchange=target.engine_name == "chdb")


def replace_table(spec: LoadSpec, target: Target, table: planner.TableName,
                  sources: RunSources, listed: Iterable[SourceFile | Skipped],
                  listener: Listener, run_id: str = "", record: bool = True,
                  added: planner.AddColumns | None = None) -> LoadReport:
    """--mode replace-table: every unit listed into a new table of the same columns,
    swapped in for the table once all committed (commit/swap.py); any failure leaves the
    table as it was and drops the new one."""
    started_ns = time.time_ns()
    swap = _swap_of(target, table)
    swap.start_over()
    existed = target.table_columns(table.sql) is not None
    if existed:  # (a commit an earlier run left is settled into the old table, not the new)
        target.recover(table.sql)
        target.command(f"CREATE TABLE {swap.new} AS {table.sql}")
    new = planner.TableName(table.database, swap.new_name)
    inner = replace(spec, table=new.display, force=True, mode="append")
    report = load_table(inner, target, new, sources, listed, listener, run_id, False, added)
    report.table = table.display
    made = target.table_columns(new.sql) is not None
    if report.files_failed or report.errors or not made:
        swap.drop(swap.new_name)
        report.errors += [f"--mode replace-table: {table.display} was left as it was (not "
                          f"every unit loaded; the new table was dropped): fix what failed "
                          "and run the same command again"] if made else []
    else:
        target.flush()  # (the run's units, as the swap's record reads them)
        swap.swap(report.run_id, existed)
        n = report.files_loaded
        report.notes += [f"--mode replace-table: {table.display} now holds this run's "
                         f"{n} unit{'s' if n != 1 else ''} only, swapped in at once"]
    if record:
        _finish_reported(target, report, _run_record(spec, report, started_ns, sources))
    return report


def _check_partitioned(target: Target, table: planner.TableName,
                       existing: list[Column] | None, partition_by: str | None) -> None:
    """--mode replace-partitions replaces whole partitions: the table (each shard's) must
    have a PARTITION BY, or be created with --partition-by."""
    if existing is None:
        if not partition_by:
            raise UsageError(f"table {table.display}: --mode replace-partitions replaces "
                             "whole partitions and the table does not exist yet: pass "
                             "--partition-by EXPR (e.g. toYYYYMMDD(day)); nothing was loaded")
        return
    for where, engine in target.table_engines(table.sql):
        if "PARTITION BY" not in engine:
            raise UsageError(f"table {where} has no PARTITION BY: --mode replace-partitions "
                             "replaces whole partitions; load into a table created with "
                             "PARTITION BY, or use --mode replace-table; nothing was loaded")


def load_table(spec: LoadSpec, target: Target, table: planner.TableName, sources: RunSources,
               listed: Iterable[SourceFile | Skipped], listener: Listener, run_id: str = "",
               record: bool = True, added: planner.AddColumns | None = None,
               halt: threading.Event | None = None, known_of: KnownOf | None = None,
               recover: bool = True) -> LoadReport:
    """One table's run. `listed` is consumed once, as it comes, against the ledger's
    keys (Ledger.known, planner.decide): only the units to load are kept, so a rerun
    over a long history costs its listing, not its history. `halt`: once set, no
    further unit starts (runner.run). `known_of`: the keys and why the ledger's other
    loads are not the table's, for the table as it is now (default: Ledger.known; a
    run that follows keeps them from poll to poll: core/follow.py). `recover`: settle
    what crashed commits left first (Target.recover; a run that follows does at its
    first poll, and its committer's survey settles any later one before it commits)."""
    started_ns, clock = time.time_ns(), time.monotonic()
    _check_settings(target, spec.settings)
    report = LoadReport(table.display, target.display, run_id or os.urandom(6).hex())
    report.notes += target.notes
    existing = target.table_columns(table.sql)
    if spec.mode == "replace-partitions":
        _check_partitioned(target, table, existing, spec.partition_by)
    report.recovered = target.recover(table.sql) if recover else 0
    state = target.ledger.table_state(table.database, table.name)
    known, report.table_reset = (known_of or (lambda state: target.ledger.known(
        table.display, state)))(state)
    sources.against(None if spec.force else known)  # (--force: every unit listed, loaded)
    # each file's start read once, from its listing or description (compression) to its
    # checks
    with sniff.kept_starts():
        try:
            plan = planner.decide(listed, known, spec.force, sources.release,
                                  reload_changed=spec.mode == "replace-partitions")
        finally:
            sources.against(None)
        del known
        untold = [(f, formats.untold(f.uri)) for f in plan.to_load if not f.format.name]
        told = sources.described([f for f in plan.to_load if f.format.name])
        described = sources.columns(told)  # a source that knows its columns: no inference
        files = planner.resolve_format(target, told, planner.known_names(existing, spec.schema),
                                       forced=spec.format is not None or described is not None,
                                       delimiter=dict(spec.settings).get("format_csv_delimiter"))
        plan = replace(plan, to_load=files)
        refused = _refuse(target, table, untold, report.run_id, listener)
        settings = (*_job_settings(spec), *planner.csv_settings(files, spec.settings))
        upsert = spec.upsert
        if upsert is not None and existing is not None:
            upsert.check_table(table.display, target.table_engines(table.sql))
        if plan.to_load:
            columns, read_columns, created, existing, evolution = _prepare(
                spec, target, table, plan.to_load, existing, described, sources, added)
            new_columns = spec.on_new_column if evolution else "fail"
            if evolution:
                settings = evolve.job_settings(new_columns, plan.to_load, settings, spec.settings)
                report.notes += evolution.notes
                report.schema_changes = [c.as_dict() for c in evolution.changes]
            if not state.exists:
                state = target.ledger.table_state(table.database, table.name)
            checked = planner.check_headers(target, table, plan.to_load,
                                            existing or columns, read_columns, spec.audit,
                                            named=planner.reads_by_name(spec.schema, settings),
                                            settings=spec.settings, new_columns=new_columns,
                                            start=sources.start)
            to_load, settings = checked.files, (*checked.settings, *settings)
            refused += _refuse(target, table, checked.refused, report.run_id, listener)
            if refused and spec.on_error == "abort":
                refused += [FileResult(f.uri, "not-started") for f in to_load]
                to_load = []
            if upsert is not None:
                upsert.check_data(table.display, read_columns)
            plan = replace(plan, to_load=to_load, columns=columns, read_columns=read_columns,
                           created_table=created)
            try:
                sources.stored(columns, read_columns, target.engine_name,
                               spec.budget.allows_errors)
            except SchemaError as exc:  # a value no column type holds: nothing loaded
                if not created:
                    raise
                raise _created_note(exc, table) from None
    target.ledger.stamp(table.display, state.uuid)
    listener(Event("plan", files_total=len(plan.to_load),
                   bytes_total=sum(f.size for f in plan.to_load),
                   unit=sources.unit(spec.sources)))
    estimate = target.default_workers(plan.to_load)
    workers = spec.workers or estimate
    adapt = Controller(workers, workers, fixed=spec.workers is not None)
    groups = _groups(target, sources, plan.to_load, spec.budget, workers)
    threads = _threads_per_file(workers, len(groups))
    jobs = [LoadJob(file=group[0], table=table.sql, table_display=table.display,
                    columns=plan.columns, read_columns=plan.read_columns, audit=spec.audit,
                    settings=settings, run_id=report.run_id, budget=spec.budget,
                    batch=group if len(group) > 1 else (), threads=threads,
                    settle=sources.settle, mode=spec.mode,
                    stream=sources.stream)
            for group in groups]
    if spec.workers is None:
        adapt.bounded(MAX_STREAMS)  # the target bounds it by what it knows (its cores)
    in_flight = target.open_streams(workers, None if adapt.fixed else adapt)
    monitor = Monitor(target.workdir).start()
    try:
        results = runner.run(target, jobs, in_flight, listener,
                             abort_on_error=spec.on_error == "abort", changed=plan.changed,
                             sources=sources, halt=halt)
        sources.settle()  # a check no commit waited for (every unit failed, or none ran)
    except ValuesRefused as exc:  # values no column type holds: nothing committed
        if not plan.created_table:
            raise
        raise _created_note(exc, table) from None
    finally:
        adapt.finished.set()
    report.saturation = saturation_of(monitor.stop().to_dict()) if jobs else None
    report.concurrency = concurrency_of(adapt.summary()) if jobs else None
    report.costs = costs_of(target.cost_report()) if jobs else None
    results += refused + [FileResult(uri, "failed", error=why, changed=True)
                          for uri, why in plan.refused.items()]
    _summarize(report, results, plan, time.monotonic() - clock)
    report.unit = sources.unit(spec.sources)
    report.listing_calls = sources.listing_calls()
    report.notes += sources.notes()
    if spec.incremental_by and report.rows_loaded:
        note = versions_note(target, table, spec.incremental_by,
                             sources.sorting_key(plan.to_load))
        report.notes += [note] if note else []
    if record:
        _finish_reported(target, report, _run_record(spec, report, started_ns, sources))
    return report


def _prepare(spec: LoadSpec, target: Target, table: planner.TableName,
             files: Sequence[SourceFile], existing: list[Column] | None,
             described: list[Column] | None, sources: RunSources,
             added: planner.AddColumns | None,
             ) -> tuple[list[Column], list[Column], bool, list[Column] | None,
                        evolve.Evolution | None]:
    """The table made ready for the run's files (planner.prepare_table): (its columns
    the data fills, how the data is read, created, its columns now, the evolution).
    With --on-new-column add or ignore, files whose own columns decide (no --schema, no
    source that says its columns) go through core/evolve.py, a new table made first
    from a sample as ever."""
    def prepare(existing: list[Column] | None, evolved: list[Column] | None,
                ) -> tuple[list[Column], list[Column], bool]:
        return planner.prepare_table(
            target, table, files, existing=existing, schema=spec.schema,
            order_by=spec.order_by or sources.sorting_key(files),
            partition_by=spec.partition_by, audit=spec.audit, budget=spec.budget,
            described=described, sources=sources, added=added, evolved=evolved,
            upsert=spec.upsert,
            dates_told="date_time_input_format" in dict(spec.settings))
    if described is not None and existing and spec.on_new_column == "add" and not spec.schema:
        grown = evolve.evolve_described(target, table.sql, table.display, described,
                                        existing, files[0].uri)
        return (*prepare(grown.existing, None)[:2], False, grown.existing, grown)
    if spec.on_new_column == "fail" or spec.schema is not None or described is not None:
        return (*prepare(existing, None), existing, None)
    created = False
    if existing is None:
        created = prepare(None, None)[2]
        existing = target.table_columns(table.sql)
    evolution = evolve.evolve(target, table.sql, table.display, files, existing or [],
                              spec.on_new_column) if existing else None
    if evolution is None:
        return (*prepare(existing, None)[:2], created, existing, None)
    columns, read, _ = prepare(evolution.existing, evolution.data)
    return columns, read, created, evolution.existing, evolution


def _created_note(error: SchemaError, table: planner.TableName) -> SchemaError:
    """`error`, saying that this run created the table (empty): another --schema needs
    it dropped first."""
    return SchemaError(f"{error}; this run created {table.display} and loaded nothing into "
                       f"it: drop it first (chload sql 'DROP TABLE {table.display}' with the same "
                       "--target) to load with another --schema")


def default_database(target: Target) -> str:
    """What a bare table name means: a server target's URL may name a database."""
    return target.database


def _groups(target: Target, sources: RunSources, files: Sequence[SourceFile],
            budget: ErrorBudget, workers: int) -> list[tuple[SourceFile, ...]]:
    """Files grouped into batches where the target can load several as one; a unit its
    source commits alone (Source.loads_alone: a database range) in a group of its own."""
    alone = [f for f in files if sources.loads_alone(f)]
    rest = [f for f in files if not sources.loads_alone(f)] if alone else files
    return [(f,) for f in alone] + (target.plan_batches(rest, budget, workers) if rest else [])


def committed(spec: LoadSpec, target: Target) -> dict[str, str]:
    """uri -> identity of the units the ledger has committed into the spec's table as it
    is now (own_history), `committing` ones included: recovery, before any load, settles
    each of them loaded (the mark rule)."""
    return {uri: e.identity for uri, e in _own_units(spec, target).items()}


def last_commit(spec: LoadSpec, target: Target) -> tuple[str, int] | None:
    """The run and the time (ns) of the latest unit committed into the spec's table as
    it is now (a finished copy says which run made it); None if none."""
    own = _own_units(spec, target)
    if not own:
        return None
    last = max(own.values(), key=lambda e: e.seq)
    return last.run_id, last.seq


def _own_units(spec: LoadSpec, target: Target) -> Mapping[str, FileEvent]:
    table = planner.parse_table(spec.table, default_database(target))
    events = dict(target.ledger.loaded(table.display))
    events.update((e.uri, e) for e in target.ledger.latest(table.display, [COMMITTING]))
    own, _ = own_history(target.ledger.table_state(table.database, table.name),
                                 events)
    return own


def last_loaded(spec: LoadSpec, target: Target, prefix: str) -> str:
    """The greatest uri beginning with `prefix` that the ledger has loaded into the
    spec's table as it is now ('' if none): where --after-last-key lists from."""
    table = planner.parse_table(spec.table, default_database(target))
    return target.ledger.last_loaded(
        table.display, target.ledger.table_state(table.database, table.name), prefix)


def list_sources(spec: LoadSpec, sources: RunSources) -> list[SourceFile]:
    """Every file the sources name, each once (by uri), in the order named, described
    whole (Source.described): for a run that checks every file (validate)."""
    files: dict[str, SourceFile] = {}
    for f in stream_sources(spec, sources):
        if isinstance(f, Skipped):  # (never: this run lists against no ledger)
            continue
        if f.uri in files:
            sources.release([f])  # another spelling of a file named already
        else:
            files[f.uri] = f
    return sources.described(list(files.values()))


def stream_sources(spec: LoadSpec, sources: RunSources) -> Iterator[SourceFile | Skipped]:
    """Every file the sources name, in the order named, as listed (a file named twice
    comes twice: the plan keeps it once). A pattern that matches nothing stops the run
    when its listing ends, before anything loads (the plan takes the whole listing
    first). Each source is listed by this run's object for its kind (RunSources),
    which releases what listing made (stdin's spool, links) when the caller closes it."""
    if spec.sources.count("-") > 1:
        raise UsageError("-: standard input can be read once; name - once")
    for pattern in spec.sources:
        sources.of(pattern)  # unknown schemes, before anything is listed
    refuse_unread(spec, sources.options())
    return _told((f for pattern in spec.sources for f in sources.list(pattern)), sources)


def _told(files: Iterable[SourceFile | Skipped], sources: RunSources,
          ) -> Iterator[SourceFile | Skipped]:
    """The files, less those whose name does not tell their format and that hold
    nothing (Spark's _SUCCESS). The others stay, to fail alone (load_table): a
    directory's README.txt must not stop its data loading, nor vanish unreported. If no
    file tells its format (an empty one named alone too), the run stops, as for one
    file named. Files skipped as listed were loaded: each told its format."""
    told, first_untold = 0, ""
    for f in files:
        if isinstance(f, Skipped):
            told += f.count
        elif f.format.name:
            told += 1
        else:
            first_untold = first_untold or f.uri
            if f.size == 0 and not f.is_stream:
                sources.release([f])
                continue
        yield f
    if first_untold and not told:
        raise UsageError(formats.untold(first_untold))
