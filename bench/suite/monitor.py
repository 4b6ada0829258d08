"""CPU and disk use during one benchmark run, read from /proc (a preview of the load
report's saturation monitor).

A figure without its saturation is half a figure: 2M rows/s at 100% CPU says "buy
cores", at 30% CPU and 95% disk util says "buy disks", at 30% of both says "the method
waits on itself". So every run is bracketed by snapshots of

- `/proc/stat`: machine-wide CPU jiffies (busy = all but idle and iowait), averaged
  over the run, plus the busiest sampling interval (a thread samples every 0.25 s);
- `/proc/diskstats`: for the block device holding the work directory, `io_ticks`
  (time with I/O in flight -> util %, as iostat's %util) and the time spent on reads
  and writes divided by their count (-> await ms, as iostat's r_await/w_await);
- `/proc/<pid>/stat` of the server, when there is one (its CPU seconds);
- `getrusage(RUSAGE_CHILDREN)`: CPU seconds of the method's whole process tree (every
  descendant is waited for by its parent, so its time is counted).

The machine is shared, so machine-wide CPU includes neighbours; the process-tree and
server CPU seconds do not.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass

from chload.runtime.monitor import cpu_jiffies, disk_counters

TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Usage:
    """What one run used; fields are None where /proc could not tell."""

    cpu_util_pct: float | None = None  # machine CPU busy, % of all cores, run average
    cpu_peak_pct: float | None = None  # busiest 0.25 s interval
    process_cpu_s: float | None = None  # user+system seconds of the method's processes
    server_cpu_s: float | None = None  # user+system seconds of the ClickHouse server
    disk: str | None = None  # block device name
    disk_util_pct: float | None = None
    disk_await_ms: float | None = None
    disk_read_mb: float | None = None
    disk_write_mb: float | None = None


def _proc_cpu(pid: int | None) -> float | None:
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as fh:
            after_name = fh.read().rsplit(")", 1)[1].split()
        return (int(after_name[11]) + int(after_name[12])) / TICK  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Monitor:
    """Brackets one run: `start()`, then `stop()` returns its Usage."""

    def __init__(self, device: str | None, server_pid: int | None = None,
                 interval: float = 0.25) -> None:
        self.device, self.server_pid, self.interval = device, server_pid, interval
        self._stop = threading.Event()
        self._peak = 0.0
        self._thread: threading.Thread | None = None

    def start(self) -> Monitor:
        self._t0 = time.monotonic()
        self._cpu0, self._disk0 = cpu_jiffies(), disk_counters(self.device)
        self._server0, self._children0 = _proc_cpu(self.server_pid), _children_cpu()
        self._peak = 0.0
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        last = cpu_jiffies()
        while not self._stop.wait(self.interval):
            now = cpu_jiffies()
            if last and now and now[1] > last[1]:
                self._peak = max(self._peak, 100 * (now[0] - last[0]) / (now[1] - last[1]))
            last = now

    def stop(self) -> Usage:
        self._stop.set()
        if self._thread:
            self._thread.join()
        elapsed_ms = (time.monotonic() - self._t0) * 1000
        usage = Usage(process_cpu_s=round(_children_cpu() - self._children0, 3),
                      cpu_peak_pct=round(self._peak, 1) if self._peak else None)
        cpu1 = cpu_jiffies()
        if self._cpu0 and cpu1 and cpu1[1] > self._cpu0[1]:
            busy, total = cpu1[0] - self._cpu0[0], cpu1[1] - self._cpu0[1]
            usage.cpu_util_pct = round(100 * busy / total, 1)
        server1 = _proc_cpu(self.server_pid)
        if server1 is not None and self._server0 is not None:
            usage.server_cpu_s = round(server1 - self._server0, 3)
        disk1 = disk_counters(self.device)
        if self._disk0 and disk1 and elapsed_ms > 0:
            ticks, ios, io_ms, rd, wr = (b - a for a, b in zip(self._disk0, disk1, strict=True))
            usage.disk = self.device
            usage.disk_util_pct = round(min(100.0, 100 * ticks / elapsed_ms), 1)
            usage.disk_await_ms = round(io_ms / ios, 2) if ios else 0.0
            usage.disk_read_mb = round(rd * 512 / 1e6, 1)
            usage.disk_write_mb = round(wr * 512 / 1e6, 1)
        return usage
