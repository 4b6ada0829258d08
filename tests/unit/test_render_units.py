"""The CLI names units as their source does: files, a database's ranges, a Kafka topic's
batches, in the summary and on the progress bar (cli/render.py)."""

from __future__ import annotations

import pytest

from chload.cli.render import ProgressView, TimeLeft, print_summary
from chload.core.report import LoadReport
from chload.core.run import Event


@pytest.mark.parametrize(("unit", "total", "said"), [
    ("file", 3, "3 files"), ("file", 1, "1 file"), ("range", 0, "0 ranges"),
    ("range", 1, "1 range"), ("batch", 2, "2 batches")])
def test_the_summary_counts_units_by_their_name(unit: str, total: int, said: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    print_summary(LoadReport("default.t", "x", "r", files_total=total, unit=unit))
    assert capsys.readouterr().out.startswith(f"default.t: {said}: ")


def test_the_progress_bar_counts_the_plans_units() -> None:
    view = ProgressView()
    view.on_event(Event("plan", files_total=4, unit="range"))
    view.on_event(Event("done", "postgresql://db:5432/shop/public.t#id(,10]"))
    assert view._progress.tasks[0].fields["files"] == "1/4 ranges"
    files = ProgressView()
    files.on_event(Event("plan", files_total=2))  # a plan that names no unit: files
    assert files._progress.tasks[0].fields["files"] == "0/2 files"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_takes_the_rate_since_the_plan_not_of_one_burst() -> None:
    """Units report their bytes when parsed, several at once: 2 of 10 units after 20 s,
    then 2 more a moment later. rich's own estimate took the burst's bytes over the
    moment between them and showed a second or two left; 60 s are left."""
    clock = Clock()
    eta = TimeLeft(clock)
    eta.plan(1000)
    for i in range(10):
        eta.start(f"f{i}", 100)
    clock.now += 20
    eta.advance("f0", 100)
    eta.advance("f1", 100)
    clock.now += 0.5
    eta.advance("f2", 100)
    eta.advance("f3", 100)
    assert eta.seconds() == pytest.approx(6 * 100 / (400 / 20.5))
    clock.now += 10  # no news for 10 s: the time left counts down
    assert eta.seconds() == pytest.approx(6 * 100 / (400 / 20.5) - 10)


def test_a_unit_moves_the_bar_by_its_listed_size_at_most() -> None:
    """The engine's count of bytes read (S3 objects through chDB) passed the listed size:
    the bar was full, the ETA 0:00:00, with a fifth of the load left."""
    view = ProgressView()
    view.on_event(Event("plan", files_total=2, bytes_total=200))
    view.on_event(Event("start", "a", bytes=100))
    view.on_event(Event("progress", "a", rows=10, bytes=124))
    view.on_event(Event("done", "a", rows=10, bytes=124))
    task = view._progress.tasks[0]
    assert task.completed == 100
    view.on_event(Event("start", "b", bytes=100))
    view.on_event(Event("progress", "b", rows=10, bytes=80))  # read less than listed
    view.on_event(Event("progress", "b", rows=-10, bytes=-80))  # taken back: retried
    assert task.completed == 100
    view.on_event(Event("progress", "b", rows=10, bytes=80))
    view.on_event(Event("done", "b", rows=10, bytes=80))  # ended: all of it is done
    assert task.completed == 200
    assert view.eta.seconds() == 0.0


def test_the_eta_leaves_out_a_slow_start() -> None:
    """10 s before the first unit ends (stages made, streams ramping up), then a unit a
    second: at 29 s, 20 of 100 done; the 80 left take about 80 s, not the 116 s the
    whole run's rate says. The rate is of the later half of the run: 15 units (from
    14.5 s, the 5th unit's credit before it) over 14.5 s."""
    clock = Clock()
    eta = TimeLeft(clock)
    eta.plan(100)
    clock.now += 9
    for i in range(20):
        eta.start(f"f{i}", 1)
        clock.now += 1
        eta.advance(f"f{i}", 1)
        eta.finish(f"f{i}")
    assert eta.seconds() == pytest.approx(80 / (15 / 14.5))
