"""Kafka topics into a table, exactly once: offset ranges as units, loaded like files.

A unit is (topic, partition, first offset, last offset), named in the ledger
`kafka://<bootstrap>/<topic>/<partition>/<first>-<last>` (never a secret), with the
topic's id and the range as its identity. Per round: plan (plan.py), read the next unit of
each partition into a pipe or spool (read.py, native.py, units.py; the next round is read
while one loads), load through dispatch.py (its stream rounds). docs/sources-kafka.md
argues it in full.

Invariants: a partition's position is the ledger's (its committed units' highest last
offset, plus one), never Kafka's group offsets (group.py only splits partitions); a unit
commits only while that end is still the one its plan saw (committer.py rule 5,
sources.StreamPosition), and a streamed one only if its reader finished it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from chload.core.evolve import FLAG as NEW_COLUMN_FLAG
from chload.core.run import LOADED_ELSEWHERE, LOADED_IN_PART, Event, FileResult, Listener
from chload.errors import SourceError, UsageError
from chload.formats import FileFormat
from chload.runtime import stopping
from chload.runtime.faults import crash_point
from chload.schema import Column, quote_str
from chload.sources.base import RemoteSource, SourceContext, SourceFile, StreamPosition
from chload.sources.kafka.group import Share, group_id, note, share
from chload.sources.kafka.plan import SCHEME, Partition, committed, follow, parse_uri, plan
from chload.sources.kafka.read import (
    AUDIT_CSV,
    AUDIT_JSON,
    AUDIT_TSV,
    Broker,
    SpoolReader,
    Unit,
    client_config,
)
from chload.sources.kafka.units import (
    Spool,
    drop_ahead,
    following,
    line_base,
    offset_error,
    read_units,
    remove,
    spool_dir,
    taken,
)

if TYPE_CHECKING:
    from chload.api import LoadReport, LoadSpec
    from chload.targets.base import Target

BATCH_ROWS = 500_000  # messages a unit holds at most (--batch-rows)
BATCH_SECONDS = 5.0  # --follow: a unit is cut at least this often (--batch-seconds)
# Formats whose rows are one message each once joined by newlines.
LINE_FORMATS = {"JSONEachRow", "JSONLines", "NDJSON", "JSONAsString", "JSONCompactEachRow",
                "CSV", "TSV", "TabSeparated", "LineAsString", "TSKV", "CustomSeparated"}
# --audit: the formats whose rows the reader extends with the message's Kafka columns
# as their last fields (read.py: audited, audited_line), how, and those columns'
# types. _topic is a String: parsing it into LowCardinality(String) cost more
# (docs/benchmarks.md).
AUDIT_FORMATS = {"JSONEachRow": AUDIT_JSON, "JSONLines": AUDIT_JSON, "NDJSON": AUDIT_JSON,
                 "CSV": AUDIT_CSV, "TSV": AUDIT_TSV, "TabSeparated": AUDIT_TSV}
AUDIT_COLUMNS = {"_topic": "String", "_partition": "UInt32",
                 "_offset": "UInt64", "_timestamp": "DateTime64(3, 'UTC')", "_key": "String"}

# Units a streamed round reads and loads at once, at most (a reader thread, a librdkafka
# handle and an engine INSERT each); partitions beyond it wait for the next rounds.
STREAMED_UNITS = 8
# Messages read per partition (of the first three due) to infer the columns of a
# streamed load without --schema into a new table (the engine infers from a sample too).
SAMPLE_ROWS = 10_000
# Load a round's units; the int, if not None, is the number of units to load at once
# (--workers, unless the user gave it); the str, if not None, the columns to read the
# units as (--schema, or what a streamed load found: _stream_schema).
LoadRound = Callable[[list[SourceFile], int | None, str | None], "LoadReport"]


def is_kafka(sources: Sequence[str]) -> bool:
    return any(s.lower().startswith(SCHEME) for s in sources)


# --------------------------------------------------------------------------- the run

@dataclass(slots=True)
class Options:
    batch_rows: int = BATCH_ROWS
    batch_seconds: float = BATCH_SECONDS
    follow: bool = False
    kafka_options: tuple[tuple[str, str], ...] = ()
    stop: threading.Event = field(default_factory=threading.Event)
    audit: int = 0  # each row with its Kafka columns (AUDIT_COLUMNS): AUDIT_FORMATS' mode
    pipes: bool = False  # units streamed to the engine through pipes (_stream_round)
    schema: str | None = None  # what streamed units are read as (--schema, _stream_schema)


def with_kafka_columns(target: Target, data: list[Column], fmt: str = "JSONEachRow",
                       inferred: bool = False) -> list[Column]:
    """--audit: the data's columns with the Kafka columns (which the reader writes into
    each row) at their types: an inferred type replaced, a missing column (--schema)
    added. `_timestamp` is DateTime('UTC') (seconds) where the target lacks DateTime64.
    CSV and TSV rows have them as their last five fields, so they are the last five
    columns, and inferred ones (c4..c8, named by position) take their names."""
    types = dict(AUDIT_COLUMNS)
    if not target.has_type("DateTime64"):
        types["_timestamp"] = "DateTime('UTC')"
    if AUDIT_FORMATS.get(fmt, AUDIT_JSON) != AUDIT_JSON:
        named = [c for c in data if c.name not in types]
        if inferred and len(named) == len(data) and len(data) > len(types):
            named = data[:-len(types)]
        return named + [Column(n, t) for n, t in types.items()]
    kept = [Column(c.name, types.get(c.name, c.type)) for c in data]
    return kept + [Column(n, t) for n, t in types.items() if n not in {c.name for c in data}]


def load(spec: LoadSpec, target: Target, listener: Listener, load_round: LoadRound,
         table: Any, report: LoadReport, options: Options) -> LoadReport:
    """Load the spec's topics into `table` (planner.TableName) round by round; each
    round's results are added to `report`."""
    source = parse_uri(spec.sources)
    fmt = FileFormat(spec.format or "JSONEachRow", "none")
    if fmt.name not in LINE_FORMATS:
        raise UsageError(f"--format {fmt.name}: a Kafka load joins messages by newlines; use "
                         f"one of {', '.join(sorted(LINE_FORMATS))}")
    if spec.audit and fmt.name not in AUDIT_FORMATS:
        raise UsageError(f"--audit with --format {fmt.name}: the Kafka columns (_topic, "
                         "_partition, _offset, _timestamp, _key) are added to JSON objects, "
                         f"CSV and TSV lines; use one of {', '.join(sorted(AUDIT_FORMATS))}, "
                         "or leave out --audit")
    options.audit = AUDIT_FORMATS[fmt.name] if spec.audit else 0
    report.recovered += target.recover(table.sql)
    group = group_id(options.kafka_options, table.display)
    broker = Broker(client_config(source.bootstrap, options.kafka_options),
                    client_config(source.bootstrap, options.kafka_options, consumer=False), group)
    try:
        found = committed(target, table.database, table.name, table.display)
        partitions, refused = plan(broker, source, found, spec.force)
        for failed in refused:
            listener(Event("fail", failed.uri, error=failed.error))
        _add(report, refused)
        reader = SpoolReader(broker, client_config(source.bootstrap, options.kafka_options,
                                                   native=True), group)
        if reader.why:
            report.notes.append(f"Kafka: the Python reader (slower): {reader.why}")
        options.schema = spec.schema
        options.pipes, why = streams(spec, target, reader)
        if why:
            report.notes.append(f"Kafka: units spooled, not streamed (slower): {why}")
        owned = share(broker.config, source.topics, group, target, table, options.stop)
        try:
            with spool_dir(target) as spool, _stopping(options):
                _rounds(reader, fmt, partitions, spool, load_round, report, options,
                        owned, listener)
        except SourceError:  # a read failed: because no broker answers any more?
            down = broker.down()
            if down:
                raise SourceError(down) from None
            raise
        finally:
            reader.close()
            if owned.membership is not None:
                owned.membership.close()
                report.notes.append(note(owned.membership.group, report.files))
    finally:
        broker.close()
    return report


