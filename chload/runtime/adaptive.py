"""Adaptive concurrency: how many data requests a load into a server runs at once,
adjusted while it loads from what is measured (`--workers auto`, the default).

The `Controller` starts at the planner's estimate (`stages.streams_for`) and moves the
limit by additive increase and multiplicative decrease: up by one when a window of
requests kept latency per byte near its baseline (an EWMA) with every slot in use; down
on latency well above the baseline that buys no throughput, on the server's backpressure
(code 252, `DelayedInserts`, parts near `parts_to_delay_insert`) and on the loader host's
pressure (PSI). docs/adaptive.md gives the rules and thresholds and why.

Invariants: bounds 1 .. `maximum`; every change is kept with its time and reason
(`changes`) and `bound` names what held the limit last; no I/O here but reading /proc
(`read_pressure`), so tests script the measurements.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_STREAMS = 16
HOLDS = 1.25  # latency within 25% of the baseline: more streams are welcome
RISES = 1.5  # latency 50% over the baseline: too many, unless throughput grew
GAIN = 1.05  # throughput must beat the limit below by 5% to justify the latency
EWMA = 0.3  # weight of a new window in the baseline
IO_FULL = 0.3  # share of the time every task stalled on I/O
CPU_SOME = 0.9  # share of the time some task waited for a CPU ...
OWN_CPU = 0.5  # ... while the loader itself used this many cores


@dataclass(frozen=True, slots=True)
class Change:
    """One change of the limit: when (seconds into the load), from, to, and why."""

    at: float
    old: int
    new: int
    reason: str

    def to_dict(self) -> dict:
        return {"at_s": round(self.at, 2), "from": self.old, "to": self.new,
                "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Pressure:
    """Shares of an interval (0..1) from PSI, and the loader's own CPU in cores."""

    cpu_some: float = 0.0
    io_full: float = 0.0
    own_cpu: float = 0.0


