"""Running a plan: files in parallel, each loaded atomically, failures isolated.

The runner knows nothing of ClickHouse: it calls `target.load_file` per file on a
thread pool (chDB sessions and HTTP connections are thread-safe), retries transient
errors under a `RetryPolicy` (retry.py: exponential backoff and jitter), and emits
progress events for whoever listens (the CLI's progress bar; nothing here prints).
Right before a unit loads it is fetched (Source.fetch: a database range spooled; a
file as it is), once, and what the fetch made is released right after. A source's check
of every unit that finds values no type holds (errors.ValuesRefused, raised before a
commit or where a unit failed) stops the run: raised, not a unit's result.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from chload.core.reading import fit
from chload.errors import KEEP_BAD_ROWS, ChloadError, DataError, ValuesRefused, backpressure
from chload.runtime.retry import DEFAULT_POLICY, RetryPolicy, Sleep, call_with_retries
from chload.sources.run import RunSources
from chload.targets.base import Loaded, LoadJob, Target


@dataclass(frozen=True, slots=True)
class Event:
    """A progress event: kind is plan, start (a unit begun: bytes, its listed size; a
    batch's is announced by its first file's uri), progress (rows and bytes parsed, negative
    when taken back), done (a file committed), skip (another run committed the file
    meanwhile), fail, lag (a Kafka partition, uri its stream: rows = messages up to the
    high watermark last read not yet committed), poll (a load that follows files: one
    poll done, `poll` says what it did). A plan's `unit` says what its units are: file,
    a database's range, a Kafka batch (Source.unit). A done event's `rejected` counts
    the unit's bad rows kept (an error budget), its `seconds` the time from the unit's
    start to its commit (a batch: its share)."""

    kind: str
    uri: str = ""
    rows: int = 0
    bytes: int = 0
    files_total: int = 0
    bytes_total: int = 0
    error: str = ""
    unit: str = ""
    rejected: int = 0
    seconds: float = 0.0
    poll: Poll | None = None  # kind `poll`: what one poll of a load that follows did


@dataclass(frozen=True, slots=True)
class Poll:
    """One poll of a load that follows files (core/follow.py): its number (1: the first
    pass), units it loaded and their rows, the listing requests it made, files not
    taken because still being written, files that changed since they were loaded
    (each said once: not loaded again, or with --force loaded again), failures, its
    seconds, and the error that ended it early (a listing that failed: the next poll
    tries again)."""

    number: int
    files: int = 0
    rows: int = 0
    listing_calls: int = 0
    waiting: int = 0
    changed: tuple[str, ...] = ()
    reloaded: tuple[str, ...] = ()
    failed: int = 0
    seconds: float = 0.0
    error: str = ""


Listener = Callable[[Event], None]
T = TypeVar("T")


@dataclass(slots=True)
class FileResult:
    uri: str
    status: str  # loaded, skipped, failed
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    error: str = ""
    changed: bool = False
    rejected: int = 0
    note: str = ""  # e.g. why a file planned for loading was skipped after all


LOADED_ELSEWHERE = "loaded by another run meanwhile"
LOADED_IN_PART = "committed on some shards; the others had it from another run meanwhile"
PATIENCE = 1800.0  # seconds a file waits out a server's "too many parts" (252), at most


def patiently(fn: Callable[[], T], policy: RetryPolicy, sleep: Sleep | None = None,
              patience: float = PATIENCE) -> T:
    """`fn()` under `policy`; the server's backpressure (252 "too many parts") does not
    use up its tries: merges catch up, so the file waits (backoff with jitter, up to
    `policy.max_seconds` a pause) and is tried again, for `patience` seconds in all
    (half an hour of it means merges are stuck: then it fails as any transient error).
    Meanwhile the stream controller has lowered the requests in flight (adaptive.py)."""
    deadline, waits = time.monotonic() + patience, 0
    while True:
        try:
            return call_with_retries(fn, policy, sleep)
        except ChloadError as exc:
            if not backpressure(exc) or time.monotonic() >= deadline:
                raise
        (sleep or time.sleep)(policy.delay(min(waits, 8)))
        waits += 1


def next_step(error: ChloadError, job: LoadJob) -> str:
    """What to do about a file that failed on a row the engine could not read, when the
    run gave no error budget: the rest of the file can load and the row be kept."""
    if isinstance(error, DataError) and error.row is not None and \
            not job.budget.allows_errors:
        return f"; pass {KEEP_BAD_ROWS}"
    return ""


class _Progress:
    """A target's progress callback: `progress` events as rows are parsed, taken back
    (negative amounts) when the attempt that reported them fails, so a retried or
    file-by-file reloaded group is not counted twice."""

    def __init__(self, listener: Listener, uri: str) -> None:
        self.listener, self.uri = listener, uri
        self.rows = self.bytes = 0

    def __call__(self, rows: int, read: int) -> None:
        self.rows += rows
        self.bytes += read
        self.listener(Event("progress", self.uri, rows, read))

    def attempt(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except ChloadError:
            self.take_back()
            raise

    def take_back(self) -> None:
        if self.rows or self.bytes:
            self.listener(Event("progress", self.uri, -self.rows, -self.bytes))
        self.rows = self.bytes = 0


def run(target: Target, jobs: Sequence[LoadJob], workers: int, listener: Listener,
        *, abort_on_error: bool = False, policy: RetryPolicy = DEFAULT_POLICY,
        changed: set[str] | None = None, sources: RunSources | None = None,
        halt: threading.Event | None = None) -> list[FileResult]:
    """Load every job; a failed file fails alone unless `abort_on_error`. `sources`:
    the run's, which fetch each unit before its load (None: every file is loaded as
    listed). Once `halt` is set (a load that follows, stopped by a signal), no unit
    starts: those in flight end committed or not at all, the others are `not-started`."""
    stop = threading.Event()
    halted = halt or threading.Event()
    changed = changed or set()

    @contextlib.contextmanager
    def fetched(job: LoadJob) -> Iterator[LoadJob]:
        """The job with its units readable by the engine (a failed fetch fails them)."""
        if sources is None:
            yield job
            return
        with sources.fetched(job.files, job.read_columns,
                             lambda fetch: call_with_retries(fetch, policy)) as files:
            yield replace(job, file=files[0], batch=files if job.batch else ())

    def one(job: LoadJob) -> FileResult:
        if stop.is_set() or halted.is_set():
            return FileResult(job.file.uri, "not-started")
        listener(Event("start", job.file.uri, bytes=job.file.size))
        started = time.monotonic()
        progress = _Progress(listener, job.file.uri)
        try:
            with fetched(job) as ready:
                done = patiently(
                    lambda: progress.attempt(lambda: target.load_file(ready, progress)),
                    policy)
        except ValuesRefused:
            stop.set()
            raise  # the run stops in the check's one line (load.py), not as this unit
        except ChloadError as exc:
            give_way(sources, stop)
            if abort_on_error:
                stop.set()
            error = fit.in_table_types(str(exc), getattr(exc, "column", None),
                                       job.read_columns, job.columns) + next_step(exc, job)
            listener(Event("fail", job.file.uri, error=error))
            return FileResult(job.file.uri, "failed", seconds=time.monotonic() - started,
                              error=error)
        if done.elsewhere:  # its rows were not attached: another run's are there
            progress.take_back()
            listener(Event("skip", job.file.uri))
            return FileResult(job.file.uri, "skipped", seconds=time.monotonic() - started,
                              note=LOADED_ELSEWHERE)
        seconds = time.monotonic() - started
        listener(Event("done", job.file.uri, done.rows, done.bytes, rejected=done.rejected,
                       seconds=seconds))
        return FileResult(job.file.uri, "loaded", done.rows, done.bytes, seconds,
                          changed=job.file.uri in changed,
                          note=LOADED_IN_PART if done.partly else "",
                          rejected=done.rejected)

    def batch(job: LoadJob) -> list[FileResult]:
        """Several small files in one commit; if that fails, each half as a batch of its
        own (halved again while it fails), so the good files commit and a bad file fails
        alone, in its own message, at the cost of about two tries per halving."""
        if stop.is_set() or halted.is_set():
            return [FileResult(f.uri, "not-started") for f in job.files]
        if len(job.files) == 1:
            return [one(replace(job, file=job.files[0], batch=()))]
        listener(Event("start", job.file.uri, bytes=sum(f.size for f in job.files)))
        started = time.monotonic()
        progress = _Progress(listener, job.file.uri)
        try:
            with fetched(job) as ready:
                loaded: list[Loaded] = patiently(
                    lambda: progress.attempt(lambda: target.load_batch(ready, progress)),
                    policy)
        except ChloadError as exc:
            if isinstance(exc, ValuesRefused):
                stop.set()
                raise
            return [r for half in halves(job) for r in batch(half)]
        seconds = (time.monotonic() - started) / len(job.files)
        results = []
        for f, done in zip(job.files, loaded, strict=True):
            listener(Event("done", f.uri, done.rows, done.bytes, rejected=done.rejected,
                           seconds=seconds))
            results.append(FileResult(f.uri, "loaded", done.rows, done.bytes, seconds,
                                      changed=f.uri in changed))
        return results

    results = [r for done in on_threads(batch, jobs, workers) for r in done]
    order = {f.uri: i for i, f in enumerate(f for j in jobs for f in j.files)}
    return sorted(results, key=lambda r: order.get(r.uri, 0))


def halves(job: LoadJob) -> list[LoadJob]:
    """A batch's files in two batches (a batch of one is a file's own job)."""
    middle = len(job.files) // 2
    parts = (job.files[:middle], job.files[middle:])
    return [replace(job, file=part[0], batch=part if len(part) > 1 else ()) for part in parts]


def give_way(sources: RunSources | None, stop: threading.Event) -> None:
    """A unit failed: where a source's check of every unit found values no type holds
    (Source.settle), the run stops in that check's one line rather than this unit's
    error (the unit may have met such a value before the check answered)."""
    if sources is None:
        return
    try:
        sources.settle()
    except ValuesRefused:
        stop.set()
        raise


R = TypeVar("R")


def on_threads(fn: Callable[[T], R], items: Sequence[T], threads: int) -> list[R]:
    """`fn` of every item, on up to `threads` daemon threads taking the next item as
    they finish one; results in the order they finish. An exception (fn's own errors
    are results, so a bug) stops the taking and is raised once every thread is done.

    Plain threads, not concurrent.futures: that module brings `logging` with it, 10-20
    ms of every start-up, for what these lines do.
    """
    pending, guard = iter(items), threading.Lock()
    results: list[R] = []
    failed: list[BaseException] = []

    def work() -> None:
        while True:
            with guard:
                item = next(pending, _END) if not failed else _END
            if item is _END:
                return
            try:
                result = fn(item)  # type: ignore[arg-type]
            except BaseException as exc:  # noqa: BLE001 (raised in the caller's thread)
                with guard:
                    failed.append(exc)
                return
            with guard:
                results.append(result)

    workers = [threading.Thread(target=work, name=f"chload_{i}", daemon=True)
               for i in range(max(1, min(threads, len(items))))]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join()
    except BaseException as exc:  # Ctrl-C: no new item starts; the caller exits (a
        with guard:                # file in flight is a killed file: exactly once holds)
            failed.append(exc)
        raise
    if failed:
        raise failed[0]
    return results


_END = object()
