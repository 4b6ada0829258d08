"""Exactly once into a table, for every target: when a loaded stage is attached, under
which commit lock, with which other commits of this process (group commit). The protocol
and its proof: docs/architecture.md ("The commit protocol"); attach.py holds its
statements. The invariants that make a crash at any instant harmless:

1. The lock is released only after every partition is attached.
2. On a server, a stage holds one part per partition when attached (OPTIMIZE ... FINAL).
3. A lock whose holder is gone is broken, never ignored: `chload.dirty_<t>` first, and the
   next holder settles the table by the mark rule before committing.
4. An error of unknown outcome is settled by that rule until half the lease is spent,
   then CommitInterrupted: never `failed` over a possible attach.
5. Under the lock a commit surveys its units' last events and its streams' committed
   ends: a unit committed meanwhile, or whose stream's end moved, attaches nothing.
6. A stage is dropped only when no `committing` file names it and its process is gone.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from chload.commit.attach import Attacher
from chload.commit.ledger import DATABASE, FileEvent, Ledger
from chload.commit.locks import LEASE_SECONDS, CommitLock, Holder, Sql, TableLock, dirty_name
from chload.commit.request import (
    _crash_point,
    _ends,
    _files,
    _interrupted,
    _moved,
    _not_committed,
    _Request,
    _start_sql,
    _stream_ends_sql,
    _taken,
)
from chload.errors import ChloadError, CommitInterrupted, TransientError
from chload.schema import quote_str
from chload.sources.base import StreamPosition

# Files of other units in flight a survey asks about at most (_to_attach): its query
# stays far below 18.16's max_query_size (256 KiB) with a batch's own files in it
_COVER_MOST = 1000


def stage_name(holder: Holder) -> str:
    """A fresh stage's name: its process as a lock names it (machine, pid and the
    process's start, so a pid used again by another process is told apart: orphans.py)."""
    return f"stage_{holder.machine}_{holder.pid}_{holder.start}_{os.urandom(4).hex()}"


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
                 lock: CommitLock | None = None, moves: bool = False) -> None:
        self.sql, self.ledger, self.lease, self.sleep = sql, ledger, lease, sleep
        self.holder = Holder.this_process()
        self.lock: CommitLock = lock or TableLock(sql, self.holder, lease, sleep)
        self.attacher = Attacher(sql, ledger, self.holder, self.lock.exclusive, sleep, moves)
        self._turns: dict[str, _Turn] = {}
        self._guard = threading.Lock()
        self._in_flight: dict[str, dict[str, int]] = {}  # table -> uri -> units (expect)
        # True while more commits of this run are coming: the lock is then kept after a
        # group for them (see _holding); a cluster sets it (cluster/target.py)
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
                     follows: Sequence[Sequence[StreamPosition]] = (),
                     ) -> list[bool | BaseException]:
        """`commit` of several stages (stage, partitions, events, since_ns) at once, queued
        together so they go as one group: one caller holding them all need not race its
        own threads into the queue (whichever thread got the turn first led a group of
        one). `follows`, if given, each unit's streams (rule 5), in the units' order. Each
        unit's outcome as `commit` would return or raise it."""
        requests = [_Request(stage, parts, events, since, follows[i] if follows else ())
                    for i, (stage, parts, events, since) in enumerate(units)]
        self._submit(table, display, requests)
        return [r.error if r.error is not None else bool(r.attached) for r in requests]

    def use_mode(self, table: str, mode: str, run_id: str) -> None:
        """The load mode of run `run_id` into `table` (LoadJob.mode): append, or
        replace-partitions (attach.py says how each partition is replaced once a run)."""
        self.attacher.use_mode(table, mode == "replace-partitions", run_id)

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
                if self._logs_together(table, todo):
                    turn.attaching = True
                    logged = todo
                    self.attacher.log_group(table, todo)
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
        surveyed again (a survey is a round trip in the load's tail)."""
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
        than as a group of their own after it (another survey and log in the load's
        tail). In order, as `_to_attach`."""
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

    def _logs_together(self, table: str, todo: Sequence[_Request]) -> bool:
        """Log a group's stages in one statement (a server, several stages, each one's
        partitions known): one ledger round trip under the lock instead of one per
        stage. Not where partitions are replaced: each stage's mark is read just before
        its own commit (a REPLACE takes more block numbers than the parts it adds)."""
        return (not self.lock.exclusive and len(todo) > 1
                and all(r.partitions is not None for r in todo)
                and not self.attacher.replaces(table))

    def _attach_logged(self, table: str, display: str, request: _Request,
                       deadline: float) -> None:
        """Attach a stage already logged by log_group; an error of unknown outcome is
        settled by the mark rule like any other (settle_own finds it logged)."""
        try:
            self.attacher.attach(table, request.stage, request.partitions or (),
                                 request.events[0].replaced if request.events else "")
        except TransientError as exc:
            self.attacher.settle_own(table, display, request.stage, request.events, deadline, exc)
        except ChloadError as exc:
            raise _interrupted(request, display, exc) from exc

    def _attach_one(self, table: str, display: str, request: _Request,
                    deadline: float) -> None:
        stage, events = request.stage, request.events
        try:
            self.attacher.attach_new(table, stage, request.partitions, events)
        except TransientError as exc:
            self.attacher.settle_own(table, display, stage, events, deadline, exc)
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
        # The marker is looked up in system.columns, which reads the named table only:
        # 18.16's system.tables lists every table of the database and fails ("Table
        # chload.stage_x doesn't exist") when a stage is dropped meanwhile.
        rows = self.sql.rows(
            f"SELECT 'dirty' AS k, table AS a, '' AS b, '' AS c, '' AS d, '' AS e FROM "
            f"system.columns WHERE database = '{DATABASE}' AND table = "
            f"{quote_str(dirty_name(table))} "
            f"UNION ALL SELECT 'last', uri, argMax(state, seq), argMax(stage, seq), "
            f"argMax(identity, seq), toString(max(seq)) FROM {DATABASE}.files WHERE "
            f"target_table = {quote_str(display)} AND uri IN ({listed}) GROUP BY uri"
            + _stream_ends_sql(display, follows))
        if any(row["k"] == "dirty" for row in rows):
            self.attacher.settle_all(table, display)
            self.attacher.run(f"DROP TABLE IF EXISTS {DATABASE}.{dirty_name(table)}")
            return self._survey(table, display, uris, follows)
        return ({row["a"]: row for row in rows if row["k"] == "last"},
                {row["a"]: int(row["e"]) for row in rows if row["k"] == "end"})

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

    # -- settling --------------------------------------------------------------------
    def start(self, table: str, display: str) -> int:
        """Before a load into `table`: settle what crashed commits left (return how many
        files) and drop stages no commit needs. One query when there is nothing to do,
        the usual case: no file of the table is `committing` and no lock was broken (a
        lock still held by a dead process is broken by the first commit, rule 3)."""
        rows = self.sql.rows(_start_sql(dirty_name(table), display))
        settled = 0
        if any(row["k"] in ("dirty", "committing") for row in rows):
            settled = self.recover(table, display)
        candidates = [{"name": r["a"], "age": r["age"]} for r in rows if r["k"] == "stage"]
        if candidates:
            self.attacher.drop_orphans(candidates, self.lease)
        return settled

    def recover(self, table: str, display: str) -> int:
        """Settle every `committing` file of `table` (under the lock); return how many."""
        with self._guard:
            turn = self._turns.setdefault(table, _Turn())
        with turn.mutex, self._holding(table, display, turn):
            turn.attaching = True
            settled = self.attacher.settle_all(table, display)
            self.attacher.run(f"DROP TABLE IF EXISTS {DATABASE}.{dirty_name(table)}")
            turn.covered = None  # (files settled meanwhile: their last events moved)
        return settled
