"""The commit lock and the mark rule (commit/committer.py) against a scripted fake server
with injected faults. The real thing, with real kills, is in
tests/integration/test_server_target.py."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from chload.commit.committer import Committer, _Turn, stage_name
from chload.commit.ledger import COMMITTING, LOADED, FileEvent
from chload.commit.locks import Holder, Sql, TableLock, lock_name as _lock_name
from chload.commit.orphans import orphan
from chload.commit.request import _Request, _taken
from chload.errors import CommitInterrupted, EngineError, TransientError

TABLE, DISPLAY = "`db`.`t`", "db.t"


class FakeServer:
    """Just enough of ClickHouse for the committer: tables in `chload`, parts with block
    numbers, ATTACH PARTITION FROM, a ledger; `fail` makes chosen statements fail."""

    def __init__(self) -> None:
        self.tables: dict[str, str] = {}  # chload table -> lock holder text ('' if none)
        self.parts: dict[str, dict[str, int]] = {TABLE: {"all": 3}}
        self.block = 3
        self.events: list[FileEvent] = []
        self.fail: dict[str, list[Exception]] = {}  # statement prefix -> errors to raise
        self.attached: list[str] = []
        self.age = 0.0
        self.running: list[str] = []
        self.statements: list[str] = []
        self.on_attach: Callable[[], None] = lambda: None
        self.surveys = 0
        self.ledger_writes = 0

    def _maybe_fail(self, sql: str, when: str) -> None:
        for prefix, errors in self.fail.items():
            if sql.startswith(prefix) and errors and when == "before":
                raise errors.pop(0)

    def command(self, sql: str, query_id: str = "") -> None:
        self._maybe_fail(sql, "before")
        self.statements.append(sql)
        if m := re.match(r"CREATE TABLE (IF NOT EXISTS )?chload\.(\w+).*?DEFAULT '([^']*)'",
                         sql, re.S) or re.match(r"CREATE TABLE (IF NOT EXISTS )?chload\.(\w+)",
                                                sql):
            name = m.group(2)
            if name in self.tables and not m.group(1):
                raise EngineError(f"Table chload.{name} already exists.", 57)
            self.tables.setdefault(name, m.group(3) if m.lastindex == 3 else "")
        elif m := re.match(r"DROP TABLE IF EXISTS chload\.(\w+)", sql):
            self.tables.pop(m.group(1), None)
            self.parts.pop(f"chload.{m.group(1)}", None)
        elif m := re.match(r"RENAME TABLE chload\.(\w+) TO chload\.(\w+)", sql):
            if m.group(1) not in self.tables:
                raise EngineError("doesn't exist", 60)
            self.tables[m.group(2)] = self.tables.pop(m.group(1))
        elif m := re.match(r"ALTER TABLE (\S+) ATTACH PARTITION ID '(\w+)' FROM (\S+)", sql):
            self.block += 1
            self.parts.setdefault(m.group(1), {})[m.group(2)] = self.block
            self.attached.append(m.group(3))
            self.on_attach()
            for prefix, errors in self.fail.items():  # the attach happened, its answer lost
                if prefix == "LOST " + sql[:20] and errors:
                    raise errors.pop(0)
        else:
            raise AssertionError(f"unexpected statement {sql}")

    def rows(self, sql: str) -> list[dict]:
        if sql.startswith("SELECT 'dirty' AS k") and "'last'" not in sql:  # Committer.start
            out = [{"k": "dirty", "a": n, "age": 0} for n in self.tables if n.startswith("dirty_")]
            out += [{"k": "committing", "a": e.uri, "age": 0}
                    for e in self.latest(DISPLAY, [COMMITTING])]
            return out + [{"k": "stage", "a": n, "age": self.age} for n in self.tables
                          if n.startswith(("stage_", "lockbroken_"))]
        if "'holder' AS k" in sql:
            name = re.search(r"table = '(\w+)'", sql).group(1)  # type: ignore[union-attr]
            if name not in self.tables:
                return []
            return [{"k": "holder", "v": f"'{self.tables[name]}'"},
                    {"k": "age", "v": str(self.age)}] + \
                [{"k": "busy", "v": q} for q in self.running]
        if "UNION ALL SELECT 'last'" in sql:  # the survey under the lock
            self.surveys += 1
            out = [{"k": "dirty", "a": n} for n in self.tables if n.startswith("dirty_")]
            for uri in re.search(r"uri IN \(([^)]*)\)", sql).group(1).split(", "):  # type: ignore[union-attr]
                mine = [e for e in self.events if e.uri == uri.strip("'")]
                if mine:
                    last = max(mine, key=lambda e: e.seq)
                    out.append({"k": "last", "a": last.uri, "b": last.state, "c": last.stage,
                                "d": last.identity, "e": str(last.seq)})
            return out
        if "max(max_block_number)" in sql:
            out = []
            for d, n in re.findall(r"database = '(\w+)' AND table = '(\w+)'", sql):
                key = TABLE if (d, n) == ("db", "t") else f"{d}.{n}"
                out += [{"database": d, "table": n, "partition_id": p, "top": top}
                        for p, top in self.parts.get(key, {}).items()]
            return out
        if "system.processes" in sql:
            return [{"n": 0}]
        if sql.startswith("SELECT stage FROM"):  # stages of files still committing
            return [{"stage": e.stage} for e in self.latest(DISPLAY, [COMMITTING])]
        raise AssertionError(f"unexpected query {sql}")

    def attached_stages(self) -> list[str]:
        return [a.removeprefix("chload.") for a in self.attached]

    # the ledger, duck-typed
    def record(self, events: list[FileEvent],
               mark_of: tuple[str, str] | None = None) -> None:
        for prefix, errors in self.fail.items():
            if prefix == "ledger" and errors:
                raise errors.pop(0)
        top = max(self.parts.get(TABLE, {}).values(), default=0)
        self.ledger_writes += 1
        self.events += [replace(e, mark=top + e.mark) if mark_of else replace(e)
                        for e in events]  # (an event's own mark: an offset on the table's)

    def latest(self, table: str, states: list[str] | None = None) -> list[FileEvent]:
        last: dict[str, FileEvent] = {}
        for e in sorted(self.events, key=lambda e: e.seq):
            last[e.uri] = e
        return [e for e in last.values() if not states or e.state in states]


def committer(server: FakeServer) -> Committer:
    return Committer(Sql(server.command, server.rows), server, sleep=lambda s: None)  # type: ignore[arg-type]


def event(uri: str = "f.csv", run: str = "run1") -> FileEvent:
    return FileEvent(DISPLAY, uri, "10:1", 10, 1, "", rows=5, run_id=run)


def test_a_file_another_run_committed_meanwhile_is_taken_whatever_its_identity() -> None:
    """Another run read the file before it grew and committed it: committing our read
    too would put its first rows in the table twice."""
    request = _Request("stage_mine", ["all"], [event()], since_ns=100)
    other = {"b": LOADED, "c": "stage_other", "d": "8:1", "e": "200"}
    assert _taken({"f.csv": other}, request)
    assert not _taken({"f.csv": {**other, "e": "50"}}, request)  # before we started
    assert not _taken({"f.csv": {**other, "c": "stage_mine"}}, request)  # our own


def stage_with(server: FakeServer, holder: Holder, partitions: dict[str, int]) -> str:
    stage = stage_name(holder)
    server.tables[stage] = ""
    server.parts[f"chload.{stage}"] = partitions
    return stage


def test_commit_logs_the_mark_then_attaches_and_releases() -> None:
    server = FakeServer()
    c = committer(server)
    stage = stage_with(server, c.holder, {"all": 1})
    assert c.commit(TABLE, DISPLAY, stage, ["all"], [event()], since_ns=0)
    assert server.attached == [f"chload.{stage}"]
    assert [(e.state, e.mark, e.stage) for e in server.events] == [(COMMITTING, 3, stage)]
    assert _lock_name(TABLE) not in server.tables


def test_a_lost_attach_answer_is_settled_by_the_mark_not_attached_twice() -> None:
    server = FakeServer()
    c = committer(server)
    stage = stage_with(server, c.holder, {"all": 1})
    server.fail["LOST ALTER TABLE `db`.`t`"] = [TransientError("connection reset")]
    assert c.commit(TABLE, DISPLAY, stage, ["all"], [event()], since_ns=0)
    assert server.attached == [f"chload.{stage}"]  # once, though the answer was lost


def test_a_failed_attach_is_retried_within_the_lease() -> None:
    server = FakeServer()
    c = committer(server)
    stage = stage_with(server, c.holder, {"all": 1})
    server.fail["ALTER TABLE"] = [TransientError("server restarting")] * 2
    assert c.commit(TABLE, DISPLAY, stage, ["all"], [event()], since_ns=0)
    assert server.attached == [f"chload.{stage}"]


def test_a_commit_that_cannot_settle_keeps_the_lock_and_is_not_retried() -> None:
    server = FakeServer()
    c = committer(server)
    c.lease = 0.0  # no time left to settle
    stage = stage_with(server, c.holder, {"all": 1})
    server.fail["ALTER TABLE"] = [TransientError("server down")] * 50
    with pytest.raises(CommitInterrupted, match="run the same command again"):
        c.commit(TABLE, DISPLAY, stage, ["all"], [event()], since_ns=0)
    assert _lock_name(TABLE) in server.tables  # the next holder settles it
    assert [e.state for e in server.events] == [COMMITTING]  # never 'failed'


def test_the_next_holder_breaks_a_leftover_lock_and_settles_it() -> None:
    server = FakeServer()
    c = committer(server)
    c.lease = 0.0
    first = stage_with(server, c.holder, {"all": 1})
    server.fail["ALTER TABLE"] = [TransientError("server down")] * 50
    with pytest.raises(CommitInterrupted):
        c.commit(TABLE, DISPLAY, first, ["all"], [event("a.csv")], since_ns=0)
    server.fail.clear()
    c.lease = 60.0
    second = stage_with(server, c.holder, {"all": 1})
    assert c.commit(TABLE, DISPLAY, second, ["all"], [event("b.csv")], since_ns=0)
    assert server.attached == [f"chload.{first}", f"chload.{second}"]
    assert {(e.uri, e.state) for e in server.latest(DISPLAY)} == {
        ("a.csv", LOADED), ("b.csv", COMMITTING)}
    assert not [t for t in server.tables if t.startswith(("lock_", "dirty_"))]


def test_settling_attaches_only_partitions_without_a_part_above_the_mark() -> None:
    server = FakeServer()
    c = committer(server)
    stage = stage_with(server, c.holder, {"p1": 1, "p2": 2})
    server.parts[TABLE], server.block = {"p1": 9, "p2": 3}, 9  # p1 attached before the crash
    server.events.append(replace(event(), state=COMMITTING, stage=stage, mark=5))
    assert c.recover(TABLE, DISPLAY) == 1
    assert server.attached == [f"chload.{stage}"] and server.parts[TABLE]["p2"] > 5
    assert server.latest(DISPLAY)[0].state == LOADED


def test_a_clean_start_takes_no_lock_and_drops_only_orphaned_stages() -> None:
    server = FakeServer()
    c = committer(server)
    live = stage_with(server, c.holder, {"all": 1})  # this process: in use
    dead = stage_with(server, Holder(c.holder.machine, 2**22 + 7, 1), {"all": 1})
    assert c.start(TABLE, DISPLAY) == 0
    assert server.statements == [f"DROP TABLE IF EXISTS chload.{dead}"]
    assert live in server.tables and dead not in server.tables


def test_a_stage_whose_drop_fails_is_tried_again_then_left_never_failing_the_load() -> None:
    """CI, 18.16: a rerun listed a stage a killed run was still creating; its DROP
    failed with "File not found: .../stage_x.sql" (the server had not renamed the
    metadata file into place yet) and the whole load failed with it."""
    server = FakeServer()
    c = committer(server)
    race = EngineError("File not found: /data/metadata/chload/stage_x.sql", 1000)
    dead = stage_with(server, Holder(c.holder.machine, 2**22 + 7, 1), {"all": 1})
    server.fail["DROP TABLE"] = [race, race]
    assert c.start(TABLE, DISPLAY) == 0
    assert dead not in server.tables  # the third try dropped it
    dead = stage_with(server, Holder(c.holder.machine, 2**22 + 9, 1), {"all": 1})
    server.fail["DROP TABLE"] = [race] * 10
    assert c.start(TABLE, DISPLAY) == 0  # it stays, for the next run
    assert dead in server.tables
    server.fail.clear()
    assert c.start(TABLE, DISPLAY) == 0 and dead not in server.tables


def test_a_start_after_a_crash_settles_under_the_lock() -> None:
    server = FakeServer()
    c = committer(server)
    crashed = stage_with(server, Holder(c.holder.machine, 2**22 + 7, 1), {"all": 1})
    server.events.append(replace(event(), state=COMMITTING, stage=crashed, mark=3))
    assert c.start(TABLE, DISPLAY) == 1
    assert server.attached == [f"chload.{crashed}"]
    assert server.statements[0].startswith(f"CREATE TABLE chload.{_lock_name(TABLE)}")
    assert server.latest(DISPLAY)[0].state == LOADED and crashed not in server.tables


def test_a_file_another_run_committed_meanwhile_is_not_attached_again() -> None:
    server = FakeServer()
    c = committer(server)
    other = replace(event(run="other"), state=COMMITTING, stage="s", mark=1, seq=100)
    server.events.append(other)
    stage = stage_with(server, c.holder, {"all": 1})
    assert not c.commit(TABLE, DISPLAY, stage, ["all"], [event()], since_ns=50)
    assert server.attached == [] and _lock_name(TABLE) not in server.tables
    # ... but a load before this run started does not count (that is --force)
    assert c.commit(TABLE, DISPLAY, stage, ["all"], [event()], since_ns=200)


def _queue_second_commit(server: FakeServer, c: Committer, stage: str,
                         outcome: list[object]) -> threading.Thread:
    """During the first commit's ATTACH, start a second commit of the same process into
    the same table and wait until it queues for the lock."""
    def second() -> None:
        try:
            outcome.append(c.commit(TABLE, DISPLAY, stage, ["all"], [event("b.csv")], 0))
        except Exception as exc:  # noqa: BLE001 -- the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=second)

    def start_it() -> None:
        server.on_attach = lambda: None
        thread.start()
        deadline = time.monotonic() + 10
        while not c._turns[TABLE].queue:
            if time.monotonic() > deadline:
                pytest.fail("the second commit did not queue within 10 s")
            time.sleep(0.001)

    server.on_attach = start_it
    return thread


def _lock_statements(server: FakeServer) -> list[str]:
    lock = f"chload.{_lock_name(TABLE)}"
    return [s.split(" (")[0] for s in server.statements if lock in s]


def _first_with_a_second_queued(server: FakeServer, c: Committer) -> tuple[str, str, object]:
    """Commit a.csv while b.csv's commit queues behind it: both stages, b's outcome."""
    first, second = (stage_with(server, c.holder, {"all": 1}) for _ in range(2))
    outcome: list[object] = []
    thread = _queue_second_commit(server, c, second, outcome)
    assert c.commit(TABLE, DISPLAY, first, ["all"], [event("a.csv")], since_ns=0)
    thread.join(10)
    return first, second, outcome[0]


def test_a_commit_queued_behind_another_is_handed_the_lock() -> None:
    server = FakeServer()
    c = committer(server)
    first, second, outcome = _first_with_a_second_queued(server, c)
    assert outcome is True
    assert server.attached == [f"chload.{first}", f"chload.{second}"]
    lock = f"chload.{_lock_name(TABLE)}"
    assert _lock_statements(server) == [f"CREATE TABLE {lock}",
                                        f"DROP TABLE IF EXISTS {lock}"]
    # the second file's mark is the table after the first's attach: settling stays exact
    assert [(e.uri, e.mark) for e in server.events] == [("a.csv", 3), ("b.csv", 4)]
    assert _lock_name(TABLE) not in server.tables


def test_a_lock_held_for_a_quarter_of_the_lease_is_released_not_handed_on() -> None:
    server = FakeServer()
    c = committer(server)
    c.lease = 0.0  # every lock is too old to pass on
    assert _first_with_a_second_queued(server, c)[2] is True
    assert [s.split()[0] for s in _lock_statements(server)] == ["CREATE", "DROP"] * 2


def test_a_lock_kept_while_more_commits_are_coming_is_created_once() -> None:
    """`linger` (a cluster routing several units): the lock stays between commits that
    do not overlap, and goes at release_kept, or when it is a quarter of the lease old."""
    server = FakeServer()
    c = committer(server)
    coming = [True]
    c.linger = lambda: coming[0]
    for uri in ("a.csv", "b.csv"):
        assert c.commit(TABLE, DISPLAY, stage_with(server, c.holder, {"all": 1}),
                        ["all"], [event(uri)], since_ns=0)
    assert [s.split()[0] for s in _lock_statements(server)] == ["CREATE"]
    assert _lock_name(TABLE) in server.tables
    c.release_kept()
    assert [s.split()[0] for s in _lock_statements(server)] == ["CREATE", "DROP"]
    assert _lock_name(TABLE) not in server.tables
    c.lease = 0.0  # a lock a quarter of the lease old is not kept
    assert c.commit(TABLE, DISPLAY, stage_with(server, c.holder, {"all": 1}),
                    ["all"], [event("c.csv")], since_ns=0)
    coming[0] = False
    assert c.commit(TABLE, DISPLAY, stage_with(server, c.holder, {"all": 1}),
                    ["all"], [event("d.csv")], since_ns=0)
    assert [s.split()[0] for s in _lock_statements(server)] == ["CREATE", "DROP"] * 3
    assert [(e.uri, e.mark) for e in server.events if e.state == "committing"] == [
        ("a.csv", 3), ("b.csv", 4), ("c.csv", 5), ("d.csv", 6)]


def test_an_error_before_the_attach_of_a_handed_on_commit_releases_the_lock() -> None:
    server = FakeServer()
    c = committer(server)
    surveys = []

    def rows(sql: str) -> list[dict]:  # the second commit's survey fails, once
        if "UNION ALL SELECT 'last'" in sql:
            surveys.append(sql)
            if len(surveys) == 2:
                raise TransientError("connection reset during the survey")
        return server.rows(sql)

    c.sql.rows = rows
    first, second, outcome = _first_with_a_second_queued(server, c)
    assert isinstance(outcome, TransientError)
    assert server.attached == [f"chload.{first}"]
    assert _lock_name(TABLE) not in server.tables  # nothing attached: released
    assert c.commit(TABLE, DISPLAY, second, ["all"], [event("b.csv")], since_ns=0)


def _commit_together(c: Committer, stages: dict[str, str]) -> dict[str, object]:
    """Commit each uri's stage on its own thread, all queued before the first goes."""
    outcome: dict[str, object] = {}

    def one(uri: str, stage: str) -> None:
        try:
            outcome[uri] = c.commit(TABLE, DISPLAY, stage, ["all"], [event(uri)], 0)
        except BaseException as exc:  # noqa: BLE001 -- the test inspects it
            outcome[uri] = exc

    turn = c._turns.setdefault(TABLE, _Turn())
    threads = [threading.Thread(target=one, args=item) for item in stages.items()]
    with turn.mutex:  # as if another commit of this process were under way
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while len(turn.queue) < len(threads):
            if time.monotonic() > deadline:
                pytest.fail(f"{len(threads)} commits did not queue within 10 s "
                            f"({len(turn.queue)} did)")
            time.sleep(0.001)
    for thread in threads:
        thread.join(10)
    return outcome


