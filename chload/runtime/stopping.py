"""Ending loads that follow (a Kafka topic's --follow) from outside their thread.

A load that follows in the main thread ends on SIGINT/SIGTERM by its own handlers; one
run on another thread (a pipelines file's loads run at once: chload/pipelines) cannot
install handlers there, so it registers its stop event here, and whoever holds the
signals (the pipelines runner, in the main thread) calls `stop_following`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

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
