"""How busy each shard's server was during a load, from the server's own counters.

The loader's saturation line (monitor.py) reads this machine's /proc and says nothing of
shard servers elsewhere, so a cluster load reads each server's counters over HTTP at the
start of the data and at its end: `system.events` differences (CPU of its query threads,
`OSCPUWaitMicroseconds` for a CPU shared with more work than cores, disk writes, merges)
and `system.metrics` at the end (merges and background tasks still running, the memory
its queries hold). docs/target-cluster.md ("Reports") shows what the user sees.

Invariant: a counter the server does not list at the end (an older version, no taskstats,
or 0: system.events lists counters above 0 only) is None, and no failure here fails a load.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

_EVENTS = ("UserTimeMicroseconds", "SystemTimeMicroseconds", "OSCPUWaitMicroseconds",
           "OSCPUVirtualTimeMicroseconds", "DiskWriteElapsedMicroseconds",
           "MergesTimeMilliseconds")
_METRICS = ("Merge", "BackgroundPoolTask", "MemoryTracking")
CPU_WAIT_LIMIT_PCT = 20.0  # waited for a CPU this share of its running time: CPU-bound
BUSY_PCT = 80.0  # CPU or disk busy this share of the load: that is its limit


@dataclass(slots=True)
class Counters:
    """One reading of a server's counters, and when it was taken."""

    at: float
    events: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, int] = field(default_factory=dict)


def read(rows: Callable[[str], list[dict]]) -> Counters:
    """The server's counters now (`rows`: its SQL, as ServerTarget.rows)."""
    names = ", ".join(f"'{n}'" for n in _EVENTS + _METRICS)
    found = rows(f"SELECT 'event' AS kind, event AS name, toInt64(value) AS value FROM "
                 f"system.events WHERE event IN ({names}) UNION ALL SELECT 'metric', metric, "
                 f"toInt64(value) FROM system.metrics WHERE metric IN ({names})")
    counters = Counters(time.monotonic())
    for row in found:
        into = counters.events if row["kind"] == "event" else counters.metrics
        into[row["name"]] = int(row["value"])
    return counters


def saturation(before: Counters, after: Counters, cores: int) -> dict:
    """What the server did between two readings, as shares of that time and its cores,
    and its limit: cpu, disk, or waiting (on the loader or the other servers)."""
    seconds = max(after.at - before.at, 1e-6)

    def spent(name: str, unit: float) -> float | None:
        if name not in after.events:  # (system.events lists counters above 0 only)
            return None
        return (after.events[name] - before.events.get(name, 0)) / unit

    user, system = spent("UserTimeMicroseconds", 1e6), spent("SystemTimeMicroseconds", 1e6)
    cpu = user + system if user is not None and system is not None else None
    wait, ran = spent("OSCPUWaitMicroseconds", 1e6), spent("OSCPUVirtualTimeMicroseconds", 1e6)
    disk = spent("DiskWriteElapsedMicroseconds", 1e6)
    cpu_pct = None if cpu is None else 100 * cpu / seconds / max(1, cores)
    wait_pct = (None if wait is None or ran is None or wait + ran <= 0
                else 100 * wait / (wait + ran))
    return {
        "seconds": round(seconds, 2),
        "cores": cores,
        "cpu_s": _round(cpu),
        "cpu_util_pct": _round(cpu_pct),
        "cpu_wait_pct": _round(wait_pct),
        "disk_write_s": _round(disk),
        "merges_s": _round(spent("MergesTimeMilliseconds", 1e3)),
        "merges_running": after.metrics.get("Merge"),
        "background_tasks": after.metrics.get("BackgroundPoolTask"),
        "memory_mb": _round(None if "MemoryTracking" not in after.metrics
                            else after.metrics["MemoryTracking"] / 2**20),
        "bottleneck": _limit(cpu, cpu_pct, wait_pct,
                             None if disk is None else 100 * disk / seconds),
    }


def _limit(cpu: float | None, cpu_pct: float | None, wait_pct: float | None,
           disk_pct: float | None) -> str:
    if (wait_pct or 0) >= CPU_WAIT_LIMIT_PCT or (cpu_pct or 0) >= BUSY_PCT:
        return "cpu"
    if (disk_pct or 0) >= BUSY_PCT:
        return "disk"
    return "unknown" if cpu is None else "waiting"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
