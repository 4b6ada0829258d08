"""A run costs what is new: planning 100,000 known units and 10 new ones, as a scripted
source lists them, holds the 10 new ones, not the 100,000 (nor their ledger events)."""

from __future__ import annotations

import sys
import tracemalloc
import types
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fake_target import FakeTarget

from chload import api, dispatch
from chload.commit import known as known_module
from chload.commit.known import KnownUnits, key
from chload.commit.ledger import TableState
from chload.formats import FileFormat
from chload.schema import Column
from chload.sources.base import InPlace, SourceContext, SourceFile
from chload.sources.registry import KINDS, SCHEMES

KNOWN, NEW = 100_000, 10
CSV = FileFormat("CSV", "none")


def _uri(i: int) -> str:
    return f"scripted://bucket/p{i // 1000:04d}/f{i:07d}.csv"


class ScriptedSource(InPlace):
    """`scripted://bucket/N`: N units listed one at a time, as a long listing comes."""

    kind = "scripted"
    schemes = ("scripted",)

    def list(self, pattern: str, context: SourceContext) -> Iterator[SourceFile]:
        n = int(pattern.rsplit("/", 1)[1])
        return (SourceFile(_uri(i), 10, i, CSV, kind="scripted") for i in range(n))

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        return f"scripted('{file.uri}')"

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        return None

    def release(self, files: object) -> None:
        return None

    def current(self, file: SourceFile) -> SourceFile:
        return file

    def still_there(self, file: SourceFile) -> bool | None:
        return True

    def reads_at_uri(self, file: SourceFile) -> bool:
        return True

    def known_empty(self, file: SourceFile) -> bool:
        return False


class _Known(FakeTarget):
    """A target whose ledger has loaded the first KNOWN units (its answer made before
    the run, as the engine would give it: 16 bytes a unit)."""

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir, batch_size=NEW)
        pairs = sorted((key(_uri(i)), key(f"10:{i}")) for i in range(KNOWN))
        self.answer = KnownUnits(array("Q", (u for u, _ in pairs)),
                                 array("Q", (i for _, i in pairs)))
        self.tables["`default`.`t`"] = [Column("x", "UInt8")]
        self.attached["`default`.`t`"] = ["earlier"]
        self.rows_of["earlier"] = KNOWN
        self.ledger.known = self._known  # type: ignore[method-assign]

    def _known(self, target_table: str, table: TableState) -> tuple[KnownUnits, str]:
        return self.answer, ""


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("chload.sources.scripted")
    module.SOURCE = ScriptedSource()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "chload.sources.scripted", module)
    monkeypatch.setitem(SCHEMES, "scripted", "scripted")
    monkeypatch.setitem(KINDS, "scripted", "chload.sources.scripted")


def test_a_rerun_over_100000_known_units_holds_only_the_new_ones(
        scripted: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _Known(str(tmp_path))
    spec = api.LoadSpec(sources=(f"scripted://bucket/{KNOWN + NEW}",), table="t",
                        schema="x UInt8")
    keys = [0]

    def counted(text: str) -> int:
        keys[0] += 1
        return key(text)
    monkeypatch.setattr(known_module, "key", counted)
    tracemalloc.start()
    try:
        report = dispatch.load_into(spec, target)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (report.files_skipped, report.files_loaded, report.files_total) == (
        KNOWN, NEW, KNOWN + NEW)
    assert [uri for _, uris in target.calls for uri in uris] == [  # type: ignore[attr-defined]
        _uri(i) for i in range(KNOWN, KNOWN + NEW)]
    # Holding the listing, or an event per known unit, would take many times this; the
    # keys that stand for the known units were made before the measure began.
    assert peak < 1 << 20, f"planning held {peak / 2**20:.1f} MiB"
    # and work in proportion to the listing: a key of each listed unit's uri and of each
    # known one's identity, no pass over the known units for each listed one
    assert KNOWN + NEW <= keys[0] <= 2 * (KNOWN + NEW), keys[0]
