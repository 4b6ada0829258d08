"""commit.py `commit_group`: several stages handed over at once go as one group (one
survey, one ledger INSERT, their attaches in turn), each with its own outcome; used by
the cluster target's last round (targets/cluster_round.py)."""

from __future__ import annotations

from test_server_commit import (  # (this directory: pytest puts it on the path)
    DISPLAY,
    TABLE,
    FakeServer,
    _Killed,
    committer,
    event,
    stage_with,
)

from chload.commit.ledger import LOADED


def test_stages_handed_over_together_are_one_group() -> None:
    server = FakeServer()
    c = committer(server)
    units = [(stage_with(server, c.holder, {"all": 1}), ["all"], [event(uri)], 0)
             for uri in ("a", "b", "c")]
    assert c.commit_group(TABLE, DISPLAY, units) == [True, True, True]
    assert server.surveys == 1 and server.ledger_writes == 1  # one survey, one log
    assert server.attached == [f"chload.{stage}" for stage, *_ in units]
    marks = sorted(e.mark for e in server.events)
    assert marks == [marks[0], marks[0] + 1, marks[0] + 2]  # each its own mark


def test_a_group_handed_over_and_killed_mid_way_is_settled_by_the_next_run() -> None:
    server = FakeServer()
    c = committer(server)
    units = [(stage_with(server, c.holder, {"all": 1}), ["all"], [event(uri)], 0)
             for uri in ("a", "b", "c")]

    def kill_at_the_second_attach() -> None:
        server.on_attach = lambda: None
        server.fail["ALTER TABLE"] = [_Killed()]

    server.on_attach = kill_at_the_second_attach
    outcome = c.commit_group(TABLE, DISPLAY, units)
    assert outcome[0] is True and all(isinstance(o, BaseException) for o in outcome[1:])
    assert len(server.attached) == 1
    assert committer(server).start(TABLE, DISPLAY) == 3
    assert server.attached == [f"chload.{stage}" for stage, *_ in units]  # each once
    assert {e.state for e in server.latest(DISPLAY)} == {LOADED}
