"""When a server target's loaded stages commit: together, in fewer groups.

A filled stage waits here for others, and they commit as one group (committer.py
`commit_group`) when the first of these holds: the load's last round (fewer than `slack`
units being filled), `slack` stages waiting (each holds the thread that would stage the
next file), or the first has waited `MAX_WAIT`. docs/architecture.md ("When a server's
stages commit") says why each.

Invariants: nothing of the exactly-once protocol changes here (the group is committed by
the committer as any group is); a unit that follows a stream (a Kafka range) commits at
once, in its order (committer.py rule 5).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from chload.commit.committer import Committer
from chload.commit.ledger import FileEvent

MAX_WAIT = 1.0  # seconds a filled stage waits for others at most


_Unit = tuple[str, Sequence[str] | None, Sequence[FileEvent], int]  # Committer.commit_group's


@dataclass(slots=True)
class _Waiting:
    unit: _Unit
    since: float  # time.monotonic() when it began to wait
    taken: bool = False  # by a thread committing its group
    outcome: bool | BaseException | None = None


class CommitBatcher:
    """Units of one target filling their stages, and those waiting to commit."""

    def __init__(self, committer: Committer, slack: int = 2, max_wait: float = MAX_WAIT) -> None:
        self.committer, self.slack, self.max_wait = committer, max(1, slack), max_wait
        self._cv = threading.Condition()
        self._filling = 0
        self._waiting: dict[tuple[str, str], list[_Waiting]] = {}

    @contextlib.contextmanager
    def filling(self) -> Iterator[None]:
        """Around a unit's stage creation, fill and seal: while any is, others wait."""
        with self._cv:
            self._filling += 1
        try:
            yield
        finally:
            with self._cv:
                self._filling -= 1
                self._cv.notify_all()

    def commit(self, table: str, display: str, stage: str, partitions: Sequence[str] | None,
               events: Sequence[FileEvent], since_ns: int) -> bool:
        """As Committer.commit, once this unit's group is due (module docstring)."""
        own = _Waiting((stage, partitions, events, since_ns), time.monotonic())
        key = (table, display)
        group: list[_Waiting] = []
        with self._cv:
            self._waiting.setdefault(key, []).append(own)
            while not own.taken:
                group = self._due(key)
                if not group:
                    self._cv.wait(self._timeout(key))
        if group:  # (it holds `own`)
            self._commit(key, group)
        with self._cv:
            while own.outcome is None:  # committed by the thread that took it
                self._cv.wait()
        if isinstance(own.outcome, BaseException):
            raise own.outcome
        return bool(own.outcome)

    def _due(self, key: tuple[str, str]) -> list[_Waiting]:
        """The waiting units of `key`, taken, when their group is due (under the lock)."""
        waiting = self._waiting.get(key, [])
        if not waiting:
            return []
        due = (self._filling < self.slack or len(waiting) >= self.slack
               or time.monotonic() - waiting[0].since >= self.max_wait)
        if not due:
            return []
        self._waiting[key] = []
        for unit in waiting:
            unit.taken = True
        return waiting

    def _timeout(self, key: tuple[str, str]) -> float:
        waiting = self._waiting.get(key) or []
        first = waiting[0].since if waiting else time.monotonic()
        return max(0.001, first + self.max_wait - time.monotonic())

    def _commit(self, key: tuple[str, str], group: list[_Waiting]) -> None:
        """Commit `group` as one; every unit learns its outcome."""
        table, display = key
        try:
            outcomes: list[bool | BaseException] = self.committer.commit_group(
                table, display, [w.unit for w in group])
        except BaseException as exc:  # noqa: BLE001 (each unit raises it in its thread)
            outcomes = [exc] * len(group)
        with self._cv:
            for waiting, outcome in zip(group, outcomes, strict=True):
                waiting.outcome = outcome
            self._cv.notify_all()
