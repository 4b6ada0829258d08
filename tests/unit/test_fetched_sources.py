"""A source whose units are not readable where they are (a database range, a Kafka
offset range) plugs in through the Source hooks alone: one object per run (`open`),
each unit fetched once right before its load and its spool released right after,
never batched (`loads_alone`), its columns and key said by the source (no inference),
its pattern shown without the password, its session closed when the run ends.
Against the in-memory FakeTarget: no engine, no database."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from fake_target import FakeTarget

from chload import api, dispatch
from chload.errors import TransientError, UsageError
from chload.formats import FileFormat
from chload.schema import Column
from chload.sources.base import RemoteSource, Source, SourceContext, SourceFile
from chload.sources.registry import KINDS, SCHEMES

TABLE = "`default`.`t`"
TSV = FileFormat("TSV", "none")


class RangeSource(RemoteSource):
    """`ranges://user:secret@host/a,b,c`: units a, b, c of a session, each fetched as a
    spool of as many rows as its name is long; `fail_fetch`: fetches failing (transient)."""

    kind = "ranges"
    schemes: tuple[str, ...] = ("ranges",)
    options: tuple[str, ...] = ("query",)
    reads_in_place = False

    def __init__(self, log: dict[str, list]) -> None:
        self.log = log
        self.session = ""
        self.spools: set[str] = set()

    def open(self) -> Source:
        self.log["opened"].append(1)
        return RangeSource(self.log)

    def list(self, pattern: str, context: SourceContext) -> list[SourceFile]:
        self.session = "open"
        root, _, names = pattern.rpartition("/")
        shown = self.display(root)
        return [SourceFile(f"{shown}#{n}", 0, 0, TSV, etag=f"snap1:{n}", kind="ranges",
                           location=n) for n in names.split(",")]

    def fetch(self, file: SourceFile, columns: Sequence[Column], workdir: str) -> SourceFile:
        assert self.session == "open" and [c.name for c in columns] == ["id"]
        self.log["fetched"].append(file.uri)
        if self.log["fail_fetch"]:
            self.log["fail_fetch"].pop()
            raise TransientError(f"{file.uri}: connection lost (scripted)")
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, f"spool-{file.location}.tsv")
        Path(path).write_text("".join(f"{i}\n" for i in range(len(file.location))))
        self.spools.add(path)
        return SourceFile(file.uri, os.path.getsize(path), 0, TSV, etag=file.etag,
                          local_path=path)

    def release(self, files: Iterable[SourceFile]) -> None:
        for f in files:
            if f.local_path in self.spools:
                os.remove(f.local_path)
                self.log["released"].append(f.uri)

    def close(self) -> None:
        self.session = "closed"
        self.log["closed"].append(1)

    def loads_alone(self, file: SourceFile) -> bool:
        return True

    def columns(self, files: Sequence[SourceFile]) -> list[Column] | None:
        return [Column("id", "UInt64")]

    def sorting_key(self, files: Sequence[SourceFile]) -> str | None:
        return "id"

    def display(self, pattern: str) -> str:
        return pattern.replace(":secret@", "@")

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        raise AssertionError("a range is fetched, never read in place")


class KeyedTarget(FakeTarget):
    """The fake, remembering the ORDER BY of the tables it creates."""

    order_by: dict[str, str | None] = {}

    def create_table(self, table: str, columns: Sequence[Column], order_by: str | None,
                     partition_by: str | None) -> None:
        self.order_by = {**self.order_by, table: order_by}
        super().create_table(table, columns, order_by, partition_by)


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    record: dict[str, list] = {k: [] for k in ("opened", "fetched", "released", "closed",
                                               "fail_fetch")}
    module = types.ModuleType("chload.sources.ranges")
    module.SOURCE = RangeSource(record)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "chload.sources.ranges", module)
    monkeypatch.setitem(SCHEMES, "ranges", "ranges")
    monkeypatch.setitem(KINDS, "ranges", "chload.sources.ranges")
    return record


def test_each_unit_is_fetched_once_loaded_alone_and_released(
        tmp_path: Path, log: dict[str, list]) -> None:
    uri = "ranges://loader:secret@db/ab,abc,abcd"
    units = [f"ranges://loader@db#{n}" for n in ("ab", "abc", "abcd")]
    target = KeyedTarget(str(tmp_path), batch_size=4, transient={units[1]: 1})
    log["fail_fetch"].append(1)  # the first fetch fails once: retried, not a failed unit
    report = dispatch.load_into(api.LoadSpec(sources=(uri,), table="t"), target)
    assert report.ok and report.files_loaded == 3 and report.rows_loaded == 2 + 3 + 4
    # fetched once each (one retried fetch), the transient load retried on the same spool
    assert sorted(log["fetched"]) == sorted([*units, log["fetched"][0]])
    assert sorted(log["released"]) == sorted(units) and log["closed"] == [1]
    assert not list(tmp_path.glob("tmp/spool-*"))
    assert all(kind == "load_file" for kind, _ in target.calls)  # never batched
    assert target.tables == {TABLE: [Column("id", "UInt64")]}  # the source's, not inferred
    assert target.order_by == {TABLE: "id"}
    assert "secret" not in target.ledger.run_records[0].sources
    assert {e.identity for e in target.ledger.events} == {"snap1:ab", "snap1:abc",
                                                          "snap1:abcd"}


def test_a_failed_load_still_releases_its_spool(tmp_path: Path,
                                                log: dict[str, list]) -> None:
    target = FakeTarget(str(tmp_path), terminal={"ranges://db#abc": "bad row"})
    report = dispatch.load_into(api.LoadSpec(sources=("ranges://db/abc",), table="t"), target)
    assert report.files_failed == 1
    assert log["released"] == ["ranges://db#abc"] and log["closed"] == [1]


def test_a_source_option_no_source_reads_is_refused(tmp_path: Path,
                                                    log: dict[str, list]) -> None:
    target = FakeTarget(str(tmp_path))
    with pytest.raises(UsageError, match="--incremental-by: only for"):
        dispatch.load_into(api.LoadSpec(sources=("ranges://db/a",), table="t",
                                    incremental_by="id"), target)
    assert log["closed"] == [1]  # the run's object is closed all the same
    (tmp_path / "a.jsonl").write_text("{}\n")
    with pytest.raises(UsageError, match="--query: only for"):
        dispatch.load_into(api.LoadSpec(sources=(str(tmp_path / "a.jsonl"),), table="t",
                                    query="SELECT 1"), target)
