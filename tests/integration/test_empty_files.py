"""An empty file beside others loads 0 rows, recorded in the ledger (a rerun skips it),
whatever its format and compression: into embedded chDB and into the 18.16 server.
A zero-byte Parquet file, which cannot be empty and valid, fails naming the file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import services
from conftest import run_chload

pytestmark = pytest.mark.integration

# A file beside a.csv (two rows): its name, its bytes.
EMPTY = {"b.csv": b"", "c.tsv": b"", "d.jsonl": b"", "e.csv.gz": b"",
         "f.csv.gz": gzip.compress(b""), "g.tsv.gz": gzip.compress(b"")}


@pytest.fixture(params=["embedded", "server"])
def target(request: pytest.FixtureRequest, target_dir: str) -> tuple[str, dict[str, str]]:
    if request.param == "embedded":
        return target_dir, {}
    server: services.Service = request.getfixturevalue("clickhouse")
    return (f"http://loader@127.0.0.1:{server.ports['http']}/default",
            {"CLICKHOUSE_PASSWORD": server.credentials["password"]})


def _load(directory: Path, table: str, target: tuple[str, dict[str, str]]) -> dict:
    done = run_chload("load", str(directory), "--table", table, "--target", target[0],
                      "--json", env=target[1], timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _sql(target: tuple[str, dict[str, str]], sql: str) -> str:
    done = run_chload("sql", sql, "--target", target[0], "--format", "TSV", env=target[1])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_empty_files_load_no_rows_and_a_rerun_skips_them(
        tmp_path: Path, table_name: str, target: tuple[str, dict[str, str]]) -> None:
    for name, data in EMPTY.items():
        directory = tmp_path / name.replace(".", "_")
        directory.mkdir()
        (directory / "a.csv").write_text("id,name\n1,a\n2,b\n")
        (directory / name).write_bytes(data)
        table = f"{table_name}_{name.replace('.', '_')}"
        report = _load(directory, table, target)
        assert (report["files_loaded"], report["rows_loaded"]) == (2, 2), (name, report)
        assert _sql(target, f"SELECT count(), sum(id) FROM {table}").split() == ["2", "3"]
        ledger = _sql(target, f"SELECT state, rows FROM chload.files WHERE uri LIKE "
                              f"'%/{name}' AND target_table LIKE '%{table}' ORDER BY seq")
        assert ledger.splitlines()[-1].split() == ["loaded", "0"], (name, ledger)
        again = _load(directory, table, target)
        assert (again["files_skipped"], again["files_loaded"]) == (2, 0), (name, again)


def test_a_zero_byte_parquet_file_fails_naming_it(tmp_path: Path, table_name: str,
                                                  target_dir: str) -> None:
    (tmp_path / "a.csv").write_text("id,name\n1,a\n2,b\n")
    (tmp_path / "b.parquet").write_bytes(b"")
    done = run_chload("load", str(tmp_path), "--table", table_name, "--target", target_dir,
                      timeout=120)
    assert done.returncode == 1, done.stderr
    failed = [line for line in done.stderr.splitlines() if "failed" in line]
    assert len(failed) == 1 and f"{tmp_path}/b.parquet" in failed[0], done.stderr