def test_commits_that_queue_together_share_one_lock_and_one_survey() -> None:
    server = FakeServer()
    c = committer(server)
    stages = {uri: stage_with(server, c.holder, {"all": 1}) for uri in ("a", "b", "c")}
    assert _commit_together(c, stages) == {"a": True, "b": True, "c": True}
    assert server.surveys == 1
    assert [s.split()[0] for s in _lock_statements(server)] == ["CREATE", "DROP"]
    # one ledger statement logs the group; each stage's mark is the table's as it
    # will be just before its own attach: exact, as if each were logged alone
    assert server.ledger_writes == 1
    logged = [(e.mark, e.stage) for e in sorted(server.events, key=lambda e: e.mark)]
    assert logged == list(zip([3, 4, 5], server.attached_stages(), strict=True))


def test_a_group_stopped_by_a_failed_attach_tells_the_rest_nothing_was_committed() -> None:
    server = FakeServer()
    c = committer(server)
    stages = {uri: stage_with(server, c.holder, {"all": 1}) for uri in ("a", "b")}
    server.fail["ALTER TABLE"] = [EngineError("Table was altered meanwhile", 47)]
    outcome = _commit_together(c, stages)
    # both were logged together: the first may have attached, the second is left to
    # the next holder (never "not committed", whose stage its caller would drop)
    assert all(isinstance(o, CommitInterrupted) for o in outcome.values())
    assert "interrupted" in str(outcome["b"])
    assert len(server.events) == 2 and _lock_name(TABLE) in server.tables


