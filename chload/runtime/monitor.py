"""Saturation during a load, from /proc: CPU, disk, network, and which one was the limit.

A throughput figure without its saturation is half a figure: the same rows/s at full CPU,
at a busy disk or at neither call for different fixes. So every load report carries
machine-wide CPU (`/proc/stat`) and this process's own (`getrusage`: the engine runs in
process), the target directory's disk util % and await (`io_ticks`, as iostat), and
network bytes (`/proc/net/dev`), for remote sources and server targets.

Invariants: two snapshots (start, end) and nothing running in the background; where
/proc cannot tell (another OS, a device not listed) a figure is None, never 0.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(slots=True)
class Saturation:
    cpu_util_pct: float | None = None  # machine CPU busy, % of all cores
    process_cpu_s: float | None = None  # this process's user + system seconds
    cores: int = 1
    disk: str | None = None
    disk_util_pct: float | None = None
    disk_await_ms: float | None = None
    net_rx_mb: float | None = None
    net_tx_mb: float | None = None
    bottleneck: str = "unknown"  # cpu, disk, or waiting (on the source or target)

    def to_dict(self) -> dict:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class _Snapshot:
    at: float
    cpu: tuple[int, int] | None  # busy, total jiffies
    disk: tuple[int, int, int] | None  # io_ticks ms, ios, io ms
    net: tuple[int, int] | None  # rx, tx bytes
    self_cpu: float


class Monitor:
    """`start()` before a load, `stop()` after: the averages in between."""

    def __init__(self, path: str) -> None:
        self._device = device_of(path)
        self._first: _Snapshot | None = None

    def start(self) -> Monitor:
        self._first = self._snapshot()
        return self

    def stop(self) -> Saturation:
        first, last = self._first, self._snapshot()
        cores = os.cpu_count() or 1
        result = Saturation(cores=cores, disk=self._device)
        if first is None:
            return result
        seconds = max(last.at - first.at, 1e-6)
        result.process_cpu_s = last.self_cpu - first.self_cpu
        if first.cpu and last.cpu and last.cpu[1] > first.cpu[1]:
            busy, total = (b - a for a, b in zip(first.cpu, last.cpu, strict=True))
            result.cpu_util_pct = 100.0 * busy / total
        if first.disk and last.disk:
            ticks, ios, io_ms = (b - a for a, b in zip(first.disk, last.disk, strict=True))
            result.disk_util_pct = min(100.0, 100.0 * ticks / (seconds * 1000))
            result.disk_await_ms = io_ms / ios if ios else 0.0
        if first.net and last.net:
            result.net_rx_mb = (last.net[0] - first.net[0]) / 1e6
            result.net_tx_mb = (last.net[1] - first.net[1]) / 1e6
        result.bottleneck = _diagnose(result)
        return result

    def _snapshot(self) -> _Snapshot:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        disk = disk_counters(self._device)
        return _Snapshot(time.monotonic(), cpu_jiffies(), disk[:3] if disk else None, _net(),
                         usage.ru_utime + usage.ru_stime)


def _diagnose(s: Saturation) -> str:
    # Machine-wide CPU: start-up, probes and commits leave a core idle now and then, so
    # a load that keeps the cores 70% busy is limited by them.
    if s.cpu_util_pct is not None and s.cpu_util_pct >= 70:
        return "cpu"
    if s.disk_util_pct is not None and s.disk_util_pct >= 80:
        return "disk"
    if s.cpu_util_pct is None:
        return "unknown"
    return "waiting (source or target latency, or too few workers)"


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs together."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def device_of(path: str) -> str | None:
    """The whole block device (not the partition) that holds `path`, or the busiest
    disk when the file system is not on a block device (overlay, tmpfs)."""
    try:
        dev = os.stat(path if os.path.exists(path) else os.path.dirname(path) or ".").st_dev
    except OSError:
        return None
    link = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    if os.path.exists(link):
        real = os.path.realpath(link)
        if os.path.exists(os.path.join(real, "partition")):
            real = os.path.dirname(real)
        return os.path.basename(real)
    return _busiest_disk()


def _busiest_disk() -> str | None:
    best, best_ticks = None, -1
    try:
        with open("/proc/diskstats") as fh:
            for line in fh:
                cols = line.split()
                name = cols[2]
                if name.startswith(("loop", "ram", "zram", "dm-")) or \
                        not os.path.exists(f"/sys/block/{name}"):
                    continue
                if int(cols[12]) > best_ticks:
                    best, best_ticks = name, int(cols[12])
    except (OSError, ValueError, IndexError):
        return None
    return best


def disk_counters(device: str | None) -> tuple[int, int, int, int, int] | None:
    """(io_ticks ms, ios, io ms, sectors read, sectors written) of `device`."""
    if device is None:
        return None
    try:
        with open("/proc/diskstats") as fh:
            for line in fh:
                cols = line.split()
                if cols[2] == device:
                    v = [int(c) for c in cols[3:14]]
                    return v[9], v[0] + v[4], v[3] + v[7], v[2], v[6]
    except (OSError, ValueError, IndexError):
        return None
    return None


def _net() -> tuple[int, int] | None:
    try:
        with open("/proc/net/dev") as fh:
            rows = [line.split(":", 1)[1].split() for line in fh if ":" in line]
    except (OSError, IndexError):
        return None
    return sum(int(r[0]) for r in rows), sum(int(r[8]) for r in rows)


def process_started() -> float:
    """When this process started (time.time() scale; to 10 ms): /proc/self/stat's start
    in clock ticks since boot, against the boot clock now."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - age


