"""How a server target groups files (targets/server/groups.py): files the loader's engine reads
share one stage per loader core, whatever their size up to FLOW_BELOW; files the server
parses itself share one only when small, in a group per stream."""

from __future__ import annotations

import pytest

from chload.formats import FileFormat
from chload.sources.base import SourceFile
from chload.targets.server import groups as server_groups
from chload.targets.server.groups import BATCHED_BELOW, FLOW_BELOW, plan

PARQUET, CSV_GZ, JSON_GZ = (FileFormat("Parquet", "none"), FileFormat("CSV", "gzip"),
                            FileFormat("JSONEachRow", "gzip"))
JSON_LINES = frozenset({"JSONEachRow"})


def _files(n: int, size: int, fmt: FileFormat) -> list[SourceFile]:
    return [SourceFile(f"/d/f{i:03d}", size, 0, fmt, local_path=f"/d/f{i:03d}")
            for i in range(n)]


def _plan(files: list[SourceFile], workers: int = 8) -> list[tuple[SourceFile, ...]]:
    return plan(files, workers, lambda f: f.format.name == "Parquet", JSON_LINES)


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_groups.os, "cpu_count", lambda: 2)


def test_pushed_files_of_any_size_share_a_stage_per_loader_core() -> None:
    files = _files(10, 6 << 20, PARQUET)
    groups = _plan(files)
    assert [len(g) for g in groups] == [5, 5]
    assert sorted(f.uri for g in groups for f in g) == [f.uri for f in files]
    assert all(list(g) == sorted(g, key=lambda f: f.uri) for g in groups)


def test_big_pushed_files_load_alone_and_many_bytes_make_more_groups() -> None:
    assert [len(g) for g in _plan(_files(3, FLOW_BELOW, PARQUET))] == [1, 1, 1]
    groups = _plan(_files(40, 30 << 20, PARQUET))  # 1.2 GB: 5 groups of 256 MB, rounded up
    assert len(groups) == 6 and {len(g) for g in groups} <= {6, 7}


def test_small_json_lines_share_per_core_larger_ones_load_alone() -> None:
    assert [len(g) for g in _plan(_files(200, 130 << 10, JSON_GZ))] == [100, 100]
    assert [len(g) for g in _plan(_files(16, 2 << 20, JSON_GZ))] == [1] * 16


def test_raw_files_small_ones_per_stream_the_rest_alone() -> None:
    assert [len(g) for g in _plan(_files(40, BATCHED_BELOW - 1, CSV_GZ))] == [5] * 8
    assert [len(g) for g in _plan(_files(16, BATCHED_BELOW, CSV_GZ))] == [1] * 16


def test_mixed_loads_keep_each_kind_whole() -> None:
    files = _files(4, 1 << 20, PARQUET) + _files(4, 1 << 20, CSV_GZ)
    groups = _plan(files)
    assert sorted(len(g) for g in groups) == [1, 1, 1, 1, 2, 2]
    assert sum(len(g) for g in groups) == 8


def test_gathered_in_memory_only_small_files_share_and_by_16_mb() -> None:
    """Over https a group is gathered in the loader's memory before it is sent."""
    groups = plan(_files(10, 6 << 20, PARQUET), 8, lambda f: True, JSON_LINES, streamed=False)
    assert [len(g) for g in groups] == [1] * 10
    groups = plan(_files(200, 400 << 10, JSON_GZ), 8, lambda f: False, JSON_LINES,
                  streamed=False)
    assert len(groups) == 6 and sum(len(g) for g in groups) == 200  # 78 MB by <= 16 MB


def test_into_a_narrow_table_larger_pushed_files_load_alone() -> None:
    """Few columns: a part costs little and a shared stage's rows are sorted and
    written at its stream's end; small files still share."""
    def narrow(files: list[SourceFile]) -> list[int]:
        return [len(g) for g in plan(files, 8, lambda f: True, JSON_LINES, columns=4)]

    assert narrow(_files(16, 1 << 20, PARQUET)) == [1] * 16
    assert narrow(_files(40, 100 << 10, PARQUET)) == [20, 20]
