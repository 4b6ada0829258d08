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


def test_the_eta_counts_the_units_under_way() -> None:
    """10 units of 20 s each, 2 at a time: they end in pairs (one report each, at its
    end). 10 s after the first pair, the next pair is half done: 30 of 200 s spent,
    70 left. rich's estimate took the first pair's bytes over the half second between
    their reports (a few seconds left); the bytes reported over the time since the plan
    would say 120 s."""
    clock = Clock()
    eta = TimeLeft(clock)
    eta.plan(1000)
    eta.start("f0", 100)
    eta.start("f1", 100)
    clock.now += 20
    eta.advance("f0", 100)
    eta.finish("f0")
    eta.start("f2", 100)
    clock.now += 0.5
    eta.advance("f1", 100)
    eta.finish("f1")
    eta.start("f3", 100)
    clock.now += 9.5
    assert eta.seconds() == pytest.approx(70, rel=0.03)


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