class CallStats:
    """What a target's calls cost, for its cost report: how many (a server's requests,
    an engine's queries) and their seconds summed over threads, data calls (a load's
    INSERT with its rows) apart."""

    def __init__(self) -> None:
        self.calls = self.data_calls = 0
        self.seconds = self.data_seconds = 0.0
        self.last_data_at: float | None = None  # time.time() when the last data call ended
        self._guard = threading.Lock()

    def add(self, seconds: float, data: bool) -> None:
        with self._guard:
            self.calls += 1
            self.seconds += seconds
            if data:
                self.data_calls += 1
                self.data_seconds += seconds
                self.last_data_at = time.time()

    def others(self) -> tuple[int, float]:
        """(calls, seconds) of the calls other than data so far."""
        with self._guard:
            return self.calls - self.data_calls, self.seconds - self.data_seconds


def unit_costs(stats: CallStats, setup: tuple[int, float] | None, units: Sequence[int],
               first_data_at: float | None, data_calls: int,
               last_data_at: float | None = None) -> dict:
    """A load's fixed and per-unit costs (LoadReport.costs), either target's: seconds
    from the process's start to the first data call (`first_data_at`, time.time());
    seconds from then to the end of the last one (`last_data_at`, else the calls' own
    record: `data_s`, the span in which rows move; what a run takes beyond it, start
    and commit tail, is its fixed cost);
    calls before it (`setup`: probe, ledger, planning; None: none began); and per
    committed unit (`units`: stages, files; a stage is one file or a batch), the calls
    other than data (stage create, seal, lock, survey, ledger, attach, drop, `loaded`
    events) and their seconds, summed over threads."""
    calls, seconds = stats.others()
    setup = setup or (calls, seconds)
    count, files = units
    last_data_at = last_data_at or stats.last_data_at
    return {
        "first_byte_s": round(first_data_at - process_started(), 3) if first_data_at else None,
        "data_s": (round(last_data_at - first_data_at, 3)
                   if first_data_at and last_data_at else None),
        "setup_requests": setup[0],
        "units": count, "files": files,
        "commit_requests_per_unit": round((calls - setup[0]) / count, 2) if count else None,
        "commit_seconds_per_unit": round((seconds - setup[1]) / count, 4) if count else None,
        "data_requests": data_calls,
    }
