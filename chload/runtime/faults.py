"""Crash points for the exactly-once tests: `CHLOAD_CRASH_AT=name[:n]` makes the process
SIGKILL itself the n-th time (default 1st) it passes the named point.

Random-delay kills rarely land in the millisecond windows that matter most (between
the ledger's `committing` event and the attach, and between the attach and `loaded`),
so the tests also aim at them exactly. Unset, this costs one dict lookup.

`CHLOAD_PAUSE_AT=name:seconds` makes every pass of the named point wait that long
instead: a test of two loads at once uses it to have both plan before either commits.
"""

from __future__ import annotations

import os
import threading

_counts: dict[str, int] = {}
_lock = threading.Lock()


def crash_point(name: str) -> None:
    pause = os.environ.get("CHLOAD_PAUSE_AT")
    if pause and pause.partition(":")[0] == name:
        import time

        time.sleep(float(pause.partition(":")[2] or 1))
    spec = os.environ.get("CHLOAD_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        if _counts[name] >= int(nth or 1):
            import signal  # only here: every start would pay for it

            os.kill(os.getpid(), signal.SIGKILL)
