"""Where a Kafka load starts: the kafka:// URI, each partition's committed end read
from the target's ledger, and the plan from there to the high watermark, with a topic
rewound, re-created or cut by retention below the ledger's end reported
(docs/sources-kafka.md: units and the exactly-once argument). Apart from source.py, which runs
the rounds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from chload.commit.ledger import COMMITTING, LOADED, own_history
from chload.core.run import FileResult
from chload.errors import UsageError
from chload.sources.base import partly_committed
from chload.sources.kafka.read import Broker, Unit

if TYPE_CHECKING:
    from chload.targets.base import Target

SCHEME = "kafka://"


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
    streamed: int = 0  # rounds in which this run streamed a unit of it (source._stream_round)
    pending: tuple[int, int] | None = None  # a unit some shards of a cluster have (Marks)

    def unit(self, rows: int) -> Unit:
        """The next unit: at most `rows` messages up to the end; or, where a cluster's
        shards have committed a unit from here on some of them only, that unit again,
        whatever its size (its other shards commit it where the first did)."""
        if self.pending is not None and self.pending[0] == self.next:
            return Unit(self.topic, self.partition, self.next, self.pending[1])
        return Unit(self.topic, self.partition, self.next, min(self.end, self.next + rows) - 1)


@dataclass(frozen=True, slots=True)
class Mark:
    """A stream's place in the ledger, counted within one topic id: the id of its
    latest committed unit (a topic re-created and accepted with --force has the new
    one), the end of that id's units, and the ledger seq from which they count."""

    end: int  # last offset of the topic id's highest committed unit + 1
    topic_id: str  # '' where the broker has no topic ids
    since: int  # events before it are of another topic of that name (or set aside)
    latest: int  # the seq of the stream's latest committed unit, whatever its id
    replaced: bool = False  # units of another id before: a re-created topic, accepted


def stream_of(source: KafkaSource, topic: str, partition: int) -> str:
    return f"{SCHEME}{source.bootstrap}/{topic}/{partition}"


@dataclass(slots=True)
class Marks:
    """What the ledger says of a table's Kafka streams: each stream's Mark, the ledger
    seq from which events count (events before it were set aside), and the units a
    cluster's shards have committed on some shards only (stream -> (first, last)): the
    unit a run must load next from there, on the shards that lack it (targets/cluster)."""

    marks: dict[str, Mark]
    since: int
    pending: dict[str, tuple[int, int]]


def committed(target: Target, database: str, name: str, display: str) -> Marks:
    """Each Kafka stream's committed end in the table's own history (ledger.own_history:
    a table dropped, re-created or truncated starts again), within its latest topic id.
    Into a cluster (`target` the ClusterTarget of the Distributed table: its ledger reads
    each shard's, where the units are recorded under the local table), a unit counts
    once every shard it goes to has committed it; one that some shards have is pending."""
    latest = target.ledger.latest(display)
    live = {e.uri: e for e in latest
            if e.uri.startswith(SCHEME) and e.state in (COMMITTING, LOADED)}
    pending: dict[str, tuple[int, int]] = {}
    if any(e.target_table != display for e in latest):  # a cluster's, shard by shard
        complete = target.ledger.loaded(display)
        pending = partly_committed(live, complete)
        top: dict[str, int] = {}  # each shard writes its own events: the latest counts
        for e in latest:
            top[e.uri] = max(top.get(e.uri, 0), e.seq)
        live = {uri: replace(complete[uri], seq=top[uri]) for uri in live if uri in complete}
    own, _ = own_history(target.ledger.table_state(database, name), live)
    since = max((e.seq for uri, e in live.items() if uri not in own), default=-1) + 1
    units: dict[str, list[tuple[int, str, int]]] = {}  # stream -> (seq, topic id, end)
    for uri, event in own.items():
        stream, _, span = uri.rpartition("/")
        if event.seq >= since:
            units.setdefault(stream, []).append(
                (event.seq, event.identity.rpartition(":")[0], int(span.rpartition("-")[2]) + 1))
    return Marks({stream: _mark(found, since) for stream, found in units.items()}, since,
                 pending)


