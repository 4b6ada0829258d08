"""Several chloads on one topic and table split its partitions: a Kafka consumer group
that decides who loads what, and nothing else (docs/sources-kafka.md, "Two chloads on one
topic and table").

A membership consumer subscribe()s to the topics with group.id `chload-<table>` (or
the user's --kafka-option group.id) and pauses every partition it is given: it fetches
nothing, commits nothing; its callbacks only say which partitions are this process's.
Rounds plan those partitions only (source._rounds through `due`). Exactness does not
rest on the group: the committer's check (commit.py rule 5) still refuses a unit whose
partition moved since it was planned, so a rebalance in the middle of a unit (old and
new owner both loading it for a moment) cannot duplicate. A run without --follow ends
when the ledger shows every partition at the end seen at start (`finished`), loading
itself any partition that the group hands over when its owner leaves unfinished; a
single process is given every partition, so it still loads everything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chload.core.run import FileResult
from chload.errors import UsageError
from chload.sources.kafka.plan import Partition, committed, follow
from chload.sources.kafka.read import LIBRDKAFKA_LOG

if TYPE_CHECKING:
    from chload.targets.base import Target

# How long a run waits for the group's first assignment before loading everything
# itself (a broker's group.initial.rebalance.delay.ms, 3 s by default, is most of it).
FIRST_ASSIGNMENT = 30.0
POLL_SECONDS = 0.2  # the membership consumer's poll (heartbeats are librdkafka's own)
# A member that stops heartbeating (kill -9) loses its partitions after this long,
# unless the user sets session.timeout.ms (the broker's minimum is 6 s by default).
SESSION_MS = "10000"
HEARTBEAT_MS = "1000"


def group_id(options: Sequence[tuple[str, str]], table: str) -> str:
    """The user's --kafka-option group.id, else `chload-<table>`."""
    given = [v for n, v in options if n == "group.id"]
    return given[-1] if given else f"chload-{table}"


class Membership:
    """This process's place in the group: the (topic, partition)s it owns now, kept
    current by a thread polling a consumer whose partitions stay paused."""

    def __init__(self, config: dict[str, Any], group: str, topics: Sequence[str]) -> None:
        try:
            from confluent_kafka import Consumer
        except ImportError as exc:
            raise UsageError("kafka:// needs confluent-kafka: pip install 'chload[kafka]'"
                             ) from exc
        settings = {**config, "group.id": group, "enable.auto.commit": "false",
                    "enable.partition.eof": "false", "auto.offset.reset": "latest",
                    "logger": LIBRDKAFKA_LOG, "error_cb": _ignored}  # a broker down: the
        # readers' failure and Broker.down say so, in one line
        settings.setdefault("session.timeout.ms", SESSION_MS)
        settings.setdefault("heartbeat.interval.ms", HEARTBEAT_MS)  # a rebalance seen soon
        self.group = group
        self._cooperative = "cooperative" in str(settings.get("partition.assignment.strategy"))
        self._owned: set[tuple[str, int]] = set()
        self._assigned = threading.Event()
        self._changes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer(settings)
        self._consumer.subscribe(list(topics), on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_revoke)
        self._thread = threading.Thread(target=self._poll, name="chload-kafka-group",
                                        daemon=True)
        self._thread.start()

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Eager (the default): the whole new assignment; cooperative (the user's
        partition.assignment.strategy=cooperative-sticky): the partitions added."""
        cooperative = self._cooperative
        if cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        consumer.pause(partitions)  # fetch nothing: the readers read, from the ledger's end
        with self._lock:
            given = {(p.topic, p.partition) for p in partitions}
            self._owned = self._owned | given if cooperative else given
            self._changes += 1
        self._assigned.set()

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        with self._lock:
            self._owned -= {(p.topic, p.partition) for p in partitions}
            self._changes += 1
        if self._cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self._consumer.poll(POLL_SECONDS)  # paused: callbacks, never a message
            except Exception:  # noqa: BLE001 - a broker hiccup: the group retries it
                time.sleep(POLL_SECONDS)

    def wait(self, stop: threading.Event, seconds: float = FIRST_ASSIGNMENT) -> bool:
        """Wait for the first assignment; False if none came (the caller loads all)."""
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            if self._assigned.wait(POLL_SECONDS):
                return True
        return False

    def owned(self) -> tuple[set[tuple[str, int]], int]:
        """The partitions this process owns, and a count that moves on each change."""
        with self._lock:
            return set(self._owned), self._changes

    def close(self) -> None:
        """Leave the group (its partitions go to the members left at once)."""
        self._stop.set()
        self._thread.join(5)
        try:
            self._consumer.close()
        except Exception:  # noqa: BLE001 - leaving a broker that is gone
            pass


def _ignored(error: Any) -> None:
    """The membership's errors (a broker down, a rebalance): the group retries them."""


class Share:
    """What a run loads of its partitions: all of them without a group, else those the
    group gives it, each re-planned from the ledger's end when it arrives (another
    member may have loaded it meanwhile)."""

    def __init__(self, membership: Membership | None, target: Target, table: Any) -> None:
        self.membership = membership
        self.target, self.table = target, table
        self._seen = -1

    def due(self, partitions: list[Partition]) -> list[Partition]:
        """The partitions this process loads now that have offsets due."""
        if self.membership is None:
            return [p for p in partitions if not p.stopped and p.next < p.end]
        owned, changes = self.membership.owned()
        if changes != self._seen:
            self._seen = changes
            self.sync(partitions)
        return [p for p in partitions if not p.stopped and p.next < p.end
                and (p.topic, p.partition) in owned]

    def sync(self, partitions: list[Partition]) -> None:
        """Each partition moved on to its committed end in the ledger, where beyond and
        of the same topic id (a re-created topic's first units follow the old one's)."""
        found = committed(self.target, self.table.database, self.table.name,
                          self.table.display)
        for p in partitions:
            follow(p, found)

    def finished(self, partitions: list[Partition]) -> bool:
        """Without --follow: whether every partition is at the end seen at start in the
        ledger (loaded by this process or another), or stopped by this one."""
        if self.membership is None:
            return True
        self.sync(partitions)
        return all(p.stopped or p.next >= p.end for p in partitions)


def share(config: dict[str, Any], topics: Sequence[str], group: str, target: Target,
          table: Any, stop: threading.Event) -> Share:
    """The partitions a run loads: into a server, those its consumer group gives it;
    into a target with one writer at a time (an embedded directory), all of them, no group joined.
    If the group gives nothing within FIRST_ASSIGNMENT seconds, all of them too."""
    if target.single_writer:
        return Share(None, target, table)
    membership = Membership(config, group, topics)
    if not membership.wait(stop):
        membership.close()
        return Share(None, target, table)
    return Share(membership, target, table)


def note(group: str, results: Sequence[FileResult]) -> str:
    """The report's line saying which partitions this member loaded units of."""
    loaded = sorted({"/".join(r.uri.rsplit("/", 3)[1:3]) for r in results
                     if r.status == "loaded" and r.uri.count("/") >= 5})
    return (f"Kafka: consumer group {group}: this process loaded partitions "
            f"{', '.join(loaded) or 'none'}")
