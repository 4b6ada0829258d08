"""Where a Kafka partition starts, from the ledger's units (plan.committed, _place,
follow), with a scripted ledger: offsets are compared within one topic id, the latest
committed unit's, so a re-created topic accepted once is followed from then on."""

from __future__ import annotations

from typing import Any

from chload.commit.ledger import COMMITTING, FAILED, LOADED, FileEvent, TableState
from chload.sources.base import partly_committed
from chload.sources.kafka import plan as P

STREAM = "kafka://b:9092/t/0"


class _Ledger:
    def __init__(self, events: list[FileEvent]) -> None:
        self.events = events

    def latest(self, display: str) -> list[FileEvent]:
        return self.events

    def table_state(self, database: str, name: str) -> TableState:
        return TableState(True, "", 1)


class _Target:
    def __init__(self, events: list[FileEvent]) -> None:
        self.ledger = _Ledger(events)


def _unit(first: int, last: int, topic_id: str, seq: int, state: str = LOADED) -> FileEvent:
    return FileEvent("d.t", f"{STREAM}/{first}-{last}", f"{topic_id}:{first}-{last}", 0, 0,
                     state, rows=last - first + 1, seq=seq)


def _marks(events: list[FileEvent]) -> dict[str, P.Mark]:
    target: Any = _Target(events)
    return P.committed(target, "d", "t", "d.t").marks


def _part(topic_id: str) -> P.Partition:
    return P.Partition("t", 0, STREAM, topic_id, 0, 0, 10_000)


def test_one_topic_ends_at_its_highest_unit() -> None:
    mark = _marks([_unit(0, 499, "A", 10), _unit(500, 1099, "A", 20, COMMITTING)])[STREAM]
    assert (mark.end, mark.topic_id, mark.since, mark.latest) == (1100, "A", 0, 20)


def test_a_re_created_topic_once_loaded_is_followed_and_the_old_set_aside() -> None:
    # old topic A: 0-499, 500-1099; new topic B (after --force): 0-499 (the same name as
    # A's first unit: its latest event is B's), 500-599
    events = [_unit(0, 499, "B", 30), _unit(500, 1099, "A", 20), _unit(500, 599, "B", 40)]
    mark = _marks(events)[STREAM]
    assert (mark.end, mark.topic_id, mark.since, mark.latest) == (600, "B", 21, 40)
    part = _part("B")
    assert P._place(part, mark, 0, 700, force=False) == ""
    assert (part.next, part.after, part.since_seq) == (600, 600, 21)
    part = _part("B")
    assert P._place(part, mark, 0, 700, force=True) == ""  # --force reloads nothing
    assert (part.next, part.after) == (600, 600)


def test_a_re_created_topic_is_refused_then_forced_from_its_start() -> None:
    mark = _marks([_unit(0, 499, "A", 10), _unit(0, 99, "B", 30, FAILED)])[STREAM]
    assert (mark.end, mark.topic_id) == (500, "A")  # B's failed unit counts for nothing
    part = _part("B")
    assert "re-created" in P._place(part, mark, 0, 700, force=False)
    part = _part("B")
    assert P._place(part, mark, 0, 700, force=True) == ""
    assert (part.next, part.after, part.since_seq) == (0, 0, 11)  # A's units set aside


def test_a_partition_follows_only_a_mark_of_its_own_topic() -> None:
    marks = P.Marks({STREAM: P.Mark(1100, "A", 0, 20)}, 0, {})
    part = _part("B")
    assert not P.follow(part, marks) and part.next == 0  # another loader's? no: old topic
    marks = P.Marks({STREAM: P.Mark(300, "B", 21, 40)}, 0, {})
    assert P.follow(part, marks)
    assert (part.next, part.after, part.since_seq) == (300, 300, 21)


