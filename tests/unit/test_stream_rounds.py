"""A stream's rounds (dispatch.py `_stream_rounds`: Kafka ranges, change capture's units):
the first settles crashed commits and asks the ledger for every key of the table; the
later ones neither, asking only for the keys loaded since the round before (core/follow.py
`Known`), so a round costs what it loads, not the table's history. Against the
in-memory target (fake_target.py)."""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

from fake_target import FakeTarget

from chload import api, dispatch
from chload.commit.known import key
from chload.commit.ledger import LOADED, TableState
from chload.formats import FileFormat
from chload.sources.base import SourceFile


class _Rounds:
    """A stream of three rounds of one unit each (a local JSON lines file)."""

    audit_columns = None

    def __init__(self, units: list[SourceFile]) -> None:
        self.units = units
        self.reports: list[Any] = []

    def rounds(self, spec: api.LoadSpec, target: Any, listener: Any, load_round: Any,
               table: Any, report: Any) -> None:
        for unit in self.units:
            self.reports.append(load_round([unit], 1, None))


def test_a_streams_later_rounds_settle_nothing_and_ask_only_what_is_new(
        tmp_path: Path) -> None:
    units = []
    for i in range(3):
        path = tmp_path / f"u{i}.jsonl"
        path.write_text(f'{{"id": {i}}}\n')
        units.append(SourceFile(str(path), path.stat().st_size, 1,
                                FileFormat("JSONEachRow", "none"), local_path=str(path)))
    target = FakeTarget(str(tmp_path))
    asked: list[str] = []
    recovered: list[str] = []
    ledger: Any = target.ledger
    whole = ledger.known

    def known(target_table: str, table: TableState) -> Any:
        asked.append("whole")
        return whole(target_table, table)

    def loaded_since(target_table: str, table: TableState, since_ns: int, own_run: str,
                     own_since_ns: int) -> array:
        asked.append("since")
        pairs = sorted((key(e.uri), key(e.identity)) for e in ledger.events
                       if e.state == LOADED and e.seq > 0)
        return array("Q", [k for pair in pairs for k in pair])

    def recover(table: str) -> int:
        recovered.append(table)
        return 0

    ledger.known, ledger.loaded_since = known, loaded_since
    target.recover = recover  # type: ignore[method-assign]
    stream = _Rounds(units)
    spec = api.LoadSpec(sources=("kafka://scripted",), table="t", schema="id UInt64")
    dispatch._load_stream(spec, target, lambda event: None, stream)  # type: ignore[arg-type]
    assert [r.files_loaded for r in stream.reports] == [1, 1, 1]
    assert target.attached["`default`.`t`"] == [u.uri for u in units]
    assert recovered == ["`default`.`t`"]  # the first round only
    assert asked[0] == "whole" and asked[1:] == ["since", "since"]
