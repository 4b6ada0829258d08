"""Ending loads that follow (--follow) on a signal, or from outside their thread.

A load that follows in the main thread ends on SIGINT/SIGTERM by its own handlers; one
run on another thread (a pipelines file's loads run at once: chload/pipelines) cannot
install handlers there, so it registers its stop event here, and whoever holds the
signals (the pipelines runner, in the main thread) calls `stop_following`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

_guard = threading.Lock()
_events: set[threading.Event] = set()
_stopped = [False]


@contextlib.contextmanager
def registered(stop: threading.Event) -> Iterator[None]:
    """`stop` is set by `stop_following` while the block runs (at once if it was
    called before)."""
    with _guard:
        _events.add(stop)
        if _stopped[0]:
            stop.set()
    try:
        yield
    finally:
        with _guard:
            _events.discard(stop)


def stop_following() -> None:
    """Every registered load ends after its round in flight; one registering later
    ends at once, until `reset`."""
    with _guard:
        _stopped[0] = True
        for stop in _events:
            stop.set()


def reset() -> None:
    """Loads registering from now on follow again (a new run of loads)."""
    with _guard:
        _stopped[0] = False


@contextlib.contextmanager
def on_signals(stop: Callable[[], None], *, once: bool = True) -> Iterator[None]:
    """SIGINT and SIGTERM call `stop` while the block runs, on the main thread (where
    Python runs handlers; elsewhere nothing is installed). `once`: the first signal puts
    the handlers before back, so a second acts as it would have (a second SIGINT
    interrupts). The handlers before are back after the block in any case."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, handler in before.items():
            signal.signal(s, handler)

    def handler(signum: int, frame: object) -> None:
        stop()
        if once:
            restore()

    for s in before:
        signal.signal(s, handler)
    try:
        yield
    finally:
        restore()