@pytest.mark.parametrize("holder, age, running, stale", [
    ("mine", 0.0, [], True),  # a commit of ours that gave up
    ("dead-here", 0.0, [], True),  # this machine, process gone
    ("elsewhere", 5.0, [], False),  # another machine, within the lease
    ("elsewhere", 90.0, [], True),  # another machine, lease over, nothing running
    ("elsewhere", 90.0, ["q"], False),  # ... but its ATTACH still runs on the server
    ("garbage", 5.0, [], False),
    ("garbage", 90.0, [], True),
])
def test_which_locks_are_stale(holder: str, age: float, running: list[str], stale: bool) -> None:
    c = committer(FakeServer())
    me = c.holder
    text = {"mine": me.encode(), "dead-here": Holder(me.machine, 2**22 + 7, 1).encode(),
            "elsewhere": Holder("0" * 12, 42, 1).encode(), "garbage": "x"}[holder]
    busy = [Holder("0" * 12, 42, 1).query_prefix + "abc"] if running else []
    assert isinstance(c.lock, TableLock)  # a server's lock (locks.py)
    assert c.lock.stale(text, age, busy) is stale


def test_holder_round_trip_and_liveness() -> None:
    me = Holder.this_process()
    assert Holder.decode(f"'{me.encode()}'") == me and me.alive_here()
    assert not Holder(me.machine, me.pid, me.start + 1).alive_here()  # a reused pid
    assert Holder.decode("nonsense") is None


