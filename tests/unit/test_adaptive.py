"""The stream controller (chload/runtime/adaptive.py) fed scripted measurements, the streams
that obey it (stages.Streams), and 252 "too many parts" as a wait, never a failure
(runner.patiently). No engine, no server: a scripted clock."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fake_target import FakeTarget
from test_fake_target import _files, _spec

from chload import dispatch
from chload.core import run as runner
from chload.errors import TransientError, backpressure, server_error
from chload.runtime.adaptive import MAX_STREAMS, Controller, Pressure, PressureReader
from chload.runtime.retry import RetryPolicy
from chload.targets.base import Loaded, LoadJob
from chload.targets.server.stages import Streams, most_streams


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _window(c: Controller, clock: Clock, seconds: float, size: int = 1_000_000,
            full: bool = True) -> None:
    """One window of requests begun now, each `seconds` long for `size` bytes."""
    began = clock.now
    if full:
        c.in_use(c.limit)
    clock.now += seconds
    for _ in range(max(2, c.limit)):
        c.request_done(began, seconds, size)


def test_increases_by_one_while_latency_holds_and_every_stream_is_busy() -> None:
    clock = Clock()
    c = Controller(2, 8, clock=clock)
    _window(c, clock, 1.0)
    assert c.limit == 3
    _window(c, clock, 1.1)  # within 25% of the baseline
    assert c.limit == 4
    assert [(x.old, x.new) for x in c.changes] == [(2, 3), (3, 4)]
    assert "every stream busy" in c.changes[-1].reason


def test_holds_when_streams_sit_idle() -> None:
    clock = Clock()
    c = Controller(4, 8, clock=clock)
    _window(c, clock, 1.0, full=False)
    assert c.limit == 4 and not c.changes
    assert "idle streams" in c.summary()["bound"]


def test_decreases_multiplicatively_when_latency_rises_without_more_throughput() -> None:
    clock = Clock()
    c = Controller(8, 8, clock=clock)
    _window(c, clock, 1.0)  # baseline, at the maximum: held
    assert c.limit == 8 and c.summary()["bound"] == "maximum"
    _window(c, clock, 2.0)
    assert c.limit == 6  # x0.75
    assert "latency 2.0x the baseline" in c.changes[-1].reason


def test_latency_that_buys_throughput_is_kept() -> None:
    """At 2 streams latency 1.6x the baseline, but 2 / 1.6 > 1 / 1: more bytes per
    second than with one stream fewer, so the limit holds."""
    clock = Clock()
    c = Controller(1, 2, clock=clock)
    _window(c, clock, 1.0)
    assert c.limit == 2
    _window(c, clock, 1.6)
    assert c.limit == 2 and c.summary()["bound"].startswith("latency 1.6x")


def test_requests_begun_under_another_limit_say_nothing() -> None:
    clock = Clock()
    c = Controller(2, 8, clock=clock)
    old = clock.now
    _window(c, clock, 1.0)
    assert c.limit == 3
    for _ in range(5):  # begun before the change, ending slowly: ignored
        c.request_done(old, 9.0, 1_000_000)
    assert c.limit == 3


def test_too_many_parts_halves_once_per_window() -> None:
    clock = Clock()
    c = Controller(8, 8, clock=clock)
    c.backpressure("too many parts (code 252)", severe=True)
    assert c.limit == 4
    c.backpressure("too many parts (code 252)", severe=True)  # same cause, nothing ended
    assert c.limit == 4
    c.backpressure("3 inserts delayed (DelayedInserts)")
    assert c.limit == 3
    assert c.summary()["bound"] == "server backpressure: 3 inserts delayed (DelayedInserts)"


def test_no_increase_under_backpressure_until_the_server_is_seen_relieved() -> None:
    """A table near parts_to_delay_insert stays near it while the load adds parts: a
    window of steady latency must not raise the limit back into the pressure."""
    clock = Clock()
    c = Controller(5, 8, clock=clock)
    c.backpressure("125 parts in a partition, parts_to_delay_insert 150")
    assert c.limit == 3
    _window(c, clock, 1.0)
    _window(c, clock, 1.0)
    assert c.limit == 3 and "parts_to_delay_insert" in c.summary()["bound"]
    c.relieved()
    _window(c, clock, 1.0)
    assert c.limit == 4 and "every stream busy" in c.changes[-1].reason


def test_host_pressure_io_and_the_loaders_own_cpu() -> None:
    clock = Clock()
    c = Controller(8, 8, clock=clock)
    c.request_done(clock.now, 1.0, 1)  # a request ended since the last change
    c.host(Pressure(cpu_some=1.0, io_full=0.0, own_cpu=0.1))  # CPU others take: held
    assert c.limit == 8
    c.host(Pressure(io_full=0.5))
    assert c.limit == 6 and "PSI io full" in c.changes[-1].reason
    c.host(Pressure(io_full=0.5))  # no request ended since: one cut per window
    assert c.limit == 6
    c.request_done(clock.now, 1.0, 1)
    c.host(Pressure(cpu_some=0.95, own_cpu=1.2))
    assert c.limit == 4 and "PSI cpu some" in c.changes[-1].reason


def test_bounds_one_to_the_maximum() -> None:
    clock = Clock()
    c = Controller(40, clock=clock)
    assert c.limit == MAX_STREAMS
    c.bounded(most_streams(2))
    assert c.limit == 8 and c.maximum == 8
    _window(c, clock, 1.0)  # the baseline, at the maximum: held there
    assert c.limit == 8
    for i in range(10):
        c.backpressure(f"cut {i}", severe=True)
    assert c.limit == 1
    _window(c, clock, 5.0)  # latency up 5x at the floor: stays 1
    assert c.limit == 1 and c.lowest == 1 and c.highest == 8 and c.start == 8


def test_fixed_never_moves() -> None:
    clock = Clock()
    c = Controller(3, 3, clock=clock, fixed=True)
    c.backpressure("too many parts (code 252)", severe=True)
    c.host(Pressure(io_full=1.0))
    _window(c, clock, 1.0)
    assert c.limit == 3 and c.summary()["mode"] == "fixed" and not c.changes


def test_pressure_read_from_proc(tmp_path: Path) -> None:
    (tmp_path / "pressure").mkdir()

    def write(cpu: int, io: int) -> None:
        (tmp_path / "pressure" / "cpu").write_text(
            f"some avg10=1.00 avg60=0.00 avg300=0.00 total={cpu}\n")
        (tmp_path / "pressure" / "io").write_text(
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
            f"full avg10=0.00 avg60=0.00 avg300=0.00 total={io}\n")

    write(0, 0)
    read = PressureReader(str(tmp_path))
    time.sleep(0.05)
    write(10_000_000, 10_000_000)  # 10 s of stall in a 50 ms interval: capped at 1
    p = read()
    assert p is not None and p.cpu_some == 1.0 and p.io_full == 1.0
    assert PressureReader(str(tmp_path / "none"))() is None


def test_streams_obey_a_limit_that_moves() -> None:
    c = Controller(2, 8)
    streams = Streams(c.limit, c)
    busy, most, guard = [0], [0], threading.Lock()

    def request() -> None:
        with streams.data() as sent:
            sent.bytes = 100
            with guard:
                busy[0] += 1
                most[0] = max(most[0], busy[0])
            time.sleep(0.02)
            with guard:
                busy[0] -= 1

    threads = [threading.Thread(target=request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] <= c.highest and c.highest >= 3  # it grew, and never ran past it


def test_a_252_inside_a_request_is_backpressure_and_raised() -> None:
    c = Controller(8, 8)
    streams = Streams(c.limit, c)
    error = TransientError(context="f.csv", reason="Too many parts (300)", code=252)
    assert backpressure(error)
    with pytest.raises(TransientError), streams.data():
        raise error
    assert c.limit == 4 and "252" in c.summary()["bound"]


def test_too_many_partitions_is_252_but_terminal() -> None:
    """Same code, but the data's PARTITION BY against max_partitions_per_insert_block:
    no wait cures it, so it fails the file at once instead of waiting half an hour."""
    parts = server_error(500, "Code: 252, e.displayText() = DB::Exception: Too many parts "
                         "(300). Merges are processing significantly slower than inserts",
                         "f.csv")
    partitions = server_error(500, "Code: 252, e.displayText() = DB::Exception: Too many "
                              "partitions for single INSERT block (more than 100).", "f.csv")
    assert backpressure(parts) and isinstance(parts, TransientError)
    assert not backpressure(partitions) and not isinstance(partitions, TransientError)


def test_patiently_waits_out_252_beyond_the_tries() -> None:
    waits: list[float] = []
    left = [12]

    def load() -> str:
        if left[0]:
            left[0] -= 1
            raise TransientError(context="f", reason="Too many parts", code=252)
        return "loaded"

    policy = RetryPolicy(attempts=3, base_seconds=0.01)
    assert runner.patiently(load, policy, waits.append) == "loaded"
    assert len(waits) >= 12 - 3  # more waits than the policy's tries

    def other() -> str:
        raise TransientError(context="f", reason="connection reset")

    with pytest.raises(TransientError):
        runner.patiently(other, policy, waits.append)
    left[0] = 99
    with pytest.raises(TransientError):  # patience spent: it fails as any transient
        runner.patiently(load, policy, waits.append, patience=0.0)


class PushesBack(FakeTarget):
    """Each file's first 6 loads answer 252, more than the runner's 5 tries."""

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        self.refusals: dict[str, int] = {}

    def load_file(self, job: LoadJob, progress: object) -> Loaded:  # type: ignore[override]
        with self._guard:
            n = self.refusals[job.file.uri] = self.refusals.get(job.file.uri, 0) + 1
        if n <= 6:
            raise TransientError(context=job.file.uri, reason="Too many parts", code=252)
        return super().load_file(job, progress)  # type: ignore[arg-type]


def test_a_load_never_fails_on_too_many_parts(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: None)
    files = _files(tmp_path, 3, 4)
    target = PushesBack(str(tmp_path))
    report = dispatch.load_into(_spec(tmp_path), target)
    assert report.ok and report.rows_loaded == 7 and len(files) == report.files_loaded
    assert report.concurrency["mode"] == "auto"
    fixed = dispatch.load_into(_spec(tmp_path, workers=3, force=True), PushesBack(str(tmp_path)))
    assert fixed.concurrency["mode"] == "fixed" and fixed.concurrency["final"] == 3


def test_the_summary_and_history_name_the_streams_and_their_bound() -> None:
    from chload.cli import render

    clock = Clock()
    c = Controller(8, 8, clock=clock)
    c.backpressure("140 parts in a partition, parts_to_delay_insert 150")
    line = render._streams(c.summary())
    assert line == ("; streams: auto, 8 -> 6 (from 6 to 8, 1 change), bound: server "
                    "backpressure: 140 parts in a partition, parts_to_delay_insert 150")
    import json

    assert render._run_streams(json.dumps(c.summary())) == "auto 8->6 (1 change)"
    fixed = Controller(3, 3, fixed=True).summary()
    assert render._streams(fixed) == "; streams: 3 (fixed: --workers)"
    assert render._run_streams(json.dumps(fixed)) == "fixed 3" and render._run_streams("") == "-"
