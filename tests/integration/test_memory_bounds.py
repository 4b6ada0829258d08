"""Bounded memory (engine.SESSION_SETTINGS): an insert's blocks are bounded by bytes, so
a file of wide rows bigger than one block is written in several parts, never held whole.
(The peak RSS itself is measured by bench/memory.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_chload

from chload.engine import SESSION_SETTINGS

pytestmark = pytest.mark.integration

WIDTH = 1000  # bytes of text a row


def test_a_file_wider_than_a_block_is_inserted_in_several_parts(tmp_path: Path,
                                                                 target_dir: str) -> None:
    block = int(dict(SESSION_SETTINGS)["min_insert_block_size_bytes"])
    rows = block * 5 // 2 // WIDTH  # 2.5 blocks, far fewer rows than the 1M-row bound
    data = tmp_path / "wide.csv"
    with data.open("w") as out:
        for i in range(rows):
            out.write(f"{i},{chr(97 + i % 26) * WIDTH}\n")
    done = run_chload("load", str(data), "--table", "wide", "--target", target_dir,
                      "--schema", "id UInt64, note String", "--order-by", "id", "--quiet")
    assert done.returncode == 0, done.stderr
    out = run_chload("sql", "SELECT count(), uniqExact(id) FROM wide", "--target", target_dir,
                     "--format", "TSV")
    assert out.stdout.split() == [str(rows), str(rows)], out.stderr
    parts = run_chload("sql", "SELECT count() FROM system.parts WHERE table = 'wide' AND "
                       "active", "--target", target_dir, "--format", "TSV")
    assert int(parts.stdout.strip()) >= 2, parts.stderr