def test_orphan_stages() -> None:
    me = Holder.this_process()

    def gone(name: str, age: int) -> bool:
        return orphan(name, age, False, me, 60.0)

    assert not gone(stage_name(me), 10**6)  # ours, live
    assert gone(stage_name(Holder(me.machine, 2**22 + 7, me.start)), 0)  # dead process here
    assert gone(stage_name(Holder(me.machine, me.pid, me.start + 1)), 0)  # its pid reused
    assert not gone(stage_name(Holder("0" * 12, 42, 1)), 3600)  # elsewhere, recent
    assert gone(stage_name(Holder("0" * 12, 42, 1)), 2 * 86400)  # elsewhere, a day old
    # named by an older chload (no start): its pid alone tells
    assert not gone(f"stage_{me.machine}_{me.pid}_abcd1234", 10**6)
    assert gone(f"stage_{me.machine}_{2**22 + 7}_abcd1234", 0)
    assert not gone(f"stage_{'0' * 12}_42_abcd1234", 3600)
    assert orphan(stage_name(Holder(me.machine, me.pid, me.start + 1)), 0, True, me, 60.0)
    assert not orphan(stage_name(me), 0, True, me, 60.0)  # embedded: only ours are kept
    assert gone("lockbroken_x", 61) and not gone("lockbroken_x", 59)  # older than the lease


