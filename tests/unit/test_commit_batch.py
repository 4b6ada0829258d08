"""commit/batch.py: filled stages wait for each other and commit in one group when
`slack` wait, at once when fewer than `slack` others fill (the load's last round), or
after `max_wait`; each learns its own outcome, and an error of the group reaches every
unit of it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from test_server_commit import (  # (this directory: pytest puts it on the path)
    DISPLAY,
    TABLE,
    FakeServer,
    committer,
    event,
    stage_with,
)

from chload.commit.batch import CommitBatcher
from chload.errors import TransientError


@contextlib.contextmanager
def _others_filling(batcher: CommitBatcher, count: int) -> Iterator[None]:
    """`count` more units filling all along (files of later rounds)."""
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            stack.enter_context(batcher.filling())
        yield


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


def test_units_filled_while_later_rounds_fill_commit_as_one_group() -> None:
    server = FakeServer()
    c = committer(server)
    units = [(stage_with(server, c.holder, {"all": 1}), uri) for uri in ("a", "b", "c", "d")]
    batcher = CommitBatcher(c, slack=4, max_wait=5)
    with _others_filling(batcher, 4):
        outcomes = _commit_on_threads(batcher, units)
    assert outcomes == {"a": True, "b": True, "c": True, "d": True}
    assert server.surveys == 1 and server.ledger_writes == 1  # one lock, one log
    assert sorted(server.attached) == sorted(f"chload.{stage}" for stage, _ in units)


def test_a_unit_of_the_last_round_commits_at_once() -> None:
    server = FakeServer()
    c = committer(server)
    batcher = CommitBatcher(c, slack=4, max_wait=5)
    stage = stage_with(server, c.holder, {"all": 1})
    began = time.monotonic()
    with _others_filling(batcher, 3):  # fewer than slack: the last round
        assert batcher.commit(TABLE, DISPLAY, stage, ["all"], [event("a")], 0)
    assert time.monotonic() - began < 1 and server.attached == [f"chload.{stage}"]


def test_a_unit_waits_at_most_max_wait() -> None:
    server = FakeServer()
    c = committer(server)
    batcher = CommitBatcher(c, slack=2, max_wait=0.2)
    stage = stage_with(server, c.holder, {"all": 1})
    began = time.monotonic()
    with _others_filling(batcher, 4):  # their fills never end
        assert batcher.commit(TABLE, DISPLAY, stage, ["all"], [event("a")], 0)
    assert 0.2 <= time.monotonic() - began < 2


def test_an_error_of_the_group_reaches_each_unit() -> None:
    server = FakeServer()
    c = committer(server)

    def not_had(table: str, display: str) -> None:
        raise TransientError("another chload has been committing for 600 s")

    c.lock.acquire = not_had  # type: ignore[method-assign]
    units = [(stage_with(server, c.holder, {"all": 1}), uri) for uri in ("a", "b", "c")]
    batcher = CommitBatcher(c, slack=3, max_wait=5)
    with _others_filling(batcher, 3):
        outcomes = _commit_on_threads(batcher, units)
    assert all(isinstance(o, TransientError) for o in outcomes.values()), outcomes
    assert server.attached == []
