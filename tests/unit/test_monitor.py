"""The saturation monitor reads real /proc figures and names the limit."""

from __future__ import annotations

import hashlib

from chload.runtime.monitor import Monitor, Saturation, _diagnose


def test_monitor_measures_cpu_of_real_work(tmp_path: object) -> None:
    monitor = Monitor(str(tmp_path)).start()
    data = b"x" * (1 << 20)
    for _ in range(300):  # burn some CPU in this process
        data = hashlib.sha256(data).digest() * (1 << 15)
    result = monitor.stop()
    assert result.process_cpu_s is not None and result.process_cpu_s > 0
    assert result.cpu_util_pct is not None and 0 < result.cpu_util_pct <= 100
    assert result.cores >= 1 and result.bottleneck in {"cpu", "disk"} | {
        "waiting (source or target latency, or too few workers)"}


def test_diagnosis() -> None:
    assert _diagnose(Saturation(cpu_util_pct=97, disk_util_pct=10)) == "cpu"
    assert _diagnose(Saturation(cpu_util_pct=40, disk_util_pct=92)) == "disk"
    assert _diagnose(Saturation(cpu_util_pct=30, disk_util_pct=20)).startswith("waiting")
    assert _diagnose(Saturation()) == "unknown"