class Controller:
    """The limit on requests in flight, fed with measurements; thread-safe."""

    def __init__(self, start: int, maximum: int = MAX_STREAMS, *,
                 clock: Callable[[], float] = time.monotonic, fixed: bool = False) -> None:
        self.maximum = max(1, min(maximum, MAX_STREAMS))
        self.limit = self.start = self._clamp(start)
        self.fixed, self._clock = fixed, clock
        self._began = self._since = clock()
        self._lock = threading.Lock()
        self._window: list[tuple[float, int]] = []  # (seconds, bytes) begun since _since
        self._full = False  # every slot was in use at some moment of the window
        self._baseline: float | None = None
        self._rates: dict[int, float] = {}  # bytes/s last measured at each limit
        self._pressed = False  # the server pushed back and has not been seen relieved
        self.changes: list[Change] = []
        self.bound = "fixed: --workers" if fixed else "the estimate held"
        self.lowest = self.highest = self.limit
        self.finished = threading.Event()  # the load is over: watchers stop

    def freeze(self, why: str) -> None:
        """Keep the limit where it is (a target that does not adapt, and says why)."""
        with self._lock:
            self.fixed, self.bound, self.maximum = True, why, self.limit

    def bounded(self, maximum: int) -> None:
        """The target's bound (its cores), known once it is open; given before the load
        starts, so the limit and its start are clamped to it with no change recorded."""
        with self._lock:
            self.maximum = max(1, min(maximum, MAX_STREAMS))
            self.limit = self.start = self.lowest = self.highest = self._clamp(self.limit)

    def in_use(self, busy: int) -> None:
        """Requests in flight now (a stream begins one): the limit was reached or not."""
        if busy >= self.limit:
            self._full = True

    def request_done(self, began: float, seconds: float, size: int) -> None:
        """A data request ended after `seconds`, having sent `size` bytes (0: unknown)."""
        with self._lock:
            if self.fixed or began < self._since:
                return  # begun under another limit: says nothing of this one
            self._window.append((seconds, max(size, 1)))
            if len(self._window) >= max(2, self.limit):
                self._judge_window()

    def backpressure(self, reason: str, severe: bool = False) -> None:
        """The server pushed back (252 too many parts: severe; delayed inserts, parts
        near parts_to_delay_insert): fewer requests, at once, once per window."""
        reason = f"server backpressure: {reason}"
        with self._lock:
            self._pressed = True
            if self.fixed or (self.bound == reason and not self._window):
                return  # the last cut had this reason and no request has ended since
            self._change(self.limit // 2 if severe else _lower(self.limit), reason)

    def relieved(self) -> None:
        """The server's watch found no backpressure: increases are welcome again."""
        with self._lock:
            self._pressed = False

    def host(self, pressure: Pressure) -> None:
        """The loader host's pressure over the last interval (read_pressure)."""
        with self._lock:
            if self.fixed or not self._window:  # at most one cut per window
                return
            if pressure.io_full >= IO_FULL:
                self._change(_lower(self.limit), f"loader host I/O pressure: every task "
                             f"stalled {pressure.io_full:.0%} of the time (PSI io full)")
            elif pressure.cpu_some >= CPU_SOME and pressure.own_cpu >= OWN_CPU:
                self._change(_lower(self.limit), f"loader host CPU pressure "
                             f"{pressure.cpu_some:.0%} (PSI cpu some), the loader using "
                             f"{pressure.own_cpu:.1f} cores")

    def summary(self) -> dict:
        """For the report and the run's record: mode, start, end, range, bound, changes."""
        with self._lock:
            return {"mode": "fixed" if self.fixed else "auto", "start": self.start,
                    "final": self.limit, "lowest": self.lowest, "highest": self.highest,
                    "maximum": self.maximum, "bound": self.bound,
                    "changes": [c.to_dict() for c in self.changes]}

    def _judge_window(self) -> None:
        """Latency (seconds per byte of a request) against the baseline; throughput as
        Little's law has it: `limit` streams each moving a byte per `latency`."""
        latency = sum(s for s, _ in self._window) / sum(b for _, b in self._window)
        rate = self._rates[self.limit] = self.limit / latency
        baseline = latency if self._baseline is None else self._baseline
        self._baseline = baseline + EWMA * (latency - baseline)
        ratio, below = latency / baseline, self._rates.get(self.limit - 1)
        if ratio >= RISES and (below is None or rate < below * GAIN):
            than = "unmeasured with fewer" if below is None else f"{_per_s(below)} with fewer"
            self._change(_lower(self.limit), f"latency {ratio:.1f}x the baseline, throughput "
                         f"{_per_s(rate)} ({than})")
        elif ratio <= HOLDS and self._full and self.limit < self.maximum and not self._pressed:
            self._change(self.limit + 1, f"latency {ratio:.2f}x the baseline with every "
                         f"stream busy, throughput {_per_s(rate)}")
        else:
            if not self._pressed:  # else the bound stays the server's backpressure
                self.bound = ("maximum" if self.limit >= self.maximum and ratio <= HOLDS else
                              f"latency {ratio:.1f}x the baseline" if ratio > HOLDS else
                              "idle streams (fewer files than streams)")
            self._restart()

    def _change(self, new: int, reason: str) -> None:
        new = self._clamp(new)
        if new != self.limit:
            self.changes.append(Change(self._clock() - self._began, self.limit, new, reason))
            self.limit = new
            self.lowest, self.highest = min(self.lowest, new), max(self.highest, new)
        self.bound = reason
        self._restart()

    def _restart(self) -> None:
        self._since, self._window, self._full = self._clock(), [], False

    def _clamp(self, limit: int) -> int:
        return max(1, min(limit, self.maximum))


def _lower(limit: int) -> int:
    """x0.75, at least one less."""
    return min(limit - 1, int(limit * 0.75))


def _per_s(rate: float) -> str:
    return f"{rate / 1e6:.1f} MB/s"


class PressureReader:
    """PSI shares and the loader's CPU between two calls (None where /proc lacks PSI)."""

    def __init__(self, root: str = "/proc") -> None:
        self._root = root
        self._last = self._read()

    def __call__(self) -> Pressure | None:
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        span = max(now[0] - last[0], 1e-6)
        return Pressure(cpu_some=min(1.0, (now[1] - last[1]) / 1e6 / span),
                        io_full=min(1.0, (now[2] - last[2]) / 1e6 / span),
                        own_cpu=(now[3] - last[3]) / span)

    def _read(self) -> tuple[float, int, int, float] | None:
        cpu = _psi_total(f"{self._root}/pressure/cpu", "some")
        io = _psi_total(f"{self._root}/pressure/io", "full")
        if cpu is None or io is None:
            return None
        times = _own_cpu()
        return time.monotonic(), cpu, io, times


def _psi_total(path: str, kind: str) -> int | None:
    """The `total=` microseconds of one line (`some` or `full`) of a PSI file."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(kind):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _own_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
