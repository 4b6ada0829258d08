"""Exactly once into a table, for both targets: attach a loaded stage under a commit lock.

A load fills a fresh stage table (`chload.stage_<machine>_<pid>_<id>`, shaped like the
table) and commits it here. The proof that an attach happened is the block number:
MergeTree numbers every new part above all existing ones (and merges keep the range),
so a part above the `mark` noted before the attach can only be the attach's. That
holds only while nobody else writes, so each table's commits run inside a **commit
lock** (locks.py), the one thing in which the targets differ:

- a server (several loader hosts may load into one table): the table
  `chload.lock_<t>` (`CREATE TABLE` is an atomic test-and-set on every version, code 57
  if held; its metadata survives a server restart): `locks.TableLock`;
- the embedded target: engine.py's `flock` keeps every other process out of the
  directory, and within the process one commit per table runs at a time (the per-table
  turn below): `locks.ProcessLock`. Every stage not of this process is an orphan.

The protocol, the same for both:

    lock    acquire the table's lock (a server: CREATE TABLE chload.lock_<t> (holder
            String DEFAULT '<machine:pid:start>') ENGINE = Memory)
    log     ledger event `committing` (file, stage, mark), where the mark is
            max(max_block_number) of the table's active parts, read by the engine in
            the same INSERT ... SELECT that logs it (a group of more than 8 events:
            read just before, still under the lock; ledger._INLINE_EVENTS)
    attach  ALTER TABLE t ATTACH PARTITION ID 'p' FROM chload.stage_x, per partition
            (log and attach again for each further stage of a group commit)
    unlock  release the lock; later: ledger `loaded` (in batches, ledger.LoadedEvents),
            DROP the stage

Rules that make a crash at any instant harmless:

1. The lock is released only after every partition is attached. So whoever finds a
   file still `committing` with no lock held knows it was attached; and nobody attaches
   into the table while a crashed commit is unsettled.
2. On a server, a stage holds one part per partition (OPTIMIZE ... FINAL first, if
   not): attaching one partition renames one part directory, so a server killed
   mid-attach leaves that partition all there or not there at all. (The embedded
   target attaches its stages' parts as they are.)
3. A lock whose holder is gone is broken, never ignored: on a server, a holder on this
   machine with a dead pid (pid + start time, so a reused pid is not mistaken), or our
   own process (a commit that gave up), or on another machine: older than the lease
   and no commit query of the holder still running (`system.processes`, by query_id
   prefix); embedded, a commit of ours that gave up (a crashed process holds nothing).
   The breaker first creates `chload.dirty_<t>`, then takes the lock; the next holder
   settles every `committing` file of the table (mark rule: attach each stage partition
   with no part above the mark), then drops the marker. A run's first step (`start`)
   settles the table's `committing` files the same way, under the lock.
4. Inside the lock, an error of unknown outcome (connection dropped during the ledger
   insert or the ATTACH) is settled by the same rule, retried until half the lease is
   spent; then the commit gives up (`CommitInterrupted`) and leaves the lock for the
   next holder -- it never writes `failed` over a commit that may have happened.
5. Under the lock, a commit first looks at each of its files' last event: one that
   another load (or an earlier attempt of this run) committed since this run started
   attaches nothing, so a file-by-file retry of a batch that may have committed loads
   nothing twice. (One survey answers for every unit of the table in flight while this
   process holds the lock without a break: nobody else can commit meanwhile.)
   A unit of a stream (a Kafka offset range, sources.StreamPosition) attaches only
   while its stream's committed end, read in the same survey, is still the one its
   plan started from: two loaders reading one partition at once, or a rebalance,
   cannot commit overlapping ranges.
6. A stage is dropped only when no file of any table, still `committing`, names it,
   and its process is gone (`drop_orphans`): a crashed commit into one table keeps
   its stage through loads into other tables until its own table settles it.

What it assumes: during an unsettled crashed commit, only chload writes into the
table (another program's INSERT into the same partition would look like the attach;
the window is milliseconds unless a commit crashed). Block numbers are per table on
every MergeTree version, so the mark holds for partitioned tables too.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from chload.commit.ledger import COMMITTING, DATABASE, LOADED, FileEvent, Ledger
from chload.commit.locks import (
    LEASE_SECONDS,
    CommitLock,
    Holder,
    Sql,
    TableLock,
    dirty_name,
    lock_name,
)
from chload.commit.orphans import committing_stages, orphan
from chload.commit.request import (
    _bare,
    _crash_point,
    _ends,
    _files,
    _interrupted,
    _moved,
    _not_committed,
    _start_sql,
    _stream_ends_sql,
    block_tops,
)
from chload.commit.request import _Request as _Request
from chload.commit.request import _taken as _taken
from chload.errors import BatchOverlap as BatchOverlap  # (raised by the targets)
from chload.errors import ChloadError, CommitInterrupted, TransientError
from chload.runtime.faults import crash_point
from chload.runtime.retry import RetryPolicy
from chload.schema import quote_str, split_table
from chload.sources.base import StreamPosition

_lock_name, _dirty_name = lock_name, dirty_name
# Waits bounded by a deadline (RetryPolicy.tries), not by a number of tries:
SETTLE_EVERY = RetryPolicy(attempts=0, base_seconds=2.0, max_seconds=2.0, jitter=False)
IDLE_POLL = RetryPolicy(attempts=0, base_seconds=0.2, max_seconds=0.2, jitter=False)
# Files of other units in flight a survey asks about at most (_to_attach): its query
# stays far below 18.16's max_query_size (256 KiB) with a batch's own files in it
_COVER_MOST = 1000
STAGE_DROP = RetryPolicy(attempts=5, base_seconds=0.1, jitter=False)  # 0.1 s ... 0.8 s


def stage_name(holder: Holder) -> str:
    return f"stage_{holder.machine}_{holder.pid}_{os.urandom(4).hex()}"


@dataclass(slots=True)
class _Turn:
    """This process's commits into one table: those queued, and since when the server
    lock has been held for them (None: not held)."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    queue: list[_Request] = field(default_factory=list)
    held_since: float | None = None
    attaching: bool = False  # the group under way may have attached something
    # The files the survey of this hold of the lock asked about, and each one's last
    # event found (None: not surveyed since the lock was taken; see Committer._to_attach)
    covered: set[str] | None = None
    last: dict[str, dict] = field(default_factory=dict)

    def let_go(self) -> float | None:
        """The lock is no longer held for this turn: when it was taken (None: it was not)."""
        held, self.held_since, self.covered = self.held_since, None, None
        return held