def _rounds(reader: SpoolReader, fmt: FileFormat, partitions: list[Partition], spool: str,
            load_round: LoadRound, report: LoadReport, options: Options, share: Share,
            listener: Listener) -> None:
    """Per round, the next unit of every partition this run owns (share.due) with
    offsets due, loaded together; without --follow, the run ends when the ledger has
    every partition at its end (loaded here or by another member of the group); with
    --follow, watermarks are read again and rounds go on until stopped. While a
    round loads, a reader thread reads the next one (as if this one commits: a unit
    whose partition did not end where it begins is dropped unread by the engine)."""
    last_cut = time.monotonic()
    ahead: Future[list[Spool]] | None = None
    crash_point("kafka-rounds")  # tests: another loader commits before the first round
    with ThreadPoolExecutor(1, thread_name_prefix="chload-kafka-read") as pool:
        try:
            while not options.stop.is_set():
                due = share.due(partitions)
                target, table = share.target, share.table
                if not due:
                    if not options.follow:
                        if share.finished(partitions):
                            # the ledger counts `committing` units as loaded: one that a
                            # member killed meanwhile left is settled (attached) before
                            # the run ends, not by the next run
                            report.recovered += target.recover(table.sql)
                            return
                        options.stop.wait(0.5)  # another member's partitions, in flight
                        continue
                    _wait(options, last_cut)
                    _refresh(reader.broker, partitions)
                    _lag(listener, partitions)
                    continue
                if options.pipes and options.schema is None:
                    options.schema, why = _stream_schema(reader, fmt, due, spool, target,
                                                         table, options.audit)
                    options.pipes = options.schema is not None
                    if why:
                        report.notes.append(f"Kafka: units spooled, not streamed (slower): "
                                            f"{why}; pass --schema to stream them")
                if options.pipes:  # read and parsed at once: no read-ahead
                    _stream_round(reader, fmt, due, load_round, report, options, target,
                                  table)
                    _lag(listener, partitions)
                    _broker_down(reader.broker, due)
                    last_cut = time.monotonic()
                    continue
                spools = taken(ahead, due, options.batch_rows)
                ahead = None
                covered = {id(s.part) for s in spools}
                spools += read_units(reader, fmt, spool, [(p, p.unit(options.batch_rows), p.after)
                                                     for p in due if id(p) not in covered],
                                options.audit)
                after = following(spools, options.batch_rows)
                if after:
                    ahead = pool.submit(read_units, reader, fmt, spool, after, options.audit)
                _load_round(spools, load_round, report, target, table)
                _lag(listener, partitions)
                _broker_down(reader.broker, due)
                last_cut = time.monotonic()
        finally:
            if ahead is not None:
                drop_ahead(ahead)


