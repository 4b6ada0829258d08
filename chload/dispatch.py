"""How a load runs, by the kind of its sources: files listed once or followed (core/load.py,
core/follow.py), a stream's units round by round (a Kafka topic, a MySQL binlog), a
followed PostgreSQL table (its copy, then its changes). The public API (api.py) opens the
target and hands the load here; what a source needs to list (SourceContext) is resolved
here once for the run."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType

from chload.core import follow as following, load as steps, plan as planner
from chload.core.finish import (
    UNWRITTEN_LOADED,
    _committed_any,
    _finish_reported,
    _run_record,
)
from chload.core.report import LoadReport, LoadSpec
from chload.core.run import Listener
from chload.errors import ChloadError
from chload.sources import registry
from chload.sources.base import SourceContext, SourceFile, Stream
from chload.sources.run import RunSources
from chload.targets.base import Target


def begin_early(spec: LoadSpec) -> Callable[[], None]:
    """What a lone URL source begins while the target opens (Source.begin_early: a
    PostgreSQL snapshot's session), and its cleanup. Files begin nothing."""
    pattern = spec.sources[0] if len(spec.sources) == 1 else ""
    if "://" not in pattern or pattern.split("://")[0].lower() not in registry.SCHEMES:
        return lambda: None  # (an unknown scheme is refused when the run lists)
    if spec.follow and registry.changes_of(spec.sources) is not None:
        return lambda: None  # its copy's snapshot must come after its slot is made
    begun = registry.source_for(pattern).begin_early(pattern, SourceContext(
        select=spec.query, incremental_by=spec.incremental_by, workers=spec.workers, pipes=True))
    return begun or (lambda: None)


def load_into(spec: LoadSpec, target: Target, listener: Listener | None = None,
              stop: threading.Event | None = None, copy: bool = False,
              snapshot: str | None = None) -> LoadReport:
    """`load` into a target already open (kept open): any `targets.Target`, e.g. the
    unit tests' in-memory one. `spec.target` is not looked at. `stop`: ends a load that
    follows files (None: it follows until the process ends). `copy`: a database table
    copied, never followed (the first copy of a followed table)."""
    stream = registry.stream_of(spec.sources)
    if stream is not None:  # a stream: its units round by round
        return _load_stream(spec, target, listener or (lambda event: None), stream)
    changes = None if copy else registry.changes_of(spec.sources)
    if changes is not None and (spec.follow or changes.followed(spec, target)):
        return _load_changes(spec, target, listener or (lambda event: None), changes,
                             stop or threading.Event())
    table = planner.parse_table(spec.table, steps.default_database(target))
    binlog = None if copy else registry.binlog_of(spec, target, table)
    if binlog is not None:  # a MySQL table followed: its copy, then its binlog
        binlog.begin(stop or threading.Event(),
                     lambda copy: load_into(copy, target, listener, stop))
        binlog.make_table(spec, target, table)  # (--cluster: before its cluster opens)
        return _load_stream(spec, target, listener or (lambda event: None), binlog)
    # A pipe is read once: not where rejected rows are read again (an error budget)
    pipes = target.reads_pipes and not spec.budget.allows_errors
    context = replace(source_context(spec, target), pipes=pipes,
                      rejects=spec.budget.allows_errors, snapshot=snapshot)
    sources = RunSources(context, registry)
    try:
        if spec.follow:  # files listed again every --poll seconds
            with engine_credentials(context):
                return following.follow(spec, target, sources,
                                        listener or (lambda event: None), stop)
        listed = steps.stream_sources(spec, sources)
        with engine_credentials(context):
            return steps.load_units(spec, target, sources, listed, listener or (lambda event: None))
    finally:
        sources.close()  # what listing made, and what a source kept for the run


def _load_stream(spec: LoadSpec, target: Target, listener: Listener,
                 stream: Stream) -> LoadReport:
    """A stream's load (a Kafka topic): each round's units through `_load`, one run, into
    the target, or into the cluster of its Distributed table, opened once for the run
    (whose ledger the stream's plan reads: each shard records its units). An error once
    the run committed anything ends the run with its report (`_stream_rounds`)."""
    started_ns, clock = time.time_ns(), time.monotonic()
    table = planner.parse_table(spec.table, steps.default_database(target))
    report = LoadReport(table.display, target.display, os.urandom(6).hex())
    sources = RunSources(source_context(spec, target), registry)  # spooled units: local files
    report.unit = sources.unit(spec.sources)
    try:
        with target.for_table(table.sql, spec.shards, spec.shard_by, os.environ) as t:
            _stream_rounds(spec, t, listener, stream, table, report, sources)
            report.seconds = time.monotonic() - clock
            _finish_reported(t, report, _run_record(spec, report, started_ns, sources))
    except ChloadError as exc:  # closing a cluster whose shard is gone
        if not report.files_loaded and not report.errors:
            raise
        report.errors.append(f"{exc}: {UNWRITTEN_LOADED}")
    finally:
        sources.close()
    return report


def _load_changes(spec: LoadSpec, target: Target, listener: Listener, changes: ModuleType,
                  stop: threading.Event) -> LoadReport:
    """A followed table (sources/changes/): its table and slot made, the table copied
    while the ledger has no unit of its changes, then its changes round by round."""
    table = planner.parse_table(spec.table, steps.default_database(target))
    follow = changes.Follow(spec, target, table)
    try:  # (the copy of a new slot reads its exported snapshot while the slot's
        copy_first = follow.begin()  # connection is open)
        if copy_first:
            copied = load_into(replace(spec, follow=False, upsert_key=None, cluster=None,
                                        on_new_column="fail"), target, listener, stop,
                                copy=True, snapshot=follow.snapshot)
            if copied.files_failed or copied.errors or stop.is_set():
                return copied
    finally:
        follow.close()
    # new columns are added by the stream before a unit loads, the units read as Native
    # in the table's own columns
    report = _load_stream(replace(spec, on_new_column="fail"), target, listener,
                          changes.Changes(stop, spec.on_new_column))
    if copy_first:
        report.files = copied.files + report.files
        for name in ("files_total", "files_loaded", "files_skipped", "rows_loaded",
                     "bytes_read"):
            setattr(report, name, getattr(report, name) + getattr(copied, name))
        report.created_table = True
    return report


def _stream_rounds(spec: LoadSpec, target: Target, listener: Listener, stream: Stream,
                   table: planner.TableName, report: LoadReport, sources: RunSources) -> None:
    """The stream's rounds, each one's `loaded` events written after it (a cluster's
    shards hold the last units' until then; events not written wait for the next
    write). An error (the broker or a server gone) once this run committed anything
    goes into `report.errors`, the committed units staying in the report (docs/cli.md
    "Exit codes"); before any commit it is raised."""
    added = stream.audit_columns if spec.audit else None
    # Rounds after the first settle no crashed commit first (the committer's survey
    # settles a broken lock before any commit, rule 3) and ask the ledger only for the
    # keys loaded since the round before (core/follow.py Known): a round costs what it
    # loads, not the table's history of units.
    known = following.Known(target.ledger, table.display, report.run_id)
    rounds = [0]

    def load_round(units: list[SourceFile], workers: int | None,
                   schema: str | None) -> LoadReport:
        done = steps.load_units(
            replace(spec, workers=spec.workers or workers, schema=schema or spec.schema),
            target, sources, units, listener, run_id=report.run_id, record=False,
            added=added, known_of=known, recover=not rounds[0])
        rounds[0] += 1
        with contextlib.suppress(ChloadError):  # (they wait for the run's last writes,
            target.flush()  # which report their error: the round's results stand)
        return done

    try:
        stream.rounds(spec, target, listener, load_round, table, report)
    except ChloadError as exc:
        if not _committed_any(target, report):
            raise
        report.errors.append(str(exc))


def source_context(spec: LoadSpec, target: Target) -> SourceContext:
    """What listing needs, resolved here once: S3 settings from the environment and
    --s3-endpoint (only when a source is s3://: resolving reads ~/.aws, may import
    botocore), and the engine that lists HDFS: the target's, as chDB allows one engine
    path per process (hdfs.py)."""
    s3 = registry.s3_settings(spec.sources, os.environ, spec.s3_endpoint)
    return SourceContext(format=spec.format, compression=spec.compression,
                         workdir=os.path.join(target.workdir, "tmp"),
                         s3=s3, azure=registry.azure_settings(spec.sources, os.environ),
                         gcs=registry.gcs_settings(spec.sources, os.environ),
                         query=target.infer_rows, patterns=spec.sources,
                         select=spec.query, incremental_by=spec.incremental_by,
                         force=spec.force or spec.mode != "append", mode=spec.mode,
                         workers=spec.workers, key_order=target.wants_key_order,
                         schema=spec.schema,
                         has_type=target.has_type, engine=target.engine_name,
                         committed=lambda: steps.committed(spec, target),
                         last_commit=lambda: steps.last_commit(spec, target),
                         last_loaded=(lambda prefix: steps.last_loaded(spec, target, prefix))
                         if spec.after_last_key else None,
                         table_exists=lambda: target.table_columns(planner.parse_table(
                             spec.table, steps.default_database(target)).sql) is not None)


def engine_credentials(context: SourceContext) -> contextlib.AbstractContextManager[None]:
    """The S3 credentials handed to the engine while it reads (registry.engine_credentials)."""
    return registry.engine_credentials(context, os.environ)
