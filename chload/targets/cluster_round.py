"""When a cluster load's units commit (targets/cluster.py): the units under way, and
the last round's wait (Round's docstring says why).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from chload.sources import SourceFile


class Round:
    """The units of a load by row under way, and when they commit.

    - `in_flight` (from a unit's start to the end of its commit): while another is
      under way, each shard keeps its commit lock after a commit for the next
      (commit.py `linger`), released at the end of the run (flush): a lock CREATE and
      DROP less per unit and shard.
    - The last round (every planned unit started) commits together: a routed unit
      waits until no unit is still routing. Then each shard commits them as one group
      (commit.py: one survey, each stage logged and attached in turn), and the local
      tables get their parts once the servers are done parsing: attaching as units
      came in started the tables' merges while the rest still routed (measured on 3
      servers sharing 2 cores, 10 files of 1M rows: routing into stages cost the
      servers 2.4-2.5 s of CPU, inserting into the Distributed table, which merges
      meanwhile, 2.8-3.3 s). Earlier rounds of a long load commit as they come: no
      stream waits for a round's slowest unit.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.planned = self.started = self.in_flight = self.routing = 0

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

    def wait_if_last(self) -> None:
        """In the last round, until no unit is routing (a unit retried, or one that
        fails, stops routing too: nothing waits for ever)."""
        with self.cond:
            if self.started >= self.planned:
                self.cond.wait_for(lambda: self.routing == 0)
