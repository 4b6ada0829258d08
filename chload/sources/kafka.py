"""Kafka topics into a table, exactly once: offset ranges as units, loaded like files.

A unit is (topic, partition, first offset, last offset), named in the ledger
`kafka://<bootstrap>/<topic>/<partition>/<first>-<last>` (never a secret) with the
topic's id and the range as its identity. Each is read into a spool file in the
target's tmp directory (values joined by newlines: the engine parses them as a block,
no row passes through Python) and loaded through the same target paths and the same
committer as a file: its rows and its ledger entry commit together.

Where a partition stands is the ledger's, not Kafka's: its committed end is the highest
last offset of its committed units, plus one. Units are planned from there (or the low
watermark) to the high watermark seen at start, and each commits only while that end
is still the one its plan saw (commit.py rule 5, sources.StreamPosition). So a kill at
any instant, two chloads on one topic at once, or a rerun load each offset once:
consumer-group offsets decide nothing (none are committed). The argument in full, and
the measurements behind the reader, are in docs/kafka.md.

    plan     recover the table (settle `committing`), read each partition's committed
             end, its watermarks and the topic's id; report a topic rewound, re-created
             or cut by retention below the ledger's end
    read     per round, the next unit of each partition (up to --batch-rows messages)
             into a spool, values joined by newlines: by the native reader (C through
             ctypes, all partitions in one call, no Python object per message) or,
             without cc or librdkafka, by confluent-kafka consume(5000) (kafka_read.py,
             kafka_native.py); the next round is read in a thread while one loads
    load     the round's spools through api._load (stage, commit, ledger); a unit
             refused because its partition moved (another loader) is planned again
             from the new end; a failed unit stops its partition
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chload.errors import UsageError
from chload.formats import FileFormat
from chload.ledger import COMMITTING, LOADED
from chload.runner import LOADED_ELSEWHERE, Event, FileResult, Listener
from chload.schema import Column
from chload.sources import SourceContext, SourceFile, StreamPosition
from chload.sources.kafka_read import Broker, Spooled, SpoolReader, Unit, client_config
from chload.sources.remote import RemoteSource

if TYPE_CHECKING:
    from chload.api import LoadReport, LoadSpec
    from chload.targets import Target

SCHEME = "kafka://"
BATCH_ROWS = 500_000  # messages a unit holds at most (--batch-rows)
BATCH_SECONDS = 5.0  # --follow: a unit is cut at least this often (--batch-seconds)
# Formats whose rows are one message each once joined by newlines.
LINE_FORMATS = {"JSONEachRow", "JSONLines", "NDJSON", "JSONAsString", "JSONCompactEachRow",
                "CSV", "TSV", "TabSeparated", "LineAsString", "TSKV", "CustomSeparated"}
_EXTENSIONS = {"JSONEachRow": "jsonl", "CSV": "csv", "TSV": "tsv", "TabSeparated": "tsv"}
# --audit: the formats whose rows are JSON objects, which the reader extends with the
# message's Kafka columns (kafka_read.audited), and those columns' types.
AUDIT_FORMATS = {"JSONEachRow", "JSONLines", "NDJSON"}
AUDIT_COLUMNS = {"_topic": "LowCardinality(String)", "_partition": "UInt32",
                 "_offset": "UInt64", "_timestamp": "DateTime64(3, 'UTC')", "_key": "String"}

LoadRound = Callable[[list[SourceFile]], "LoadReport"]


def is_kafka(sources: Sequence[str]) -> bool:
    return any(s.lower().startswith(SCHEME) for s in sources)


@dataclass(frozen=True, slots=True)
class KafkaSource:
    """What `kafka://host:port[,host:port]/topic[,topic]` names."""

    bootstrap: str
    topics: tuple[str, ...]


def parse_uri(sources: Sequence[str]) -> KafkaSource:
    """The one kafka:// source of a load (several topics comma-separated)."""
    if len(sources) != 1:
        raise UsageError("a Kafka load takes one kafka://broker:port/topic source (several "
                         "topics comma-separated); load files with another command")
    rest = sources[0][len(SCHEME):]
    bootstrap, _, path = rest.partition("/")
    if "@" in bootstrap:
        raise UsageError("kafka://: no credentials in the URI; pass them with --kafka-option "
                         "sasl.username=... --kafka-option 'sasl.password=${VAR}'")
    topics = tuple(t for t in path.strip("/").split(",") if t)
    if not bootstrap or not topics or any("/" in t for t in topics):
        raise UsageError(f"{sources[0]}: write kafka://broker:port/topic (several topics "
                         "comma-separated)")
    return KafkaSource(bootstrap.lower(), topics)


# --------------------------------------------------------------------------- planning