class _Killed(BaseException):
    """The loader dying mid-group (SIGKILL, as seen from inside)."""


def test_a_group_killed_between_two_attaches_is_settled_exactly_by_the_next_run() -> None:
    server = FakeServer()
    c = committer(server)
    stages = {uri: stage_with(server, c.holder, {"all": 1}) for uri in ("a", "b", "c")}

    def kill_at_the_second_attach() -> None:
        server.on_attach = lambda: None
        server.fail["ALTER TABLE"] = [_Killed()]

    server.on_attach = kill_at_the_second_attach
    outcome = _commit_together(c, stages)
    assert sum(isinstance(o, _Killed) for o in outcome.values()) == 1
    assert len(server.attached) == 1 and len(server.events) == 3  # logged together
    assert _lock_name(TABLE) in server.tables

    after = committer(server)  # the next run (this process: its lock counts as given up)
    assert after.start(TABLE, DISPLAY) == 3
    stages = [e.stage for e in sorted(server.events[:3], key=lambda e: e.mark)]
    assert server.attached == [f"chload.{s}" for s in stages]  # each once, in mark order
    assert {e.state for e in server.latest(DISPLAY)} == {LOADED}
    assert not [t for t in server.tables if t.startswith(("lock_", "dirty_"))]


class _Recorder:
    """The two calls the ledger makes, recorded; the mark query answers 41."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def command(self, sql: str) -> None:
        self.statements.append(sql)

    def rows(self, sql: str) -> list[dict]:
        self.statements.append(sql)
        return [{"mark": "41"}]


def test_the_ledger_logs_the_mark_in_the_statement_that_logs_the_files() -> None:
    from chload.commit.ledger import Ledger

    sql = _Recorder()
    Ledger(sql).record([event("a.csv"), event("b.csv")], mark_of=("db", "t"))
    [insert] = sql.statements
    assert insert.startswith("INSERT INTO chload.files (target_table, uri, identity")
    assert insert.count("SELECT toUInt64(max(max_block_number)) AS m FROM system.parts "
                        "WHERE active AND database = 'db' AND table = 't'") == 1
    assert insert.count("'a.csv'") == insert.count("'b.csv'") == 1  # both, ARRAY JOINed


def test_a_batch_too_big_for_one_query_reads_the_mark_first() -> None:
    from chload.commit.ledger import Ledger

    sql = _Recorder()
    events = [event(f"s3://bucket/{'x' * 900}/{i}.csv") for i in range(256)]
    Ledger(sql).record(events, mark_of=("db", "t"))
    ask, insert = sql.statements
    assert ask.startswith("SELECT (SELECT toUInt64(max(max_block_number))")
    assert insert.startswith("INSERT INTO chload.files FORMAT JSONEachRow")
    assert insert.count('"mark": 41') == 256
