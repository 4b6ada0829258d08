"""Running a plan: files in parallel, each loaded atomically, failures isolated.

The runner knows nothing of ClickHouse: it calls `target.load_file` per file on a
thread pool (chDB sessions and HTTP connections are thread-safe), retries transient
errors with exponential backoff and jitter, and emits progress events for whoever
listens (the CLI's progress bar; nothing here prints).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from chload.errors import ChloadError, TransientError
from chload.targets import Loaded, LoadJob, Target


@dataclass(frozen=True)
class Event:
    """A progress event: kind is plan, start, done, skip, fail."""

    kind: str
    uri: str = ""
    rows: int = 0
    bytes: int = 0
    files_total: int = 0
    bytes_total: int = 0
    error: str = ""


Listener = Callable[[Event], None]


@dataclass
class FileResult:
    uri: str
    status: str  # loaded, skipped, failed
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    error: str = ""
    changed: bool = False
    rejected: int = 0


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_seconds: float = 0.5
    max_seconds: float = 20.0

    def delay(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**attempt)]."""
        return random.uniform(0, min(self.max_seconds, self.base_seconds * 2 ** attempt))


def call_with_retries(fn: Callable[[], tuple[int, ...]], policy: RetryPolicy,
                      sleep: Callable[[float], None] = time.sleep) -> tuple[int, ...]:
    for attempt in range(policy.attempts):
        try:
            return fn()
        except TransientError:
            if attempt == policy.attempts - 1:
                raise
            sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


def run(target: Target, jobs: Sequence[LoadJob], workers: int, listener: Listener,
        *, abort_on_error: bool = False, policy: RetryPolicy = RetryPolicy(),
        changed: set[str] | None = None) -> list[FileResult]:
    """Load every job; a failed file fails alone unless `abort_on_error`."""
    stop = threading.Event()
    results: list[FileResult] = []

    def one(job: LoadJob) -> FileResult:
        if stop.is_set():
            return FileResult(job.file.uri, "not-started")
        listener(Event("start", job.file.uri))
        started = time.monotonic()

        def progress(rows: int, read: int) -> None:
            listener(Event("progress", job.file.uri, rows, read))
        try:
            done = Loaded(*call_with_retries(lambda: target.load_file(job, progress), policy))
        except ChloadError as exc:
            if abort_on_error:
                stop.set()
            listener(Event("fail", job.file.uri, error=str(exc)))
            return FileResult(job.file.uri, "failed", seconds=time.monotonic() - started,
                              error=str(exc))
        listener(Event("done", job.file.uri, done.rows, done.bytes))
        return FileResult(job.file.uri, "loaded", done.rows, done.bytes,
                          time.monotonic() - started, changed=job.file.uri in (changed or set()),
                          rejected=done.rejected)

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="chload") as pool:
        pending: set[Future[FileResult]] = {pool.submit(one, j) for j in jobs}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            results.extend(f.result() for f in done)
    order = {j.file.uri: i for i, j in enumerate(jobs)}
    return sorted(results, key=lambda r: order.get(r.uri, 0))