def _broker_down(broker: Broker, due: list[Partition]) -> None:
    """After a round in which a unit failed (its partition stopped): if that is because
    no broker answers any more, the run ends with the one line saying so, not a
    partition's read timeout after another (what was committed stays loaded)."""
    if any(p.stopped for p in due):
        down = broker.down()
        if down:
            raise SourceError(down)


def streams(spec: LoadSpec, target: Target, reader: SpoolReader) -> tuple[bool, str]:
    """Whether units go to the engine through pipes, parsed as they are read, and if
    not, why (for the report's notes; "" where it says so already or the user chose):
    with the native reader, into a target that reads pipes, when nothing reads a unit
    before its load (no error budget: rejects are read again from the unit; no header
    to look for; the columns known before: --schema, or _stream_schema's).
    CHLOAD_KAFKA_PIPES=0 turns it off."""
    if reader.native is None or os.environ.get("CHLOAD_KAFKA_PIPES", "1") == "0":
        return False, ""  # the Python reader has its note; the user's choice needs none
    if not target.reads_pipes or "WithNames" in (spec.format or ""):
        return False, "the target or the format cannot read a unit as it is read"
    if spec.budget.allows_errors:
        return False, ("an error budget (--max-errors, --max-error-ratio) reads a unit's "
                       "rejected rows again, from its spool")
    if spec.on_new_column != "fail" and not spec.schema:
        return False, (f"--on-new-column {spec.on_new_column} reads each unit's keys "
                       "before loading it, from its spool")
    return True, ""


