"""commit.py's survey within one hold of the lock: it asks about every unit of the table
in flight (`Committer.expecting`), so a group the lock is handed to is not surveyed
again, and a commit that queues while the survey runs joins the group it covered. Both
rest on one rule: while this process holds the lock without a break nobody else commits
into the table, so the survey's answer stands until the lock is let go (rule 5)."""

from __future__ import annotations

import threading
import time

import pytest
from test_server_commit import (  # (this directory: pytest puts it on the path)
    DISPLAY,
    TABLE,
    FakeServer,
    _first_with_a_second_queued,
    committer,
    event,
    stage_with,
)

from chload.commit.committer import Committer
from chload.commit.ledger import LOADED, FileEvent


class Hooked(FakeServer):
    """A fake server that runs `on_survey` (once) while the survey is being asked."""

    def __init__(self) -> None:
        super().__init__()
        self.on_survey: list = []

    def rows(self, sql: str) -> list[dict]:
        if "UNION ALL SELECT 'last'" in sql and self.on_survey:
            self.on_survey.pop()()
        return super().rows(sql)


def _committed_elsewhere(server: FakeServer, uri: str) -> None:
    """Another load committed `uri` after this run began (since_ns 0)."""
    server.events.append(FileEvent(DISPLAY, uri, "10:1", 10, 1, LOADED, stage="stage_other"))


def _queue_during_survey(server: Hooked, c: Committer, stage: str,
                         outcome: list[object]) -> threading.Thread:
    """While the next survey runs, start a commit of b.csv and wait until it queues."""
    thread = threading.Thread(target=lambda: outcome.append(
        c.commit(TABLE, DISPLAY, stage, ["all"], [event("b.csv")], 0)))

    def start_it() -> None:
        thread.start()
        deadline = time.monotonic() + 10
        while not c._turns[TABLE].queue:
            if time.monotonic() > deadline:
                pytest.fail("b.csv's commit did not queue within 10 s")
            time.sleep(0.001)

    server.on_survey.append(start_it)
    return thread


def test_a_group_handed_the_lock_stands_on_the_first_survey_which_asked_about_it() -> None:
    server = FakeServer()
    c = committer(server)
    _committed_elsewhere(server, "b.csv")  # before this process took the lock
    with c.expecting(TABLE, ["a.csv"]), c.expecting(TABLE, ["b.csv"]):
        first, _, outcome = _first_with_a_second_queued(server, c)
    assert outcome is False  # b.csv taken: known from the first survey
    assert server.surveys == 1
    assert server.attached == [f"chload.{first}"]


def test_once_the_lock_is_let_go_the_next_group_is_surveyed_again() -> None:
    server = FakeServer()
    c = committer(server)
    with c.expecting(TABLE, ["a.csv"]), c.expecting(TABLE, ["b.csv"]):
        first = stage_with(server, c.holder, {"all": 1})
        assert c.commit(TABLE, DISPLAY, first, ["all"], [event("a.csv")], since_ns=0)
        _committed_elsewhere(server, "b.csv")  # between our two holds of the lock
        second = stage_with(server, c.holder, {"all": 1})
        assert not c.commit(TABLE, DISPLAY, second, ["all"], [event("b.csv")], since_ns=0)
    assert server.surveys == 2
    assert server.attached == [f"chload.{first}"]


def test_a_commit_queued_during_a_survey_that_covered_it_joins_the_group() -> None:
    server = Hooked()
    c = committer(server)
    first, second = (stage_with(server, c.holder, {"all": 1}) for _ in range(2))
    outcome: list[object] = []
    with c.expecting(TABLE, ["a.csv"]), c.expecting(TABLE, ["b.csv"]):
        thread = _queue_during_survey(server, c, second, outcome)
        assert c.commit(TABLE, DISPLAY, first, ["all"], [event("a.csv")], since_ns=0)
        thread.join(10)
    assert outcome == [True]
    assert server.surveys == 1 and server.ledger_writes == 1  # one group
    assert server.attached == [f"chload.{first}", f"chload.{second}"]
    assert sorted((e.uri, e.mark) for e in server.events) == [("a.csv", 3), ("b.csv", 4)]


def test_a_commit_the_survey_did_not_cover_does_not_join_it() -> None:
    server = Hooked()
    c = committer(server)
    first, second = (stage_with(server, c.holder, {"all": 1}) for _ in range(2))
    outcome: list[object] = []
    _committed_elsewhere(server, "b.csv")
    with c.expecting(TABLE, ["a.csv"]):  # b.csv not in flight when the survey asked
        thread = _queue_during_survey(server, c, second, outcome)
        assert c.commit(TABLE, DISPLAY, first, ["all"], [event("a.csv")], since_ns=0)
        thread.join(10)
    assert outcome == [False]  # its own survey found it taken
    assert server.surveys == 2
    assert server.attached == [f"chload.{first}"]


def test_the_files_in_flight_are_forgotten_when_their_unit_ends() -> None:
    c = committer(FakeServer())
    with c.expecting(TABLE, ["a.csv"]):
        with c.expecting(TABLE, ["a.csv", "b.csv"]):  # (a retried unit: counted twice)
            assert c._in_flight[TABLE] == {"a.csv": 2, "b.csv": 1}
        assert c._in_flight[TABLE] == {"a.csv": 1}
    assert c._in_flight[TABLE] == {}


def test_too_many_files_in_flight_are_not_asked_about() -> None:
    server = Hooked()
    asked: list[str] = []
    survey = server.rows
    server.rows = lambda sql: (asked.append(sql), survey(sql))[1]  # type: ignore[method-assign]
    c = committer(server)
    with c.expecting(TABLE, [f"f{i}.csv" for i in range(1001)]):
        stage = stage_with(server, c.holder, {"all": 1})
        assert c.commit(TABLE, DISPLAY, stage, ["all"], [event("a.csv")], since_ns=0)
    surveys = [sql for sql in asked if "'last'" in sql]
    assert len(surveys) == 1 and "'a.csv'" in surveys[0] and "'f0.csv'" not in surveys[0]