@dataclass(slots=True)
class Partition:
    """One partition's place: the next offset to load, the committed end the plan
    started from (`after`), and up to where this run loads (`end`)."""

    topic: str
    partition: int
    stream: str
    topic_id: str
    next: int
    after: int
    end: int
    since_seq: int = 0
    stopped: bool = False

    def unit(self, rows: int) -> Unit:
        return Unit(self.topic, self.partition, self.next, min(self.end, self.next + rows) - 1)


@dataclass(frozen=True, slots=True)
class Mark:
    end: int  # last offset of the stream's latest committed unit + 1
    identity: str  # that unit's identity: '<topic id>:<first>-<last>'


def stream_of(source: KafkaSource, topic: str, partition: int) -> str:
    return f"{SCHEME}{source.bootstrap}/{topic}/{partition}"


def committed(target: Target, database: str, name: str, display: str,
              ) -> tuple[dict[str, Mark], int]:
    """Each Kafka stream's committed end in the table's own history (planner.own_history:
    a table dropped, re-created or truncated starts again), and the ledger seq from
    which events count (events before it were set aside)."""
    from chload import planner

    live = {e.uri: e for e in target.ledger.latest(display)
            if e.uri.startswith(SCHEME) and e.state in (COMMITTING, LOADED)}
    own, _ = planner.own_history(target.ledger.table_state(database, name), live)
    since = max((e.seq for uri, e in live.items() if uri not in own), default=-1) + 1
    marks: dict[str, Mark] = {}
    for uri, event in own.items():
        stream, _, span = uri.rpartition("/")
        end = int(span.rpartition("-")[2]) + 1
        if event.seq >= since and end > marks.get(stream, Mark(0, "")).end:
            marks[stream] = Mark(end, event.identity)
    return marks, since


def plan(broker: Broker, source: KafkaSource, marks: dict[str, Mark], since: int,
         force: bool) -> tuple[list[Partition], list[FileResult]]:
    """Every partition of the source's topics, from its committed end (or low
    watermark) to its high watermark now; and the partitions refused, with why."""
    partitions: list[Partition] = []
    refused: list[FileResult] = []
    for topic in source.topics:
        topic_id = broker.topic_id(topic)
        for number in broker.partitions(topic):
            low, high = broker.watermarks(topic, number)
            stream = stream_of(source, topic, number)
            part = Partition(topic, number, stream, topic_id, low, 0, high, since)
            problem = _place(part, marks.get(stream), low, high, force)
            if problem:
                refused.append(FileResult(stream, "failed", error=problem))
            else:
                partitions.append(part)
    return partitions, refused


def _place(part: Partition, mark: Mark | None, low: int, high: int, force: bool) -> str:
    """Set where the partition starts from its ledger mark; or say why it cannot."""
    if mark is None:
        return ""
    where = f"kafka {part.topic}/{part.partition}"
    old_id = mark.identity.rpartition(":")[0]
    if old_id and part.topic_id and old_id != part.topic_id:
        if force:  # the new topic from its start; the old one's units are set aside
            part.since_seq = time.time_ns()
            return ""
        return (f"{where}: the topic was re-created (id {part.topic_id}, the ledger's "
                f"loads are of {old_id}); nothing loaded from it: pass --force to load the "
                "new topic from its start")
    part.next = part.after = mark.end
    if mark.end > high:
        return (f"{where}: offsets end at {high} but the ledger has loaded up to "
                f"{mark.end - 1} (topic rewound or re-created); nothing loaded from it")
    if mark.end < low:
        if force:
            part.next = low
            return ""
        return (f"{where}: offsets {mark.end}..{low - 1} were deleted (retention) before "
                f"chload loaded them; nothing loaded from it: pass --force to go on from "
                f"offset {low}, without them")
    return ""


# --------------------------------------------------------------------------- the run

@dataclass(slots=True)
class Options:
    batch_rows: int = BATCH_ROWS
    batch_seconds: float = BATCH_SECONDS
    follow: bool = False
    kafka_options: tuple[tuple[str, str], ...] = ()
    stop: threading.Event = field(default_factory=threading.Event)
    audit: bool = False  # each row with its Kafka columns (AUDIT_COLUMNS)