class Committer:
    """Attaches stages into tables, exactly once, across processes and machines.

    `lock` decides who may commit into a table (locks.py); by default a server's lock
    table."""

    def __init__(self, sql: Sql, ledger: Ledger, lease: float = LEASE_SECONDS,
                 sleep: Callable[[float], None] = time.sleep,
                 lock: CommitLock | None = None) -> None:
        self.sql, self.ledger, self.lease, self.sleep = sql, ledger, lease, sleep
        self.holder = Holder.this_process()
        self.lock: CommitLock = lock or TableLock(sql, self.holder, lease, sleep)
        self._turns: dict[str, _Turn] = {}
        self._guard = threading.Lock()
        self._in_flight: dict[str, dict[str, int]] = {}  # table -> uri -> units (expect)
        # True while more commits of this run are coming: the lock is then kept after a
        # group for them (see _holding); a cluster sets it (targets/cluster.py)
        self.linger: Callable[[], bool] = lambda: False

    # -- commit ----------------------------------------------------------------------
    def commit(self, table: str, display: str, stage: str, partitions: Sequence[str] | None,
               events: Sequence[FileEvent], since_ns: int,
               follows: Sequence[StreamPosition] = ()) -> bool:
        """Attach `stage` into `table`; `events` (one per file the stage holds, state
        committing) are logged first. `partitions`: the stage's, or None to read them
        with the mark.

        Returns False, attaching nothing, when another load committed one of the files
        (same identity) since `since_ns`: two runs over the same files at once load each
        once; or when a stream of `follows` has moved past where the unit's plan found it
        (rule 5). A TransientError means nothing of this commit was logged or attached (the
        lock was not had, or the group it waited in stopped before it): the caller may
        drop the stage and try again. Once the lock is had, the commit
        completes or raises CommitInterrupted (terminal: the next holder settles it).

        Commits of this process into one table that wait for each other go together
        (group commit): the first to get its turn takes every one queued, with one lock
        and one survey, and logs and attaches their stages one after the other.
        """
        request = _Request(stage, partitions, events, since_ns, follows)
        self._submit(table, display, [request])
        if request.error is not None:
            raise request.error
        return bool(request.attached)

    def commit_group(self, table: str, display: str,
                     units: Sequence[tuple[str, Sequence[str] | None, Sequence[FileEvent], int]],
                     ) -> list[bool | BaseException]:
        """`commit` of several stages (stage, partitions, events, since_ns) at once, queued
        together so they go as one group: one caller holding them all need not race its
        own threads into the queue (whichever thread got the turn first led a group of
        one). Each unit's outcome as `commit` would return or raise it."""
        requests = [_Request(stage, parts, events, since) for stage, parts, events, since in units]
        self._submit(table, display, requests)
        return [r.error if r.error is not None else bool(r.attached) for r in requests]

    @contextlib.contextmanager
    def expecting(self, table: str, uris: Sequence[str]) -> Iterator[None]:
        """Around a unit whose stage is filling and may commit into `table`: the survey of
        any group asks about its files too, so a later group of the same hold of the lock
        need not ask again (`_to_attach`)."""
        with self._guard:
            counts = self._in_flight.setdefault(table, {})
            for uri in uris:
                counts[uri] = counts.get(uri, 0) + 1
        try:
            yield
        finally:
            with self._guard:
                for uri in uris:
                    counts[uri] -= 1
                    if not counts[uri]:
                        del counts[uri]

    def _submit(self, table: str, display: str, requests: list[_Request]) -> None:
        """Queue `requests` for the table's turn; when it comes, unless another leader
        settled them all meanwhile, lead every request queued by then as one group."""
        with self._guard:
            turn = self._turns.setdefault(table, _Turn())
            turn.queue.extend(requests)
        with turn.mutex:
            if requests and not all(r.settled for r in requests):
                with self._guard:
                    group, turn.queue = turn.queue, []
                self._lead(table, display, turn, group, requests[0])

    def _lead(self, table: str, display: str, turn: _Turn, group: list[_Request],
              own: _Request) -> None:
        """Commit `group` in order; each request learns its outcome or error."""
        current: _Request | None = None
        logged: list[_Request] = []  # logged `committing` together, attached one by one
        try:
            with self._holding(table, display, turn):
                deadline = time.monotonic() + self.lease / 2
                todo = self._to_attach(table, display, group, turn)
                todo += self._joining(turn, group)
                if self._logs_together(todo):
                    turn.attaching = True
                    logged = todo
                    self._log_group(table, todo)
                for request in todo:
                    current = request
                    turn.attaching = True
                    if any(r is request for r in logged):
                        self._attach_logged(table, display, request, deadline)
                    else:
                        self._attach_one(table, display, request, deadline)
                    request.attached = True
        except BaseException as exc:
            for request in group:
                if request.settled:
                    continue
                if request is current:  # may have attached: only its own error says so
                    request.error = exc if request is own else copy.copy(exc)
                elif any(r is request for r in logged):  # logged, maybe not attached:
                    request.error = _interrupted(request, display, exc)  # the next holder
                    # settles it
                elif current is None and request is own:
                    request.error = exc
                else:
                    request.error = _not_committed(request, exc)

    def _to_attach(self, table: str, display: str, group: list[_Request],
                   turn: _Turn) -> list[_Request]:
        """The requests of `group` to attach, in order, after one survey: not those
        another load committed meanwhile, nor a stream's unit whose stream moved (each
        attached one moves its stream's end for the next, rule 5).

        The survey asks about the files of every unit of the table in flight too
        (`expecting`), and while this process holds the lock without a break (the lock
        handed from group to group) nobody else can commit into the table, so its answer
        stands for them: a later group of the same hold whose files it covered is not
        surveyed again (on a busy 2-core 18.16 a survey took 5-25 ms, in the load's tail)."""
        uris = {e.uri for r in group for e in r.events}
        follows = [p for r in group for p in r.follows]
        ends: dict[str, int] = {}
        if follows or turn.covered is None or not uris <= turn.covered:
            with self._guard:
                flying = set(self._in_flight.get(table, ()))
            covered = uris | (flying if len(flying) <= _COVER_MOST else set())
            turn.last, ends = self._survey(table, display, sorted(covered), follows)
            turn.covered = covered
        todo = []
        for request in group:
            if _taken(turn.last, request) or _moved(ends, request):
                request.attached = False
                continue
            todo.append(request)
            ends.update(_ends(request))
        return todo

    def _joining(self, turn: _Turn, group: list[_Request]) -> list[_Request]:
        """The requests queued while the group's survey ran whose files it covered (not
        a stream's unit): taken into the group, to be logged and attached with it rather
        than as a group of their own after it (a survey, a log and its attaches, 20-60
        ms of the load's tail on a busy 2-core 18.16). In order, as `_to_attach`."""
        covered = turn.covered or set()
        with self._guard:
            late = [r for r in turn.queue
                    if not r.follows and all(e.uri in covered for e in r.events)]
            turn.queue = [r for r in turn.queue if all(r is not j for j in late)]
        group.extend(late)
        todo = []
        for request in late:
            if _taken(turn.last, request):
                request.attached = False
                continue
            todo.append(request)
        return todo

    def _logs_together(self, todo: Sequence[_Request]) -> bool:
        """Log a group's stages in one statement (a server, several stages, each one's
        partitions known): one ledger round trip instead of one per stage, which under
        the lock cost 10-35 ms each on a busy 2-core server."""
        return (not self.lock.exclusive and len(todo) > 1
                and all(r.partitions is not None for r in todo))

    def _log_group(self, table: str, todo: Sequence[_Request]) -> None:
        """Log every request `committing`, in one INSERT that reads the table's mark M,
        each with the mark it would read just before its own attach: M plus the parts
        the stages before it attach. MergeTree numbers each attached part with the next
        block number of the table (a sealed stage has one part per partition, rule 2),
        and under the lock nothing else takes one, so the mark rule settles each stage
        exactly as if it had been logged alone."""
        offset = 0
        for request in todo:
            for event in request.events:
                event.stage, event.state, event.mark = request.stage, COMMITTING, offset
            offset += len(request.partitions or ())
        self.ledger.record([e for r in todo for e in r.events], mark_of=split_table(table))
        _crash_point("before-attach")

    def _attach_logged(self, table: str, display: str, request: _Request,
                       deadline: float) -> None:
        """Attach a stage already logged by _log_group; an error of unknown outcome is
        settled by the mark rule like any other (_settle_own finds it logged)."""
        try:
            self._attach_partitions(table, request.stage, request.partitions or ())
        except TransientError as exc:
            self._settle_own(table, display, request.stage, request.events, deadline, exc)
        except ChloadError as exc:
            raise _interrupted(request, display, exc) from exc

    def _attach_one(self, table: str, display: str, request: _Request,
                    deadline: float) -> None:
        stage, events = request.stage, request.events
        try:
            self._attach_new(table, stage, request.partitions, events)
        except TransientError as exc:
            self._settle_own(table, display, stage, events, deadline, exc)
        except ChloadError as exc:  # e.g. the table was altered or dropped meanwhile
            raise CommitInterrupted(
                f"{_files(events)}: commit into {display} failed ({exc}); its stage "
                f"{DATABASE}.{stage} is kept and every run retries it until it attaches "
                "(fix the table, or drop the stage to give the files up)") from exc

    def _survey(self, table: str, display: str, uris: Sequence[str],
                follows: Sequence[StreamPosition] = ()) -> tuple[dict[str, dict],
                                                                 dict[str, int]]:
        """Under the lock, in one query: whether a broken lock left commits to settle
        (then settle them first), each file's last event (to tell whether another
        load committed it since we started: its `committing` event means attached,
        rule 1; a stage of our own run counts too, e.g. a batch whose commit gave up),
        and the committed end of each stream in `follows` (rule 5)."""
        listed = ", ".join(quote_str(uri) for uri in uris)
        # The marker is looked up in system.columns (its one column), not system.tables:
        # 18.16 lists every table of the database for system.tables and fails the query
        # ("Table chload.stage_x doesn't exist") when one is dropped meanwhile, as the
        # group before this one drops its stages; the retry after 10 ms (server_early.ask)
        # hit the last group of 3 in 7 traced loads, 15-25 ms of the tail each time.
        # system.columns looks at the named table only (0 failures in 400 queries while
        # 3 threads created and dropped tables, 3 with system.tables).
        rows = self.sql.rows(
            f"SELECT 'dirty' AS k, table AS a, '' AS b, '' AS c, '' AS d, '' AS e FROM "
            f"system.columns WHERE database = '{DATABASE}' AND table = "
            f"{quote_str(_dirty_name(table))} "
            f"UNION ALL SELECT 'last', uri, argMax(state, seq), argMax(stage, seq), "
            f"argMax(identity, seq), toString(max(seq)) FROM {DATABASE}.files WHERE "
            f"target_table = {quote_str(display)} AND uri IN ({listed}) GROUP BY uri"
            + _stream_ends_sql(display, follows))
        if any(row["k"] == "dirty" for row in rows):
            self.settle_all(table, display)
            self._run(f"DROP TABLE IF EXISTS {DATABASE}.{_dirty_name(table)}")
            return self._survey(table, display, uris, follows)
        return ({row["a"]: row for row in rows if row["k"] == "last"},
                {row["a"]: int(row["e"]) for row in rows if row["k"] == "end"})

    def _attach_new(self, table: str, stage: str, partitions: Sequence[str] | None,
                    events: Sequence[FileEvent]) -> None:
        """Log the files `committing` with the table's mark, then attach the stage's
        partitions."""
        partitions = self._log_committing(table, stage, partitions, events)
        _crash_point("before-attach")
        self._attach_partitions(table, stage, partitions)

    def _attach_partitions(self, table: str, stage: str, partitions: Sequence[str]) -> None:
        for partition in partitions:
            self._run(f"ALTER TABLE {table} ATTACH PARTITION ID {quote_str(partition)} "
                      f"FROM {DATABASE}.{stage}", table)
            crash_point("attach-partition")
        _crash_point("after-attach")

    def _log_committing(self, table: str, stage: str, partitions: Sequence[str] | None,
                        events: Sequence[FileEvent]) -> Sequence[str]:
        """Log the events `committing`, with the mark; return the stage's partitions.

        A server reads the mark as it writes the log (one round trip: the mark is exact
        even right after another attach). In-process (an exclusive lock) a round trip
        costs little, and a statement reading the mark once per file cost chDB 1-2 ms a
        file (0.36 s for a batch of 200 small files), so the mark is read first, with
        the stage's partitions, in one query."""
        for event in events:
            event.stage, event.state, event.mark = stage, COMMITTING, 0
        if not self.lock.exclusive:
            partitions = partitions if partitions is not None else self.partitions(stage)
            self.ledger.record(list(events), mark_of=split_table(table))
            return partitions
        tops = block_tops(self.sql, [table, f"{DATABASE}.{stage}"])
        for event in events:
            event.mark = max(tops.get(table, {}).values(), default=0)
        self.ledger.record(list(events))
        return partitions if partitions is not None else sorted(
            tops.get(f"{DATABASE}.{stage}", {}))

    def _settle_own(self, table: str, display: str, stage: str, events: Sequence[FileEvent],
                    deadline: float, error: TransientError) -> None:
        """Finish our commit after an error of unknown outcome, by the mark rule: tried
        again every 2 s (SETTLE_EVERY) while `deadline` allows."""
        uris = {e.uri for e in events}
        for _ in SETTLE_EVERY.tries(self.sleep, until=deadline, wait_first=True):
            try:
                self._wait_idle(table, deadline)
                logged = [e for e in self.ledger.latest(display)
                          if e.uri in uris and e.stage == stage and e.state == COMMITTING]
                if logged:
                    self._settle(table, logged[0])
                else:
                    self._attach_new(table, stage, None, events)
                return
            except TransientError as exc:
                error = exc
        raise CommitInterrupted(
            f"{_files(events)}: commit into {display} interrupted ({error}); run the same "
            "command again to finish it (no file will be loaded twice)")

    # -- the lock --------------------------------------------------------------------
    @contextlib.contextmanager
    def _holding(self, table: str, display: str, turn: _Turn) -> Iterator[None]:
        """The table's commit lock around one group commit (or settling); the caller
        holds `turn.mutex`.

        A group that ends while more commits queued meanwhile (or while `linger` says
        more are coming) hands the lock on to them (keeps it for them) instead of
        dropping it for them to create again, while the lock is younger than
        a quarter of the lease: a lock older than the lease may be broken by a chload
        elsewhere (rule 3). An error before the body sets `turn.attaching` releases the
        lock; any error after leaves it for the next holder, who settles (rules 1, 4).
        """
        kept = time.monotonic() - (turn.held_since or 0.0)
        if turn.held_since is not None and kept >= self.lease / 4:  # kept too long (linger):
            turn.let_go()                                            # taken again below
            if kept < self.lease:  # (an older one may be another loader's by now, rule 3)
                with contextlib.suppress(ChloadError):
                    self.lock.release(table)
        if turn.held_since is None:
            _crash_point("before-lock")  # tests: let another run plan before this commit
            self.lock.acquire(table, display)
            turn.held_since = time.monotonic()
        turn.attaching = False
        try:
            yield
        except BaseException as exc:
            turn.let_go()
            if isinstance(exc, ChloadError) and not turn.attaching:
                with contextlib.suppress(ChloadError):
                    self.lock.release(table)
            raise
        with self._guard:
            passed = ((bool(turn.queue) or self.linger())
                      and time.monotonic() - turn.held_since < self.lease / 4)
        if not passed:
            self._let_go(table, turn)

    def _let_go(self, table: str, turn: _Turn) -> None:
        """Release the lock held for `turn` (the caller holds `turn.mutex`)."""
        if turn.let_go() is not None:
            with contextlib.suppress(ChloadError):  # a lock left behind is ours: the
                self.lock.release(table)             # next holder breaks it (rule 3)

    def release_kept(self) -> None:
        """Release the locks kept after their groups (`linger`): at the end of a run."""
        with self._guard:
            turns = list(self._turns.items())
        for table, turn in turns:
            with turn.mutex:
                self._let_go(table, turn)

    def _wait_idle(self, table: str, deadline: float) -> None:
        """Wait until no commit query of ours on `table` runs (an ATTACH whose answer was
        lost may still be running on the server)."""
        prefix = f"{self.holder.query_prefix}{_lock_name(table)[5:13]}-"
        for _ in IDLE_POLL.tries(self.sleep, until=deadline):
            rows = self.sql.rows(f"SELECT count() AS n FROM system.processes WHERE "
                                 f"startsWith(query_id, {quote_str(prefix)})")
            if not rows or int(rows[0]["n"]) == 0:
                return

    # -- settling --------------------------------------------------------------------
    def start(self, table: str, display: str) -> int:
        """Before a load into `table`: settle what crashed commits left (return how many
        files) and drop stages no commit needs. One query when there is nothing to do,
        the usual case: no file of the table is `committing` and no lock was broken (a
        lock still held by a dead process is broken by the first commit, rule 3)."""
        rows = self.sql.rows(_start_sql(_dirty_name(table), display))
        settled = 0
        if any(row["k"] in ("dirty", "committing") for row in rows):
            settled = self.recover(table, display)
        candidates = [{"name": r["a"], "age": r["age"]} for r in rows if r["k"] == "stage"]
        if candidates:
            self.drop_orphans(candidates)
        return settled

    def recover(self, table: str, display: str) -> int:
        """Settle every `committing` file of `table` (under the lock); return how many."""
        with self._guard:
            turn = self._turns.setdefault(table, _Turn())
        with turn.mutex, self._holding(table, display, turn):
            turn.attaching = True
            settled = self.settle_all(table, display)
            self._run(f"DROP TABLE IF EXISTS {DATABASE}.{_dirty_name(table)}")
            turn.covered = None  # (files settled meanwhile: their last events moved)
        return settled

    def settle_all(self, table: str, display: str) -> int:
        """Settle every `committing` file of `table`, in the order of their marks: a
        group logged together (_log_group) is attached in its order, each stage's
        parts taking the block numbers its mark counts on."""
        pending = sorted(self.ledger.latest(display, [COMMITTING]),
                         key=lambda e: (e.mark, e.seq))
        for event in pending:
            self._settle(table, event)
            self.ledger.record([event.moved(LOADED)])
            if event.stage:
                self._drop_stage(_bare(event.stage))
        return len(pending)

    def _settle(self, table: str, event: FileEvent) -> None:
        """Attach the stage partitions that have no part above the event's mark."""
        if not event.stage:
            return
        stage = f"{DATABASE}.{_bare(event.stage)}"
        tops = block_tops(self.sql, [table, stage])
        done = {p for p, top in tops.get(table, {}).items() if top > event.mark}
        for partition in sorted(set(tops.get(stage, {})) - done):
            self._run(f"ALTER TABLE {table} ATTACH PARTITION ID {quote_str(partition)} "
                      f"FROM {stage}", table)

    def partitions(self, stage: str) -> list[str]:
        """The partition ids of a stage (chload.<stage>) that hold rows."""
        return sorted(block_tops(self.sql, [f"{DATABASE}.{stage}"]).get(f"{DATABASE}.{stage}", {}))

    def _run(self, statement: str, table: str = "") -> None:
        """A statement whose query id says who runs it, for which table (see _wait_idle)."""
        scope = _lock_name(table)[5:13] if table else "x"
        self.sql.command(statement, f"{self.holder.query_prefix}{scope}-{os.urandom(4).hex()}")

    # -- orphans ---------------------------------------------------------------------
    def drop_orphans(self, rows: list[dict]) -> int:
        """Drop the stages in `rows` (name, age in seconds) that no commit needs: their
        process is gone (or, elsewhere, a day old): commit_orphans.py."""
        keep = committing_stages(self.sql, [r["name"] for r in rows])
        dropped = 0
        for row in rows:
            if row["name"] not in keep and orphan(row["name"], int(row["age"]),
                                                  self.lock.exclusive, self.holder, self.lease):
                dropped += self._drop_stage(row["name"])
        return dropped

    def _drop_stage(self, name: str) -> bool:
        """Drop chload.<name>, a stage no commit needs: housekeeping, never the reason a
        load fails. A stage a killed run was creating can be listed before the server
        has written its metadata file (18.16 adds the table, then renames its `.sql`
        into place); a DROP then fails with "File not found" and the server keeps the
        table. So a failed DROP is tried again (STAGE_DROP, 1.5 s in all), then the
        stage is left for the next run, which drops it the same way."""
        for _ in STAGE_DROP.tries(self.sleep):
            with contextlib.suppress(ChloadError):
                self._run(f"DROP TABLE IF EXISTS {DATABASE}.{name}")
                return True
        return False