def _mark(units: list[tuple[int, str, int]], since: int) -> Mark:
    """A stream's mark from its committed units (seq, topic id, end): offsets are
    compared only within the topic id of the latest (units without an id, where it
    could not be read, count with those around them), and units before the last one
    of another id (an older topic of that name) are set aside by seq."""
    ordered = sorted(units)
    topic_id = next((i for _, i, _ in reversed(ordered) if i), "")
    start = max((n for n, (_, i, _) in enumerate(ordered) if i and i != topic_id),
                default=-1) + 1
    if start:
        since = max(since, ordered[start - 1][0] + 1)
    return Mark(max(end for _, _, end in ordered[start:]), topic_id, since, ordered[-1][0],
                replaced=start > 0)


def follow(part: Partition, found: Marks) -> bool:
    """Move the partition on to its committed end in the ledger, where that is beyond
    its own and of the same topic (another loader's units); whether it moved."""
    mark = found.marks.get(part.stream)
    if mark is None or mark.end <= part.after or not same_topic(mark.topic_id,
                                                                part.topic_id):
        return False
    part.next = part.after = max(part.next, mark.end)
    part.since_seq = max(part.since_seq, mark.since)
    part.pending = found.pending.get(part.stream)
    return True


def same_topic(a: str, b: str) -> bool:
    """Whether two topic ids may be of one topic ('': not known, as on a broker
    without ids)."""
    return not a or not b or a == b


def plan(broker: Broker, source: KafkaSource, found: Marks,
         force: bool) -> tuple[list[Partition], list[FileResult]]:
    """Every partition of the source's topics, from its committed end (or low
    watermark) to its high watermark now; and the partitions refused, with why."""
    marks, since = found.marks, found.since
    partitions: list[Partition] = []
    refused: list[FileResult] = []
    for topic in source.topics:
        numbers = broker.partitions(topic)  # first: a broker down or no topic, said soon
        topic_id = broker.topic_id(topic)
        accepted = _accepted(marks, f"{SCHEME}{source.bootstrap}/{topic}", topic_id)
        for number in numbers:
            low, high = broker.watermarks(topic, number)
            stream = stream_of(source, topic, number)
            part = Partition(topic, number, stream, topic_id, low, 0, high, since)
            problem = _place(part, marks.get(stream), low, high, force, accepted)
            if problem:
                refused.append(FileResult(stream, "failed", error=problem))
            else:
                part.pending = found.pending.get(stream)
                partitions.append(part)
    return partitions, refused


def _accepted(marks: dict[str, Mark], topic: str, topic_id: str) -> bool:
    """Whether the topic as it is now (`topic_id`) was accepted with --force by an
    earlier run: a partition of it has units of this id after units of another (only
    --force loads those), so a partition that had nothing to load then (empty, or a
    unit failed) is loaded from its start without asking again."""
    return bool(topic_id) and any(
        m.replaced and m.topic_id == topic_id for stream, m in marks.items()
        if stream.rpartition("/")[0] == topic)


def _place(part: Partition, mark: Mark | None, low: int, high: int, force: bool,
           accepted: bool = False) -> str:
    """Set where the partition starts from its ledger mark; or say why it cannot
    (`accepted`: the topic was re-created and loaded with --force before)."""
    if mark is None:
        return ""
    where = f"kafka {part.topic}/{part.partition}"
    old_id = mark.topic_id
    if not same_topic(old_id, part.topic_id):
        if force or accepted:  # the new topic from its start; the old one's set aside
            part.since_seq = mark.latest + 1  # (its first commit makes the ledger follow it)
            return ""
        return (f"{where}: the topic was re-created (id {part.topic_id}, the ledger's "
                f"loads are of {old_id}); nothing loaded from it: pass --force to load the "
                "new topic from its start")
    part.next = part.after = mark.end
    part.since_seq = mark.since
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
