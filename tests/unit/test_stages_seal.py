"""seal(): a stage merged to one part per partition, waiting out 18.16's refusal of an
OPTIMIZE whose parts a background merge holds (code 388)."""

from __future__ import annotations

import time

import pytest

from chload.errors import EngineError, TransientError
from chload.targets.server import stages


class FakeServer:
    """rows() answers the stage's parts; client.post plays OPTIMIZE from a script."""

    where = "server 127.0.0.1:8123"

    def __init__(self, script: list[str]) -> None:
        self.script = script  # per OPTIMIZE: "busy" (code 388), "fail" (code 62), "merge"
        self.parts = 3
        self.optimizes = 0
        self.client = self

    def rows(self, sql: str) -> list[dict]:
        return [{"partition_id": "all", "parts": self.parts, "rows": 300}]

    def post(self, sql: str, context: str, params: dict) -> None:
        assert params == {"optimize_throw_if_noop": "1"}
        step = self.script[self.optimizes]
        self.optimizes += 1
        if step == "busy":
            raise EngineError(context=context, reason="Can't OPTIMIZE by some reason",
                              code=388)
        if step == "fail":
            raise EngineError(context=context, reason="Syntax error", code=62)
        self.parts = 1


def test_a_busy_merge_is_waited_out_then_sealed() -> None:
    server, waits = FakeServer(["busy", "busy", "merge"]), []
    assert stages.seal(server, "stage_x", sleep=waits.append) == (300, ["all"])  # type: ignore[arg-type]
    assert server.optimizes == 3
    assert waits == [0.05, 0.1]  # the policy's pauses, only while refused


def test_another_error_is_not_waited_for() -> None:
    server = FakeServer(["fail"])
    with pytest.raises(EngineError):
        stages.seal(server, "stage_x", sleep=lambda _s: None)  # type: ignore[arg-type]


def test_a_merge_that_never_ends_is_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused until the wait runs out (0.05 s here): a TransientError, after asking."""
    monkeypatch.setattr(stages, "SEAL_WAIT_S", 0.05)
    server = FakeServer(["busy"] * 1_000_000)
    with pytest.raises(TransientError, match="still being merged"):
        stages.seal(server, "stage_x", sleep=lambda _s: time.sleep(0.001))  # type: ignore[arg-type]
    assert server.optimizes >= 2  # it asked, waited and asked again before giving up
