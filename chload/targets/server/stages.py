"""A server target's stages, around their filling (fill.py): how many data requests
run at once and when the files beyond them create their stages (`Streams`,
`streams_for`), sealing a filled stage to one part per partition (`seal`),
which the attach needs (committer.py rule 2), and the server's watch (`ServerWatch`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from chload.commit.ledger import DATABASE
from chload.errors import ChloadError, TransientError, backpressure
from chload.runtime.adaptive import MAX_STREAMS, Controller, PressureReader
from chload.runtime.retry import RetryPolicy, Sleep
from chload.schema import quote_str, split_table

if TYPE_CHECKING:
    from chload.targets.server.target import ServerTarget

STAGING = 2  # files in flight beyond the streams, at least (see ServerTarget.open_streams)


def seal(server: ServerTarget, stage: str, sleep: Sleep | None = None) -> tuple[int, list[str]]:
    """Rows in the stage and its partitions, each merged to one part (committer.py rule 2).

    A big stage (a file of millions of rows is several inserted blocks) is being merged in
    the background while it is sealed, and 18.16 refuses an OPTIMIZE whose parts a merge
    holds (code 388, "Can't OPTIMIZE by some reason"): wait for that merge and ask again,
    for up to SEAL_WAIT_S (a 1 GB gzip CSV failed its load here before this wait).
    """
    for _ in _MERGE_WAIT.tries(sleep, until=time.monotonic() + SEAL_WAIT_S):
        sealed = _seal_once(server, stage)
        if sealed is not None:
            return sealed
    raise TransientError(f"stage {stage}: its parts were still being merged after "
                         f"{SEAL_WAIT_S} s; the load is retried")


SEAL_WAIT_S = 600
_MERGE_WAIT = RetryPolicy(attempts=0, base_seconds=0.05, max_seconds=2.0, jitter=False)
_CANNOT_ASSIGN_OPTIMIZE = 388  # a background merge holds some of the partition's parts


def _seal_once(server: ServerTarget, stage: str) -> tuple[int, list[str]] | None:
    """Merge each partition of the stage to one part; its rows and partitions, or None
    while a background merge holds parts (the caller waits and asks again)."""
    for _ in range(5):
        rows = server.rows(f"SELECT partition_id, count() AS parts, sum(rows) AS rows FROM "
                           f"system.parts WHERE active AND database = '{DATABASE}' AND "
                           f"table = {quote_str(stage)} GROUP BY partition_id")
        split = [r["partition_id"] for r in rows if int(r["parts"]) > 1]
        if not split:
            return sum(int(r["rows"]) for r in rows), sorted(r["partition_id"] for r in rows)
        for partition in split:
            try:
                server.client.post(f"OPTIMIZE TABLE {DATABASE}.{stage} PARTITION ID "
                                   f"{quote_str(partition)} FINAL", context=server.where,
                                   params={"optimize_throw_if_noop": "1"})
            except ChloadError as exc:
                if exc.code != _CANNOT_ASSIGN_OPTIMIZE:
                    raise
                return None
    raise TransientError(f"stage {stage}: could not merge its parts to one per partition")


class Sent:
    """What one data request sent (bytes; 0 where unknown), told by its caller."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class Streams:
    """Data requests at once, and when the files beyond them create their stages.

    How many at once is the controller's limit (adaptive.py), read as each request
    begins: a fixed one (`--workers N`), or one that moves with what each request's
    latency and the server's backpressure say (`--workers auto`).

    The files beyond the streams (STAGING) wait until every stream has begun its first
    request, at most a second: 18.16 runs DDL one statement at a time, so stage
    CREATEs at the start would delay the streams' first requests behind stages that
    would wait for a stream anyway.
    """

    def __init__(self, count: int, adapt: Controller | None = None) -> None:
        self.adapt = adapt or Controller(count, count, fixed=True)
        self._slots = threading.Condition()
        self._busy = 0
        self._lock = threading.Lock()
        self._tickets = self._begun = 0
        self._all_begun = threading.Event()
        self.turns = 0  # data requests begun
        self.first_at: float | None = None  # when the first began (time.time())
        self.last_at: float | None = None  # when the last one ended

    @property
    def count(self) -> int:
        return self.adapt.limit

    def stage_turn(self) -> None:
        with self._lock:
            ticket, self._tickets = self._tickets, self._tickets + 1
        if ticket >= self.count:
            self._all_begun.wait(1.0)

    @contextlib.contextmanager
    def data(self) -> Iterator[Sent]:
        """One request's turn; its latency and size go to the controller, a 252 as
        the server's backpressure (the runner waits and retries it: runner.patiently)."""
        with self._slots:
            while self._busy >= self.adapt.limit:
                self._slots.wait(0.1)  # (a raised limit wakes nobody: look again)
            self._busy += 1
            busy = self._busy
        self.adapt.in_use(busy)
        with self._lock:
            self.turns += 1
            self.first_at = self.first_at or time.time()
            self._begun += 1
            if self._begun >= self.count:
                self._all_begun.set()
        sent, began = Sent(), time.monotonic()
        try:
            yield sent
        except TransientError as exc:
            if backpressure(exc):
                self.adapt.backpressure("too many parts (code 252)", severe=True)
            raise
        else:
            self.adapt.request_done(began, time.monotonic() - began, sent.bytes)
        finally:
            with self._slots:
                self._busy -= 1
                self.last_at = time.time()
                self._slots.notify_all()