def test_units_without_a_topic_id_count_with_those_around_them() -> None:
    # A, then B (re-created, --force), then a run that could not read the id, then B
    events = [_unit(0, 499, "A", 10), _unit(500, 1099, "A", 20), _unit(0, 99, "B", 30),
              _unit(100, 199, "", 40), _unit(200, 299, "B", 50)]
    mark = _marks(events)[STREAM]
    assert (mark.end, mark.topic_id, mark.since, mark.latest) == (300, "B", 21, 50)
    mark = _marks(events[:4])[STREAM]
    assert (mark.end, mark.topic_id, mark.since) == (200, "B", 21)
    part = _part("")  # the id not read this time: no refusal, the ledger's end
    assert P._place(part, mark, 0, 700, force=False) == "" and part.next == 200
    assert P.follow(_part(""), P.Marks({STREAM: mark}, 0, {}))


def test_a_topic_forced_once_is_accepted_for_its_partitions_with_nothing_loaded_yet() -> None:
    topic = STREAM.rpartition("/")[0]
    marks = _marks([_unit(0, 499, "A", 10), _unit(0, 99, "B", 30)])  # partition 0: forced
    assert marks[STREAM].replaced and P._accepted(marks, topic, "B")
    assert not P._accepted(marks, topic, "C")  # re-created again since
    new_only = {f"{topic}/2": P.Mark(100, "B", 0, 30)}  # a new partition, loaded plainly
    assert not P._accepted(new_only, topic, "B")
    part = _part("B")  # partition 1: the old topic's units only
    assert P._place(part, P.Mark(700, "A", 0, 20), 0, 50, force=False, accepted=True) == ""
    assert (part.next, part.after, part.since_seq) == (0, 0, 21)


class _ShardLedger(_Ledger):
    """A cluster's ledger: each shard's events (named `<table> shard N`), and the units
    every shard has (`loaded`)."""

    def __init__(self, by_shard: dict[int, list[FileEvent]]) -> None:
        super().__init__([FileEvent(**{**_fields(e), "target_table": f"d.t shard {n}"})
                          for n, events in by_shard.items() for e in events])
        uris = [{e.uri for e in events} for events in by_shard.values()]
        self.complete = {e.uri: e for e in by_shard[1] if all(e.uri in u for u in uris)}

    def loaded(self, display: str) -> dict[str, FileEvent]:
        return self.complete


def _fields(event: FileEvent) -> dict[str, Any]:
    return {k: getattr(event, k) for k in event.__slots__}  # type: ignore[attr-defined]


def test_a_unit_some_shards_of_a_cluster_have_is_the_next_unit_whole() -> None:
    """Killed between shards' commits: 300-599 is on shard 1 only. The mark is 300 (what
    every shard has), and the partition's next unit is 300-599 again, whatever
    --batch-rows is now, so the shards that lack it commit the same unit."""
    done = [_unit(0, 299, "A", 10)]
    target: Any = _Target([])
    target.ledger = _ShardLedger({1: [*done, _unit(300, 599, "A", 20)], 2: done, 3: done})
    found = P.committed(target, "d", "t", "d.t")
    assert found.marks[STREAM].end == 300 and found.pending == {STREAM: (300, 599)}
    part = _part("A")
    assert P._place(part, found.marks[STREAM], 0, 2_000, force=False) == ""
    part.pending = found.pending[STREAM]
    unit = part.unit(100)
    assert (unit.first, unit.last) == (300, 599)
    part.next = 600
    assert (part.unit(100).first, part.unit(100).last) == (600, 699)


def test_the_unit_a_cluster_has_on_some_shards_only_is_each_streams_lowest_one_not_complete(
        ) -> None:
    other = "kafka://b:9092/t/1"
    uris = [f"{STREAM}/0-99", f"{STREAM}/200-299", f"{STREAM}/100-199", f"{other}/0-9"]
    assert partly_committed(uris, {f"{STREAM}/0-99", f"{other}/0-9"}) == {STREAM: (100, 199)}
    assert partly_committed(uris, set(uris)) == {}
