"""commit_batch.py: filled stages wait for each other and commit in one group, when
nothing else is filling, when `slack` wait, or after `max_wait`; each learns its own
outcome, and an error of the group reaches every unit of it."""

from __future__ import annotations

import threading
import time

from test_server_commit import (  # (this directory: pytest puts it on the path)
    DISPLAY,
    TABLE,
    FakeServer,
    committer,
    event,
    stage_with,
)

from chload.errors import TransientError
from chload.targets.commit_batch import CommitBatcher


def _commit_on_threads(batcher: CommitBatcher, units: list[tuple[str, str]],
                       ) -> dict[str, bool | BaseException]:
    """Each (stage, uri) filled and committed on its own thread, all filling at once:
    the last to finish its fill lets the group go."""
    outcomes: dict[str, bool | BaseException] = {}
    started = threading.Barrier(len(units))

    def one(stage: str, uri: str) -> None:
        with batcher.filling():
            started.wait()
        try:
            outcomes[uri] = batcher.commit(TABLE, DISPLAY, stage, ["all"], [event(uri)], 0)
        except BaseException as exc:  # noqa: BLE001
            outcomes[uri] = exc

    threads = [threading.Thread(target=one, args=unit) for unit in units]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return outcomes


def test_units_filled_together_commit_as_one_group() -> None:
    server = FakeServer()
    c = committer(server)
    units = [(stage_with(server, c.holder, {"all": 1}), uri) for uri in ("a", "b", "c", "d")]
    outcomes = _commit_on_threads(CommitBatcher(c, slack=8), units)
    assert outcomes == {"a": True, "b": True, "c": True, "d": True}
    assert server.surveys == 1 and server.ledger_writes == 1  # one lock, one log
    assert sorted(server.attached) == sorted(f"chload.{stage}" for stage, _ in units)


def test_a_unit_commits_at_once_when_nothing_else_fills() -> None:
    server = FakeServer()
    c = committer(server)
    stage = stage_with(server, c.holder, {"all": 1})
    began = time.monotonic()
    assert CommitBatcher(c, slack=8, max_wait=5).commit(TABLE, DISPLAY, stage, ["all"],
                                                        [event("a")], 0)
    assert time.monotonic() - began < 1 and server.attached == [f"chload.{stage}"]


def test_slack_units_waiting_commit_while_others_still_fill() -> None:
    server = FakeServer()
    c = committer(server)
    batcher = CommitBatcher(c, slack=2, max_wait=5)
    units = [(stage_with(server, c.holder, {"all": 1}), uri) for uri in ("a", "b")]
    with batcher.filling():  # a third unit fills all along
        outcomes = _commit_on_threads(batcher, units)
    assert outcomes == {"a": True, "b": True} and server.ledger_writes == 1


def test_a_unit_waits_at_most_max_wait() -> None:
    server = FakeServer()
    c = committer(server)
    batcher = CommitBatcher(c, slack=8, max_wait=0.2)
    stage = stage_with(server, c.holder, {"all": 1})
    began = time.monotonic()
    with batcher.filling():  # another unit never ends its fill
        assert batcher.commit(TABLE, DISPLAY, stage, ["all"], [event("a")], 0)
    assert 0.2 <= time.monotonic() - began < 2


def test_an_error_of_the_group_reaches_each_unit() -> None:
    server = FakeServer()
    c = committer(server)

    def not_had(table: str, display: str) -> None:
        raise TransientError("another chload has been committing for 600 s")

    c.lock.acquire = not_had  # type: ignore[method-assign]
    units = [(stage_with(server, c.holder, {"all": 1}), uri) for uri in ("a", "b", "c")]
    outcomes = _commit_on_threads(CommitBatcher(c, slack=8), units)
    assert all(isinstance(o, TransientError) for o in outcomes.values()), outcomes
    assert server.attached == []
