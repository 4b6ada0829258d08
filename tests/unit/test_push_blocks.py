"""The settings of a push (fill.py): the loader's engine reads Parquet in blocks of ~16 MB
of the table's rows (parquet_block_rows), not chDB's default 65,409 rows, so a narrow
file's row group goes to the server as one Native block, a wide table's rows as by
default; files too small to split are parsed without parallel parsing; and a user's
--setting wins over the loader's own."""

from __future__ import annotations

from pathlib import Path

from chload.formats import FileFormat
from chload.runtime.engine import Engine
from chload.schema import Column, settings_sql
from chload.sources.base import SourceFile
from chload.targets.base import LoadJob
from chload.targets.server.capabilities import Capabilities
from chload.targets.server.fill import SERIAL_PARSE_BELOW, StageFilling, parquet_block_rows

NARROW = [Column("id", "UInt64"), Column("miles", "UInt32"), Column("duration", "UInt32"),
          Column("vehicle_id", "UInt8")]
WIDE = [Column("id", "UInt64")] + [Column(f"s{i}", "String") for i in range(40)]


def _blocks(engine: Engine, path: Path, columns: list[Column]) -> tuple[int, int]:
    out = engine.query(f"SELECT uniqExact(blockNumber()), count() FROM file('{path}', "
                       "'Parquet') SETTINGS max_threads = 1, input_format_parquet_max_block_"
                       f"size = {parquet_block_rows(columns)}")
    blocks, rows = out.split()
    return int(blocks), int(rows)


def test_a_narrow_row_group_is_one_block_and_a_wide_one_as_by_default(tmp_path: Path) -> None:
    engine = Engine(None)
    path = tmp_path / "one_row_group.parquet"
    try:
        engine.query(f"INSERT INTO FUNCTION file('{path}', 'Parquet') SELECT number AS id "
                     "FROM numbers(200000)")
        assert _blocks(engine, path, NARROW) == (1, 200000)  # 4 by chDB's default
        assert _blocks(engine, path, WIDE) == (4, 200000)  # 16 MB: 65,409 rows of 2.6 KB
        assert parquet_block_rows(NARROW) == (16 << 20) // 17
    finally:
        engine.close()


def test_a_users_setting_wins_over_the_loaders_in_a_push() -> None:
    """chDB keeps the first of a name given twice in SETTINGS: each name goes once."""
    filling = StageFilling()
    filling.caps = Capabilities("18.16.1", timezone="Etc/UTC")
    f = SourceFile("/d/a.jsonl", 100, 1, FileFormat("JSONEachRow", "none"))
    job = LoadJob(file=f, table="t", table_display="t", columns=NARROW, read_columns=NARROW,
                  audit=False, run_id="run",
                  settings=(("input_format_parallel_parsing", "0"), ("session_timezone", "UTC")))
    settings = filling._push_settings(job)
    assert len({name for name, _ in settings}) == len(settings)
    engine = Engine(None)
    try:
        got = engine.query("SELECT getSetting('input_format_parallel_parsing'), "
                           f"getSetting('session_timezone') SETTINGS {settings_sql(settings)}")
    finally:
        engine.close()
    assert got.split() == ["false", "UTC"]


def test_only_small_files_are_parsed_without_parallel_parsing() -> None:
    filling = StageFilling()
    filling.caps = Capabilities("18.16.1")

    def parallel(*sizes: int) -> str:
        files = tuple(SourceFile(f"/d/{i}.jsonl.gz", size, 1, FileFormat("JSONEachRow", "gzip"))
                      for i, size in enumerate(sizes))
        job = LoadJob(file=files[0], table="t", table_display="t", columns=NARROW,
                      read_columns=NARROW, audit=False, settings=(), run_id="run",
                      batch=files if len(files) > 1 else ())
        return dict(filling._push_settings(job))["input_format_parallel_parsing"]

    assert parallel(130_000, 140_000) == "0"
    assert parallel(130_000, SERIAL_PARSE_BELOW) == "1"  # one file large enough to split
    assert parallel(0) == "1"  # a pipe: its size unknown
