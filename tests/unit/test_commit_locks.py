"""The committer under the embedded target's lock (locks.ProcessLock) and the shared
buffered `loaded` writer (ledger.LoadedEvents), against the scripted fake server of
test_server_commit.py. The real thing, with real kills: tests/integration/test_committer.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_server_commit import DISPLAY, TABLE, FakeServer, event, stage_with

from chload.commit.committer import Committer
from chload.commit.ledger import COMMITTING, LOADED, LoadedEvents
from chload.commit.locks import Holder, ProcessLock, Sql, dirty_name
from chload.errors import CommitInterrupted, EngineError, TransientError


def embedded(server: FakeServer) -> Committer:
    sql = Sql(server.command, server.rows)
    return Committer(sql, server, sleep=lambda s: None, lock=ProcessLock(sql))  # type: ignore[arg-type]


def test_an_embedded_commit_takes_no_lock_table_and_reads_the_mark_first() -> None:
    server = FakeServer()
    c = embedded(server)
    stage = stage_with(server, c.holder, {"all": 1})
    assert c.commit(TABLE, DISPLAY, stage, None, [event()], since_ns=0)
    assert server.attached == [f"chload.{stage}"]
    assert [(e.state, e.mark, e.stage) for e in server.events] == [(COMMITTING, 3, stage)]
    assert not [s for s in server.statements if "lock_" in s]


def test_an_embedded_commit_that_gave_up_is_settled_by_the_next() -> None:
    server = FakeServer()
    c = embedded(server)
    first = stage_with(server, c.holder, {"all": 1})
    server.fail["ALTER TABLE"] = [EngineError("Table was altered meanwhile", 47)]
    with pytest.raises(CommitInterrupted):
        c.commit(TABLE, DISPLAY, first, None, [event("a.csv")], since_ns=0)
    second = stage_with(server, c.holder, {"all": 1})
    assert c.commit(TABLE, DISPLAY, second, None, [event("b.csv")], since_ns=0)
    assert server.attached == [f"chload.{first}", f"chload.{second}"]  # each once
    assert {(e.uri, e.state) for e in server.latest(DISPLAY)} == {
        ("a.csv", LOADED), ("b.csv", COMMITTING)}
    assert dirty_name(TABLE) not in server.tables


def test_an_error_before_anything_is_logged_releases_the_embedded_lock() -> None:
    server = FakeServer()
    c = embedded(server)
    answer = server.rows

    def rows(sql: str) -> list[dict]:  # the survey fails, once
        if "UNION ALL SELECT 'last'" in sql and not server.surveys:
            server.surveys += 1
            raise TransientError("interrupted")
        return answer(sql)

    c.sql.rows = rows
    stage = stage_with(server, c.holder, {"all": 1})
    with pytest.raises(TransientError):
        c.commit(TABLE, DISPLAY, stage, None, [event()], since_ns=0)
    assert c.commit(TABLE, DISPLAY, stage, None, [event()], since_ns=0)
    assert not [s for s in server.statements if "dirty_" in s]  # nothing to settle


def test_embedded_orphans_are_every_stage_of_another_process_nobody_needs() -> None:
    server = FakeServer()
    c = embedded(server)
    live = stage_with(server, c.holder, {"all": 1})  # this process: in use
    elsewhere = stage_with(server, Holder("0" * 12, 42, 1), {"all": 1})  # before a reboot
    needed = stage_with(server, Holder("0" * 12, 43, 1), {"all": 1})
    server.tables["stage_0123456789abcdef_raw"] = ""  # named before the committer
    server.events.append(replace(event(), state=COMMITTING, stage=needed, mark=9))
    server.parts["`db`.`t`"]["all"] = 10  # attached: settled by the mark, not again
    assert c.start(TABLE, DISPLAY) == 1
    assert server.attached == []
    assert live in server.tables
    assert not {elsewhere, needed, "stage_0123456789abcdef_raw"} & set(server.tables)


def test_a_stage_logged_qualified_before_the_committer_is_still_settled() -> None:
    server = FakeServer()
    c = embedded(server)
    old = "stage_0123456789abcdef"
    server.tables[old], server.parts[f"chload.{old}"] = "", {"all": 1}
    server.events.append(replace(event(), state=COMMITTING, stage=f"chload.{old}", mark=3))
    assert c.start(TABLE, DISPLAY) == 1
    assert server.attached == [f"chload.{old}"] and old not in server.tables


class _FlakyLedger:
    def __init__(self) -> None:
        self.fail = 0
        self.written: list[list[str]] = []

    def record(self, events: list, mark_of: object = None) -> None:
        if self.fail:
            self.fail -= 1
            raise TransientError("server restarting")
        self.written.append([e.uri for e in events])


def test_loaded_events_wait_go_together_and_survive_a_failed_write() -> None:
    ledger = _FlakyLedger()
    loaded = LoadedEvents(ledger, every=3600)  # type: ignore[arg-type]
    loaded.add([event("a.csv")])
    loaded.add(e for e in [event("b.csv")])
    assert ledger.written == []
    ledger.fail = 1
    with pytest.raises(TransientError):
        loaded.flush()
    loaded.flush()
    assert ledger.written == [["a.csv", "b.csv"]]


def test_adding_loaded_events_never_raises() -> None:
    ledger = _FlakyLedger()
    loaded = LoadedEvents(ledger, every=0)  # type: ignore[arg-type]
    ledger.fail = 1
    loaded.add([event("a.csv")])  # due, and the write fails: kept for the next
    loaded.add([event("b.csv")])
    assert ledger.written == [["a.csv", "b.csv"]]
