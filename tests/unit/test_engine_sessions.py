"""runtime/engine.py: the engine's sessions are as many as calls ran at once, not one per
thread that ever called (a follow's workers are new threads each poll)."""

from __future__ import annotations

import threading

from chload.runtime.engine import Engine


def test_threads_one_after_another_share_one_session_and_calls_at_once_get_their_own(
        ) -> None:
    engine = Engine(None)
    try:
        for _ in range(20):  # a new thread each time, never two calls at once
            thread = threading.Thread(target=lambda: engine.query("SELECT 1"))
            thread.start()
            thread.join()
        assert len(engine._sessions) == 1
        answers: list[str] = []
        inside = threading.Barrier(3)

        def read() -> None:  # three streams open at once: three sessions
            blocks = engine.stream("SELECT number FROM numbers(10)", "test")
            next(blocks)
            inside.wait(10)
            answers.append(engine.query("SELECT 2").strip())
            blocks.close()  # (stopped early: its query cancelled, its session free)

        threads = [threading.Thread(target=read) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert answers == ["2", "2", "2"]
        assert 3 <= len(engine._sessions) <= 6
        assert engine.query("SELECT 3").strip() == "3"
        assert len(engine._idle) == len(engine._sessions)  # every one given back
    finally:
        engine.close()
