"""The server watch ends with the target: a look still under way when the process
exited printed a daemon thread's traceback (seen once in the suite)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from chload.runtime.adaptive import Controller
from chload.targets.server.stages import ServerWatch


def test_stop_ends_the_watch_and_waits_for_its_last_look() -> None:
    looking, release = threading.Event(), threading.Event()

    def rows(sql: str) -> list[dict]:  # the server's answer, held until released
        looking.set()
        release.wait(5)
        return [{"delayed": 0, "delay_at": 0, "parts": 0}]

    server = SimpleNamespace(loading={"default.t"}, rows=rows)
    watch = ServerWatch(server, Controller(4))  # type: ignore[arg-type]
    watch.start()
    assert looking.wait(5)  # a look under way
    threading.Timer(0.2, release.set).start()
    watch.stop()  # waits for that look, then the thread is gone
    assert release.is_set() and not watch._thread.is_alive()
