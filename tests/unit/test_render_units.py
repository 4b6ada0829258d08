"""The CLI names units as their source does: files, a database's ranges, a Kafka topic's
batches, in the summary and on the progress bar (cli/render.py)."""

from __future__ import annotations

import pytest

from chload.cli.render import ProgressView, print_summary
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