def with_kafka_columns(target: Target, data: list[Column]) -> list[Column]:
    """--audit: the data's columns with the Kafka columns (which the reader writes into
    each row) at their types: an inferred type replaced, a missing column (--schema)
    added. `_timestamp` is DateTime('UTC') (seconds) where the target lacks DateTime64."""
    caps = getattr(target, "caps", None)
    types = dict(AUDIT_COLUMNS)
    if caps is not None and "DateTime64" not in caps.types:
        types["_timestamp"] = "DateTime('UTC')"
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
                         "_partition, _offset, _timestamp, _key) are added to JSON objects; "
                         f"use one of {', '.join(sorted(AUDIT_FORMATS))}, or leave out --audit")
    options.audit = spec.audit
    report.recovered += target.recover(table.sql)
    group = f"chload-{table.display}"
    broker = Broker(client_config(source.bootstrap, options.kafka_options),
                    client_config(source.bootstrap, options.kafka_options, consumer=False), group)
    try:
        marks, since = committed(target, table.database, table.name, table.display)
        partitions, refused = plan(broker, source, marks, since, spec.force)
        for failed in refused:
            listener(Event("fail", failed.uri, error=failed.error))
        _add(report, refused)
        reader = SpoolReader(broker, client_config(source.bootstrap, options.kafka_options,
                                                   native=True), group)
        if reader.why:
            report.notes.append(f"Kafka: the Python reader (slower): {reader.why}")
        try:
            with _spool_dir(target) as spool, _stopping(options):
                _rounds(reader, fmt, partitions, spool, load_round, report, options,
                        target, table, listener)
        finally:
            reader.close()
    finally:
        broker.close()
    return report


@dataclass(slots=True)
class Spool:
    """A unit read into its spool file, and the committed end its commit requires."""

    part: Partition
    unit: Unit
    after: int
    file: SourceFile


def _rounds(reader: SpoolReader, fmt: FileFormat, partitions: list[Partition], spool: str,
            load_round: LoadRound, report: LoadReport, options: Options, target: Target,
            table: Any, listener: Listener) -> None:
    """Per round, the next unit of every partition with offsets due, loaded together;
    with --follow, watermarks are read again and rounds go on until stopped. While a
    round loads, a reader thread reads the next one (as if this one commits: a unit
    whose partition did not end where it begins is dropped unread by the engine)."""
    last_cut = time.monotonic()
    ahead: Future[list[Spool]] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="chload-kafka-read") as pool:
        try:
            while not options.stop.is_set():
                due = [p for p in partitions if not p.stopped and p.next < p.end]
                if not due:
                    if not options.follow:
                        return
                    _wait(options, last_cut)
                    _refresh(reader.broker, partitions)
                    _lag(listener, partitions)
                    continue
                spools = _taken(ahead, due, options.batch_rows)
                ahead = None
                covered = {id(s.part) for s in spools}
                spools += _read(reader, fmt, spool, [(p, p.unit(options.batch_rows), p.after)
                                                     for p in due if id(p) not in covered],
                                options.audit)
                following = _following(spools, options.batch_rows)
                if following:
                    ahead = pool.submit(_read, reader, fmt, spool, following, options.audit)
                _load_round(spools, load_round, report, target, table)
                _lag(listener, partitions)
                last_cut = time.monotonic()
        finally:
            if ahead is not None:
                _drop(ahead)


def _following(spools: list[Spool], rows: int) -> list[tuple[Partition, Unit, int]]:
    """The unit after each spool's, where its partition has offsets due beyond it."""
    return [(s.part, Unit(s.part.topic, s.part.partition, s.unit.last + 1,
                          min(s.part.end, s.unit.last + 1 + rows) - 1), s.unit.last + 1)
            for s in spools if s.unit.last + 1 < s.part.end]


def _taken(ahead: Future[list[Spool]] | None, due: list[Partition], rows: int) -> list[Spool]:
    """The spools read ahead that still follow their partition's end; others removed."""
    if ahead is None:
        return []
    kept = []
    for s in ahead.result():
        due_now = any(s.part is p for p in due)
        if due_now and s.unit.first == s.part.next == s.after == s.part.after:
            kept.append(s)
        else:
            _remove(s.file.local_path)
    return kept


def _drop(ahead: Future[list[Spool]]) -> None:
    try:
        for s in ahead.result():
            _remove(s.file.local_path)
    except Exception:  # noqa: BLE001 - a read ahead that nothing needs any more
        pass


def _load_round(spools: list[Spool], load_round: LoadRound, report: LoadReport,
                target: Target, table: Any) -> None:
    files = [s.file for s in spools]
    try:
        done = load_round(files)
    finally:
        for f in files:
            _remove(f.local_path)
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


def _read(reader: SpoolReader, fmt: FileFormat, spool: str,
          units: list[tuple[Partition, Unit, int]], audit: bool = False) -> list[Spool]:
    """Read units into spool files (one call for all); `after` per unit is the committed
    end its commit will require."""
    if not units:
        return []
    ext = _EXTENSIONS.get(fmt.name, "txt")
    paths = [os.path.join(spool, f"kafka-{u.topic}-{u.partition}-{u.first}-{u.last}.{ext}")
             for _, u, _ in units]
    done = reader.read([(u, path) for (_, u, _), path in zip(units, paths, strict=True)],
                       audit)
    return [Spool(part, unit, after, _spooled(part, unit, after, path, read, fmt))
            for (part, unit, after), path, read in zip(units, paths, done, strict=True)]


