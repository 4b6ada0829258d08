"""How a round's outcome moves each partition (source._advance), with a scripted ledger:
a unit the round's planning skipped (no result) or the commit refused follows the
ledger's end; one refused while that end did not move stops its partition as a failure,
never as if it were loaded (a run then ends exit 0 short of its rows)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from test_kafka_plan import _Ledger

from chload.api import LoadReport
from chload.commit.ledger import LOADED, FileEvent
from chload.core.run import LOADED_ELSEWHERE, LOADED_IN_PART, FileResult
from chload.formats import FileFormat
from chload.sources.base import SourceFile
from chload.sources.kafka import plan as P, source as S

STREAM = "kafka://b:9092/t/0"
TABLE = SimpleNamespace(database="d", name="t", display="d.t")


def _target(*ends: int) -> Any:
    """A target whose ledger holds units of 1000 offsets up to each of `ends`."""
    events = [FileEvent("d.t", f"{STREAM}/{end - 1000}-{end - 1}", f"A:{end - 1000}-{end - 1}",
                        0, 0, LOADED, rows=1000, seq=n) for n, end in enumerate(ends)]
    return SimpleNamespace(ledger=_Ledger(events))


def _round(*results: FileResult) -> tuple[P.Partition, SourceFile, LoadReport]:
    part = P.Partition("t", 0, STREAM, "A", 0, 0, 5000)
    unit = SourceFile(f"{STREAM}/0-999", 0, 0, FileFormat("JSONEachRow", "none"))
    done = LoadReport("d.t", "server", "run")
    done.files = list(results)
    return part, unit, done


def test_a_unit_the_rounds_planning_found_loaded_is_skipped_and_followed() -> None:
    part, unit, done = _round()  # no result: Ledger.known had it
    S._advance([part], [unit], done, _target(1000), TABLE)
    assert (part.next, part.after, part.stopped) == (1000, 1000, False)
    assert [(r.uri, r.status, r.note) for r in done.files] == [
        (unit.uri, "skipped", LOADED_ELSEWHERE)]


def test_a_refused_unit_whose_partition_did_not_move_stops_it_as_a_failure() -> None:
    part, unit, done = _round(FileResult(f"{STREAM}/0-999", "skipped", note=LOADED_ELSEWHERE))
    S._advance([part], [unit], done, _target(), TABLE)
    assert part.stopped
    assert [(r.uri, r.status) for r in done.files] == [
        (unit.uri, "skipped"), (STREAM, "failed")]
    assert "run the same command again" in done.files[1].error


def test_a_unit_committed_on_some_shards_only_counts_and_follows_the_ledger() -> None:
    part, unit, done = _round(FileResult(f"{STREAM}/0-999", "loaded", 300,
                                         note=LOADED_IN_PART))
    S._advance([part], [unit], done, _target(1000, 2000), TABLE)
    assert (part.next, part.after, part.stopped) == (2000, 2000, False)
    assert [(r.status, r.rows) for r in done.files] == [("loaded", 300)]
