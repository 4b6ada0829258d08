"""The benchmark suite end to end, in its tiny profile: `scripts/bench --tiny` generates
its datasets, starts a real ClickHouse 18.16 server, runs every method and writes the
three result files, whose figures must be consistent and measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import services

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"method", "target", "format", "rows", "seconds", "rows_per_s", "mb_per_s",
        "ratio_vs_chload", "cpu_util_pct", "disk_util_pct", "disk_await_ms", "status"}


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not services.is_installed("clickhouse"):
        pytest.fail("clickhouse is not installed: run python3 scripts/services/services.py "
                    "install clickhouse (scripts/test does it)")
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench"), "--tiny", "--out", str(out / "res"),
         "--cache", str(out / "cache")], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "res"


def test_writes_three_files_with_eight_measured_methods(bench_out: Path) -> None:
    results = json.loads((bench_out / "results.json").read_text())
    assert isinstance(results, list) and results
    assert all(KEYS <= set(r) for r in results)
    measured = [r for r in results if r["status"] == "ok"]
    assert len({r["method"] for r in measured}) >= 8
    for r in measured:
        assert r["seconds"] > 0 and r["rows"] > 0 and r["runs"]
        assert r["rows_per_s"] == pytest.approx(r["rows"] / r["seconds"], rel=0.01)
        assert r["cpu_util_pct"] is not None and 0 <= r["cpu_util_pct"] <= 100
    for r in results:  # a figure only where there was a run
        assert (r["seconds"] is None) == (r["status"] != "ok")

    table = (bench_out / "results.md").read_text()
    for r in measured:
        assert r["method"].replace("|", "\\|") in table
    png = (bench_out / "results.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_every_method_is_compared_with_chload_on_its_own_target(bench_out: Path) -> None:
    results = json.loads((bench_out / "results.json").read_text())
    by_key = {(r["method"], r["target"], r["dataset"]): r for r in results}
    assert by_key[("chload", "embedded", "trips")]["ratio_vs_chload"] == 1.0
    sql = by_key[("chDB SQL (defaults)", "embedded", "trips")]
    assert sql["ratio_vs_chload"] == pytest.approx(
        sql["seconds"] / by_key[("chload", "embedded", "trips")]["seconds"], rel=0.01)
    audit = by_key[("chDB SQL + audit columns", "embedded", "streams")]
    assert audit["baseline"] == "chload --audit [embedded]"
    server = by_key[("chload", "server", "trips")]
    assert server["status"] in ("ok", "not available")
    curl = by_key[("curl POST, sequential", "server", "trips")]
    if server["status"] == "ok":
        assert curl["ratio_vs_chload"] == pytest.approx(
            curl["seconds"] / server["seconds"], rel=0.01)
    else:
        assert curl["ratio_vs_chload"] is None and server["note"]
