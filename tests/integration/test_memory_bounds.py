"""Bounded memory (engine.BLOCK_SETTINGS): the blocks of an insert of much data are
bounded by bytes, so a file of wide rows bigger than one block is written in several
parts, never held whole; a small insert keeps the engine's blocks (smaller parts cost
CPU). (The peak RSS itself is measured by bench/memory.py.)"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
from conftest import run_chload

from chload.formats import detect
from chload.runtime.engine import BLOCK_SETTINGS
from chload.sources.base import SourceFile
from chload.targets.embedded.target import LARGE_UNIT_BYTES, _large

pytestmark = pytest.mark.integration

WIDTH = 1000  # bytes of text a row


def test_a_file_wider_than_a_block_is_inserted_in_several_parts(tmp_path: Path,
                                                                 target_dir: str) -> None:
    block = int(dict(BLOCK_SETTINGS)["min_insert_block_size_bytes"])
    rows = block * 3 // WIDTH // 1000 * 1000  # 3 blocks, far fewer rows than the 1M-row bound
    data = tmp_path / "wide.csv.gz"
    letters = bytes(97 + b % 26 for b in range(256))  # random text: gzip keeps ~60% of it
    with gzip.open(data, "wb", compresslevel=1) as out:
        for i in range(0, rows, 1000):
            noise = os.urandom(1000 * WIDTH).translate(letters)
            out.write(b"".join(b"%d,%s\n" % (i + k, noise[k * WIDTH:(k + 1) * WIDTH])
                               for k in range(1000)))
    assert _large([_file(str(data))])  # else the bound is not set: make the file bigger
    done = run_chload("load", str(data), "--table", "wide", "--target", target_dir,
                      "--schema", "id UInt64, note String", "--order-by", "id", "--quiet")
    assert done.returncode == 0, done.stderr
    out = run_chload("sql", "SELECT count(), uniqExact(id) FROM wide", "--target", target_dir,
                     "--format", "TSV")
    assert out.stdout.split() == [str(rows), str(rows)], out.stderr
    parts = run_chload("sql", "SELECT count() FROM system.parts WHERE table = 'wide' AND "
                       "active", "--target", target_dir, "--format", "TSV")
    assert int(parts.stdout.strip()) >= 2, parts.stderr


def _file(path: str, size: int | None = None) -> SourceFile:
    return SourceFile(path, os.path.getsize(path) if size is None else size, 0, detect(path))


def test_only_an_insert_of_much_data_has_its_blocks_bounded() -> None:
    small = [_file(f"/d/{i}.csv.gz", 5 << 20) for i in range(5)]  # taxi: 26 MB of gzip
    assert not _large(small)
    assert _large([_file("/d/big.parquet", LARGE_UNIT_BYTES // 4)])  # columnar: expands
    assert not _large([_file("/d/plain.csv", LARGE_UNIT_BYTES // 4)])
    assert _large([_file("/d/plain.csv", LARGE_UNIT_BYTES)])