def _spooled(part: Partition, unit: Unit, after: int, path: str, read: Spooled,
             fmt: FileFormat) -> SourceFile:
    base = read.first_offset - 1 if read.contiguous and read.first_offset >= 0 else 0
    identity = f"{part.topic_id}:{unit.first}-{unit.last}"
    return SourceFile(f"{part.stream}/{unit.first}-{unit.last}", read.bytes, 0, fmt,
                      etag=identity, local_path=path,
                      position=StreamPosition(part.stream, after, part.since_seq, base))


def _advance(due: list[Partition], files: list[SourceFile], done: LoadReport,
             target: Target, table: Any) -> None:
    """Move each partition on after its unit: loaded, the next offset; refused (another
    loader moved the partition), from the ledger's end again; failed, stop it."""
    results = {r.uri: r for r in done.files}
    moved = False
    for part, f in zip(due, files, strict=True):
        result = results.get(f.uri)
        end = int(f.uri.rpartition("-")[2]) + 1
        if result is not None and result.status == "loaded":
            part.next = part.after = end
        elif result is not None and result.note == LOADED_ELSEWHERE:
            moved = True
        else:
            part.stopped = True
            if result is not None and result.error:
                result.error = _offset_error(result.error, f)
    if moved:
        marks, _ = committed(target, table.database, table.name, table.display)
        for part in due:
            mark = marks.get(part.stream)
            if mark is not None and mark.end > part.after:
                part.next = part.after = max(part.next, mark.end)


def _offset_error(error: str, f: SourceFile) -> str:
    """`<unit uri>: line N, ...` (a row of the spool) as the message's offset."""
    base = f.position.line_base if f.position else 0
    match = re.match(rf"^{re.escape(f.uri)}: line (\d+)", error)
    if not match or not base:
        return error
    offset = base + int(match.group(1))
    return f"{f.uri}: offset {offset}{error[match.end():]}"


def _add(report: LoadReport, results: Sequence[FileResult],
         done: LoadReport | None = None) -> None:
    report.files.extend(results)
    report.files_total += len(results)
    report.files_loaded += sum(r.status == "loaded" for r in results)
    report.files_skipped += sum(r.status == "skipped" for r in results)
    report.files_failed += sum(r.status == "failed" for r in results)
    report.rows_loaded += sum(r.rows for r in results if r.status == "loaded")
    report.rows_rejected += sum(r.rejected for r in results if r.status == "loaded")
    report.bytes_read += sum(r.bytes for r in results)
    if done is not None:
        report.created_table = report.created_table or done.created_table
        report.table_reset = report.table_reset or done.table_reset
        report.saturation = done.saturation or report.saturation


@contextmanager
def _spool_dir(target: Target) -> Iterator[str]:
    """Spools in the target's tmp directory (an embedded target's; else the system's)."""
    home = str(getattr(target, "path", ""))
    base = os.path.join(home, "tmp") if home and os.path.isdir(home) else None
    if base:
        os.makedirs(base, exist_ok=True)
    path = tempfile.mkdtemp(prefix="chload-kafka-", dir=base)
    try:
        yield path
    finally:
        for name in os.listdir(path):
            _remove(os.path.join(path, name))
        os.rmdir(path)


def _remove(path: str | None) -> None:
    if path and os.path.exists(path):
        os.remove(path)


@contextmanager
def _stopping(options: Options) -> Iterator[None]:
    """With --follow, SIGINT and SIGTERM end the run after the round in flight."""
    if not options.follow or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in before:
        signal.signal(s, lambda *_: options.stop.set())
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


class KafkaStreamSource(RemoteSource):
    """kafka:// in the sources registry, so the scheme is known everywhere a source is
    looked up (its display in the run history, the S3 check of a run's sources). A
    stream is not listed once like files: api._load_stream plans and reads its units
    round by round (`load` above), and the spooled units are local files."""

    kind = "kafka"
    schemes: tuple[str, ...] = ("kafka",)

    def list(self, pattern: str, context: SourceContext) -> list[SourceFile]:
        raise UsageError(f"{pattern}: a Kafka topic is read by `chload load` alone (its units "
                         "are planned from the ledger round by round); name it as the only "
                         "source of a load")

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        raise UsageError(f"{file.uri}: a Kafka unit is read from its spool, not in place")


SOURCE = KafkaStreamSource()