def _stream_schema(reader: SpoolReader, fmt: FileFormat, due: list[Partition], spool: str,
                   target: Target, table: Any, audit: int) -> tuple[str | None, str]:
    """The columns a streamed load reads its units as, without --schema: an existing
    table's own (what a spooled load reads a CSV as, and a JSON row's fields name them),
    or, for a new table, those the engine infers from a sample of the first messages of
    up to three partitions (a separate read, not a unit: nothing of it commits). None
    and why, and the load spools as before, where the table has a DEFAULT (or other
    computed) column, which a JSON row may or may not carry, or the sample says nothing."""
    from chload.core import plan as planner
    from chload.errors import ChloadError
    from chload.schema import AUDIT_COLUMNS as OWN, structure

    existing = target.table_columns(table.sql)
    if existing is not None:
        kept = [c for c in existing if c.name not in OWN]
        if any(c.default_kind for c in kept) or not kept:
            return None, (f"{table.display} has a DEFAULT or computed column, which a row "
                          "may carry or not")
        return structure(kept), ""
    sample = [(p, Unit(p.topic, p.partition, p.next, min(p.end, p.next + SAMPLE_ROWS) - 1),
               p.after) for p in due[:3]]
    spools: list[Spool] = []
    files: list[SourceFile] = []
    try:
        spools = read_units(reader, fmt, spool, sample, audit)
        files = _one_sample([s.file for s in spools if s.file.size], spool)
        data, _, _ = planner.prepare_table(target, table, files, existing=None, schema=None,
                                           order_by=None, partition_by=None,
                                           audit=bool(audit), create=False,
                                           added=with_kafka_columns)
    except ChloadError as exc:
        return None, f"the columns of a sample of the first messages: {exc}"
    finally:
        for s in spools:
            remove(s.file.local_path)
        for f in files:
            if f.local_path and os.path.basename(f.local_path).startswith("sample-"):
                remove(f.local_path)
    return (structure(data), "") if data else (None, "no columns in the first messages")


def _one_sample(files: list[SourceFile], spool: str) -> list[SourceFile]:
    """The partitions' samples as one file: the engine infers the columns of several
    files from the first it can read alone, so a key only another partition's messages
    have was a failed unit ("Unknown field found ... b") once streamed."""
    if len(files) < 2:
        return files
    path = os.path.join(spool, f"sample-{os.getpid()}-{threading.get_ident()}.txt")
    with open(path, "wb") as out:
        for f in files:
            with open(f.local_path or "", "rb") as part:
                shutil.copyfileobj(part, out, 1 << 20)
                part.seek(-1, os.SEEK_END)
                if part.read(1) != b"\n":
                    out.write(b"\n")
        size = out.tell()
    return [replace(files[0], local_path=path, size=size)]