def streams_for(files: int, cores: int) -> int:
    """Data requests at once into a server with `cores` (its max_threads).

    A server parses one INSERT on one thread, and each waits at times on its disk or its
    client, so a server takes more streams than it has cores (docs/benchmarks.md).
    Up to 4 per core and 8 in all (more adds server
    memory: each INSERT holds a block), spread evenly over the rounds the files need:
    10 files go 5 and 5, not 8 and then 2 on a half-idle server.
    """
    cap = max(1, min(8, 4 * cores))
    rounds = max(1, -(-files // cap))
    return max(1, -(-files // rounds))


def most_streams(cores: int) -> int:
    """The adaptive limit's bound: 4 streams per server core (more streams than cores
    pay, above), 16 at most (each INSERT holds a block in memory)."""
    return max(1, min(MAX_STREAMS, 4 * cores))


class ServerWatch:
    """Every second while a load runs: the loader host's pressure (PSI) and the server's
    backpressure, one query: `DelayedInserts` (the server's merges are behind: the merge
    pool is shared by every table), and the most active parts of one partition of the
    tables loaded into (attaches add parts there) against `parts_to_delay_insert`. A
    failed query is skipped: watching must never fail a load."""

    EVERY = 1.0
    FIRST = 0.02  # until the first table loads
    NEAR = 0.8  # of parts_to_delay_insert: merges are falling behind

    def __init__(self, server: ServerTarget, adapt: Controller) -> None:
        self.server, self.adapt = server, adapt
        self.pressure = PressureReader()
        self._thread = threading.Thread(target=self._run, name="chload_watch", daemon=True)

    def start(self) -> ServerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch and wait for its last look (at most a request's time): a look
        still under way while the target closes and the process exits printed a daemon
        thread's traceback."""
        self.adapt.finished.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        """The server as soon as a table is being loaded (it may be near its parts limit
        before the first request: a load of a second would otherwise end before the
        first look), then the host and the server every second."""
        while not self.server.loading:
            if self.adapt.finished.wait(self.FIRST):
                return
        with contextlib.suppress(ChloadError):
            self._server()
        while not self.adapt.finished.wait(self.EVERY):
            host = self.pressure()
            if host is not None:
                self.adapt.host(host)
            with contextlib.suppress(ChloadError):
                self._server()

    def _server(self) -> None:
        tables = " OR ".join(f"(database = {quote_str(d)} AND table = {quote_str(t)})"
                             for d, t in map(split_table, sorted(self.server.loading)))
        row = self.server.rows(
            "SELECT (SELECT value FROM system.metrics WHERE metric = 'DelayedInserts') AS "
            "delayed, (SELECT toUInt64(value) FROM system.merge_tree_settings WHERE name = "
            "'parts_to_delay_insert') AS delay_at, (SELECT max(c) FROM (SELECT count() AS c"
            f" FROM system.parts WHERE active AND ({tables or '0'}) GROUP BY database, "
            "table, partition_id)) AS parts")[0]
        delayed, delay_at, parts = (int(row[k] or 0) for k in ("delayed", "delay_at", "parts"))
        if delayed:
            self.adapt.backpressure(f"{delayed} inserts delayed (DelayedInserts)")
        elif delay_at and parts >= self.NEAR * delay_at:
            self.adapt.backpressure(f"{parts} parts in a partition, parts_to_delay_insert "
                                    f"{delay_at}")
        else:
            self.adapt.relieved()
