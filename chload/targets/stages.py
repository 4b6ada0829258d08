"""A server target's stages, around their filling (fill.py): how many data requests
run at once and when the files beyond them create their stages (`Streams`,
`streams_for`), and sealing a filled stage to one part per partition (`seal`),
which the attach needs (commit.py rule 2).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from chload.errors import ChloadError, TransientError
from chload.ledger import DATABASE
from chload.retry import RetryPolicy, Sleep
from chload.schema import quote_str

if TYPE_CHECKING:
    from chload.targets.server import ServerTarget

STAGING = 2  # files in flight beyond the streams, at least (see ServerTarget.open_streams)


def seal(server: ServerTarget, stage: str, sleep: Sleep | None = None) -> tuple[int, list[str]]:
    """Rows in the stage and its partitions, each merged to one part (commit.py rule 2).

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


class Streams:
    """Data requests at once, and when the files beyond them create their stages.

    Those files (STAGING) wait until every stream has begun its first request, at most a
    second: 18.16 runs DDL one statement at a time, and at the start of a load 7 stage
    CREATEs at once took 13-48 ms each on a busy machine, so the last stream began 30 ms
    after the first, behind stages that would wait for a stream anyway.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._slots = threading.BoundedSemaphore(count)
        self._lock = threading.Lock()
        self._tickets = self._begun = 0
        self._all_begun = threading.Event()

    def stage_turn(self) -> None:
        with self._lock:
            ticket, self._tickets = self._tickets, self._tickets + 1
        if ticket >= self.count:
            self._all_begun.wait(1.0)

    @contextlib.contextmanager
    def data(self) -> Iterator[None]:
        with self._slots:
            with self._lock:
                self._begun += 1
                if self._begun >= self.count:
                    self._all_begun.set()
            yield

def streams_for(files: int, cores: int) -> int:
    """Data requests at once into a server with `cores` (its max_threads).

    A server parses one INSERT on one thread, and each waits at times on its disk or its
    client, so a server takes more streams than it has cores: curl posting 10 gzip CSV
    files into 18.16 on 2 cores was 1.08x as fast 4 at a time as 2 at a time, 1.10x 5 at
    a time, 1.09-1.17x all 10 at once. Up to 4 per core and 8 in all (more adds server
    memory: each INSERT holds a block), spread evenly over the rounds the files need:
    10 files go 5 and 5, not 8 and then 2 on a half-idle server.
    """
    cap = max(1, min(8, 4 * cores))
    rounds = max(1, -(-files // cap))
    return max(1, -(-files // rounds))