def _stream_round(reader: SpoolReader, fmt: FileFormat, due: list[Partition],
                  load_round: LoadRound, report: LoadReport, options: Options,
                  target: Target, table: Any) -> None:
    """A round whose units stream through pipes (SpoolReader.stream): each unit's reader
    runs while the engine parses; the unit commits only if its reader finished it
    (db_pipes.check, through KafkaStreamSource.current)."""
    from chload.sources import pipes as db_pipes

    due = sorted(due, key=lambda p: p.streamed)[:STREAMED_UNITS]  # the least streamed
    reader.keep_handles({(p.topic, p.partition) for p in due}, STREAMED_UNITS)
    files, readings = [], []
    try:
        for p in due:
            p.streamed += 1
            unit = p.unit(options.batch_rows)
            path, reading = reader.stream(unit, options.audit)
            readings.append(reading)
            files.append(SourceFile(f"{p.stream}/{unit.first}-{unit.last}", 0, 0, fmt,
                                    kind="kafka", etag=f"{p.topic_id}:{unit.first}-{unit.last}",
                                    local_path=path,
                                    position=StreamPosition(p.stream, p.after, p.since_seq,
                                                            unit.first - 1)))
        # all at once: a unit waiting for a worker is a partition whose reader waits on
        # its full pipe
        crash_point("kafka-round")  # tests: another loader commits these units first
        done = load_round(files, len(files), options.schema)
    finally:
        for f in files:
            db_pipes.release(f.local_path or "")
    files = [replace(f, position=replace(f.position, line_base=line_base(r.done)))
             if f.position else f for f, r in zip(files, readings, strict=True)]
    _advance(due, files, done, target, table)
    _add(report, done.files, done)


def _load_round(spools: list[Spool], load_round: LoadRound, report: LoadReport,
                target: Target, table: Any) -> None:
    files = [s.file for s in spools]
    try:
        crash_point("kafka-round")  # tests: another loader commits these units first
        done = load_round(files, None, None)
    finally:
        for f in files:
            remove(f.local_path)
    _advance([s.part for s in spools], files, done, target, table)
    _add(report, done.files, done)


def _lag(listener: Listener, partitions: list[Partition]) -> None:
    """A `lag` event per partition: messages up to its end (the high watermark last
    read) that this run has not committed yet."""
    for p in partitions:
        listener(Event("lag", p.stream, rows=0 if p.stopped else max(0, p.end - p.next)))


def _wait(options: Options, since: float) -> None:
    options.stop.wait(max(0.2, options.batch_seconds - (time.monotonic() - since)))


def _refresh(broker: Broker, partitions: list[Partition]) -> None:
    for p in partitions:
        if not p.stopped:
            p.end = broker.watermarks(p.topic, p.partition)[1]


def _advance(due: list[Partition], files: list[SourceFile], done: LoadReport,
             target: Target, table: Any) -> None:
    """Move each partition on after its unit: loaded, the next offset; refused (another
    loader moved the partition), or committed on some shards of a cluster only (the
    others had another loader's), from the ledger's end again; failed, stop it.

    A unit the round's planning found loaded already (Ledger.known: another member of
    the group committed the same offsets since this run planned them) has no result
    from the round: it is reported skipped like one the commit refused, never taken for
    a failure that stops its partition without a word (the run would then end, exit 0,
    short of that partition's rows). A refused unit whose partition's end in the ledger
    did not move stops its partition with a failure, so the run cannot end as if the
    partition were loaded."""
    results = {r.uri: r for r in done.files}
    moved: list[Partition] = []
    for part, f in zip(due, files, strict=True):
        result = results.get(f.uri)
        if result is None:
            result = FileResult(f.uri, "skipped", note=LOADED_ELSEWHERE)
            done.files.append(result)
        end = int(f.uri.rpartition("-")[2]) + 1
        if result.status == "loaded" and result.note != LOADED_IN_PART:
            part.next = part.after = end
        elif result.note in (LOADED_ELSEWHERE, LOADED_IN_PART) or result.status == "skipped":
            moved.append(part)  # the ledger has it: another loader's since the plan
        else:
            part.stopped = True
            if result.error:
                result.error = offset_error(result.error, f)
    if moved:
        found = committed(target, table.database, table.name, table.display)
        for part in due:
            if not follow(part, found) and any(part is m for m in moved):
                done.files.append(_stuck(part))


