"""When a cluster load's units commit (cluster/target.py): the units under way, and
the last round's wait (Round's docstring says why).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from chload.sources.base import SourceFile
from chload.targets.base import Loaded, LoadJob
from chload.targets.cluster.layout import Shard


@dataclass(slots=True)
class Unit:
    """A routed unit waiting for its commit: its stage on every shard, the shards whose
    ledger lacks it (`todo`), and each shard's rows and partitions (`shares`)."""

    job: LoadJob
    stage: str
    todo: list[Shard]
    shares: dict[int, tuple[int, list[str]]]
    done: list[Loaded]
    by_file: dict[str, dict[int, int]] | None

    @property
    def read(self) -> int:
        return sum(d.bytes for d in self.done)

    @property
    def total(self) -> int:
        return sum(rows for rows, _ in self.shares.values()) or 1


# An earlier round's units wait at most this long for others to commit with
GATHER_SECONDS = 2.0

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False, slots=True)
class _Parked(Generic[T, R]):
    """A routed unit waiting for its group's commit, and how it ended."""

    item: T
    since: float  # when it began to wait
    result: R | None = None
    error: BaseException | None = None
    done: bool = False


class Round:
    """The units of a load by row under way, and when they commit.

    - `in_flight` (from a unit's start to the end of its commit): while another is
      under way, each shard keeps its commit lock after a commit for the next
      (committer.py `linger`), released at the end of the run (flush): a lock CREATE and
      DROP less per unit and shard.
    - The last round (every planned unit started) commits together: a routed unit
      waits until no unit is still routing. Then each shard commits them as one group
      (committer.py: one survey, each stage logged and attached in turn), and the local
      tables get their parts once the servers are done parsing: attaching as units
      came in started the tables' merges while the rest still routed, which cost the
      servers more CPU.
    - Earlier rounds commit in groups of `gather` units (or what is waiting once the
      first has waited GATHER_SECONDS, or once no unit is routing): a group is
      one `committing` write, one survey and one `loaded` write on each shard for all of
      its units, where a unit alone paid each (a shard's ledger writes and their merges
      cost its server more CPU than anything chload asks of it besides the rows). No
      stream waits for a round's slowest unit: a group waits for no unit still routing.
    """

    def __init__(self, gather: int = 1) -> None:
        self.cond = threading.Condition()
        self.planned = self.started = self.in_flight = self.routing = 0
        self.parked: list[_Parked] = []
        self.gather = gather  # units an earlier round's group waits for (set by the target)

    @property
    def final(self) -> bool:
        """Every planned unit has started: the last round."""
        with self.cond:
            return self.started >= self.planned

    def plan(self, groups: list[tuple[SourceFile, ...]]) -> list[tuple[SourceFile, ...]]:
        with self.cond:
            self.planned, self.started = len(groups), 0
        return groups

    @contextlib.contextmanager
    def unit(self) -> Iterator[Callable[[], None]]:
        """One unit under way; call what it yields once its rows are in the stages (a
        unit that fails before is no longer routing either)."""
        with self.cond:
            self.started += 1
            self.in_flight += 1
            self.routing += 1
        done = [False]

        def routed() -> None:
            with self.cond:
                if not done[0]:
                    done[0] = True
                    self.routing -= 1
                    self.cond.notify_all()
        try:
            yield routed
        finally:
            routed()
            with self.cond:
                self.in_flight -= 1

    def commit(self, item: T, commit: Callable[[list[T]], list[R]]) -> R:
        """Commit a routed unit (`commit` of a list of units returns their outcomes in
        order) with the others waiting: the first waiting thread to find the group due
        (`_due`) commits every unit waiting, in one call; the others take their outcome
        from it (a unit retried, or one that fails, stops routing too: nothing waits for
        ever)."""
        with self.cond:
            parked: _Parked[T, R] = _Parked(item, time.monotonic())
            self.parked.append(parked)
            self.cond.notify_all()
            while True:
                if parked.done:
                    return _outcome(parked)
                wait = self._due()
                if wait == 0 and any(p is parked for p in self.parked):
                    break
                self.cond.wait(wait)
            batch, self.parked = self.parked, []
        try:
            results: list[R] | None = commit([p.item for p in batch])
        except BaseException as exc:
            results = None
            for p in batch:
                p.error = exc
            raise
        finally:
            with self.cond:
                for i, p in enumerate(batch):
                    p.result, p.done = (results[i] if results else None), True
                self.cond.notify_all()
        return _outcome(parked)

    def _due(self) -> float | None:
        """Seconds until the waiting units are to commit (0: now; None: until told).
        The last round: once no unit is routing. Before: once `gather` wait, or no
        unit is routing, or the first has waited GATHER_SECONDS. (Caller holds
        `cond`.)"""
        if not self.parked:
            return None
        if self.routing == 0:
            return 0
        if self.started >= self.planned:
            return None
        if len(self.parked) >= self.gather:
            return 0
        return max(0.0, self.parked[0].since + GATHER_SECONDS - time.monotonic())


def _outcome(parked: _Parked[T, R]) -> R:
    if parked.error is not None:
        raise parked.error
    assert parked.result is not None
    return parked.result
