"""A shard server's saturation from two readings of its counters (targets/cluster/shard_load.py)."""

from __future__ import annotations

from chload.cli.render import _shard_line
from chload.targets.cluster.shard_load import Counters, read, saturation


def counters(at: float, **events: int) -> Counters:
    return Counters(at, dict(events), {"Merge": 2, "MemoryTracking": 64 << 20})


def test_the_difference_of_two_readings_over_the_time_between_them() -> None:
    before = counters(10.0, UserTimeMicroseconds=1_000_000, OSCPUWaitMicroseconds=0)
    after = counters(12.0, UserTimeMicroseconds=2_500_000, SystemTimeMicroseconds=500_000,
                     OSCPUWaitMicroseconds=3_000_000, OSCPUVirtualTimeMicroseconds=1_000_000,
                     DiskWriteElapsedMicroseconds=200_000)
    out = saturation(before, after, cores=2)
    # a counter not listed before (system.events lists those above 0) started at 0
    assert out["cpu_s"] == 2.0 and out["cpu_util_pct"] == 50.0
    assert out["cpu_wait_pct"] == 75.0 and out["bottleneck"] == "cpu"
    assert out["disk_write_s"] == 0.2 and out["merges_running"] == 2
    assert out["memory_mb"] == 64.0


def test_counters_the_server_does_not_have_are_unknown_not_zero() -> None:
    out = saturation(counters(0.0), counters(1.0), cores=4)
    assert out["cpu_s"] is None and out["cpu_wait_pct"] is None
    assert out["bottleneck"] == "unknown"
    line = _shard_line({"shard": 2, "replica": "h:9000", "rows": 5, "seconds": 0.5,
                        "server": out})
    assert line == "shard 2 (h:9000): 5 rows, 0.50 s committing; its server's counters: not read"


def test_an_idle_server_waited_on_the_others() -> None:
    after = counters(4.0, UserTimeMicroseconds=100_000, SystemTimeMicroseconds=0,
                     OSCPUWaitMicroseconds=1_000, OSCPUVirtualTimeMicroseconds=99_000)
    out = saturation(counters(0.0), after, cores=2)
    assert out["bottleneck"] == "waiting" and out["cpu_util_pct"] == 1.25
    line = _shard_line({"shard": 1, "replica": "h:9000", "rows": 1_000, "seconds": 0.25,
                        "server": out})
    assert line == ("shard 1 (h:9000): 1,000 rows, 0.25 s committing; server CPU 0.10 s "
                    "(1% of 2 cores), waited for a CPU 1% of its run time, 2 merges "
                    "running; limit: waiting")


def test_one_query_reads_events_and_metrics() -> None:
    asked: list[str] = []

    def rows(sql: str) -> list[dict]:
        asked.append(sql)
        return [{"kind": "event", "name": "UserTimeMicroseconds", "value": 5},
                {"kind": "metric", "name": "Merge", "value": 1}]

    found = read(rows)
    assert len(asked) == 1 and "system.events" in asked[0] and "system.metrics" in asked[0]
    assert found.events == {"UserTimeMicroseconds": 5} and found.metrics == {"Merge": 1}