def _stuck(part: Partition) -> FileResult:
    """A partition whose unit was refused as loaded elsewhere while the ledger's end did
    not move past where its plan started: stopped (never the same unit again), as a
    failure (the run must not end as if it were loaded)."""
    part.stopped = True
    return FileResult(part.stream, "failed", error=(
        f"kafka {part.topic}/{part.partition}: a unit was refused as loaded by another "
        f"run, yet the ledger's end of the partition is still {part.after}; nothing more "
        "loaded from it: run the same command again to go on from the ledger's end"))


def _add(report: LoadReport, results: Sequence[FileResult],
         done: LoadReport | None = None) -> None:
    report.add_units(results)
    if done is not None:
        report.created_table = report.created_table or done.created_table
        report.table_reset = report.table_reset or done.table_reset
        report.saturation = done.saturation or report.saturation
        report.schema_changes += done.schema_changes  # (--on-new-column add: a round's)
        report.notes += [n for n in done.notes if NEW_COLUMN_FLAG in n
                         and n not in report.notes]


@contextmanager
def _stopping(options: Options) -> Iterator[None]:
    """With --follow, SIGINT and SIGTERM end the run after the round in flight; on
    another thread than the main one, runtime.stopping.stop_following does."""
    if not options.follow:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        with stopping.registered(options.stop):
            yield
        return
    with stopping.on_signals(options.stop.set, once=False):
        yield


class KafkaStreamSource(RemoteSource):
    """kafka:// in the sources registry, so the scheme is known everywhere a source is
    looked up (its display in the run history, the S3 check of a run's sources). A
    stream is not listed once like files: dispatch._load_stream plans and reads its units
    round by round (`load` above), and the spooled units are local files."""

    kind = "kafka"
    schemes: tuple[str, ...] = ("kafka",)
    options: tuple[str, ...] = ("follow", "batch_rows", "batch_seconds", "kafka_options")
    unit = "batch"  # an offset range of a partition
    reads_in_place = False  # offsets are spooled or piped by the reader

    def rounds(self, spec: LoadSpec, target: Target, listener: Listener,
               load_round: LoadRound, table: Any, report: LoadReport) -> None:
        options = Options(spec.batch_rows or BATCH_ROWS, spec.batch_seconds or BATCH_SECONDS,
                          spec.follow, spec.kafka_options)
        load(spec, target, listener, load_round, table, report, options)

    def audit_columns(self, target: Target, data: list[Column], fmt: str,
                      inferred: bool) -> list[Column]:
        return with_kafka_columns(target, data, fmt, inferred)

    def list(self, pattern: str, context: SourceContext) -> list[SourceFile]:
        raise UsageError(f"{pattern}: a Kafka topic is read by `chload load` alone (its units "
                         "are planned from the ledger round by round); name it as the only "
                         "source of a load")

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        from chload.sources import pipes as db_pipes

        if db_pipes.is_pipe(file.local_path):  # a unit streamed by _stream_round
            args = [file.local_path or "", fmt, structure or "auto"]
            return f"file({', '.join(quote_str(a) for a in args)})"
        raise UsageError(f"{file.uri}: a Kafka unit is read from its spool, not in place")

    def current(self, file: SourceFile) -> SourceFile:
        """A streamed unit is checked after its read: it commits only if its reader
        finished it (db_pipes.check raises otherwise)."""
        from chload.sources import pipes as db_pipes

        if db_pipes.is_pipe(file.local_path):
            db_pipes.check(file.local_path or "", file.uri)
        return file

    def release(self, files: Iterable[SourceFile]) -> None:
        from chload.sources import pipes as db_pipes

        for f in files:
            db_pipes.release(f.local_path or "")

    def loads_alone(self, file: SourceFile) -> bool:
        return True  # a unit is a commit of its own, its pipe read once


SOURCE = KafkaStreamSource()
