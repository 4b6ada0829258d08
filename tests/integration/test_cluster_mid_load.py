"""A cluster's server killed in the middle of a load, after rows were committed: the run
still reports what it committed (exit 1, each failure named), never exit 2 ("nothing was
loaded"); a rerun with the server back ends with every row exactly once.

The kill is aimed, not raced: every unit starts at once (as many workers as files), so
all of them commit in the last round, as one group per shard, whose `loaded` events wait
for the run's end; another shard is held back before its commit (CHLOAD_PAUSE_AT), and
the test kills the victim as soon as its ledger and its local table show the group
attached.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import services
from common import make_trips
from test_cluster import make_tables, q, shard_args

pytestmark = pytest.mark.integration

FILES, ROWS = 4, 150_000  # files above 512 KB: a unit each
KEY = "cityHash64(id)"


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("cluster-parts")
    make_trips(str(directory), FILES, ROWS)
    return str(directory / "*.csv.gz")


def _attached(server: services.Service, table: str) -> bool:
    """Every unit committed on `server`: its ledger logs each file `committing`, and its
    local table holds the rows those events name (an attach is one part: all or none), and
    no ATTACH of it is still running."""
    try:
        logged = q(server, "SELECT uniqExact(uri), sum(rows) FROM chload.files WHERE "
                           f"target_table = 'default.{table}_local' AND state = "
                           "'committing'")
    except RuntimeError:  # its ledger not made yet
        return False
    files, rows = logged.split("\t") if "\t" in logged else ("0", "0")
    held = q(server, f"SELECT count() FROM default.{table}_local")
    attaching = q(server, "SELECT count() FROM system.processes WHERE query LIKE "
                          f"'ALTER TABLE %{table}_local% ATTACH%'")
    return int(files) == FILES and rows == held and attaching == "0"


def _kill_when_attached(proc: subprocess.Popen[str], victim: services.Service, table: str,
                        timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not _attached(victim, table):
        if proc.poll() is not None:
            pytest.fail(f"the load ended (exit {proc.returncode}) before the kill: "
                        f"{proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{victim.name} did not commit within {timeout:.0f} s")
        time.sleep(0.02)
    time.sleep(0.3)  # the last ATTACH's answer on its way (the held shard waits 3 s)
    victim.kill(signal.SIGKILL)


@pytest.mark.parametrize(("victim", "held", "output"), [
    (3, 1, "--json"),  # a shard
    (2, 3, "plain"),
    (1, 2, "plain"),  # the server holding the Distributed table (and the run's record)
])
def test_a_server_killed_after_its_commits_reports_them(weighted_cluster, parts, victim,
                                                        held, output):
    cluster = weighted_cluster
    table = make_tables(cluster, KEY)
    server = cluster.server(victim)
    args = ["load", parts, "--table", table, "--target", f"{cluster.servers[0].url}/default",
            *shard_args(cluster), "--workers", str(FILES)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "chload", *args, *(["--json"] if output == "--json" else [])],
        env={**os.environ, "CHLOAD_PAUSE_AT": f"cluster-commit-shard-{held}:3"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _kill_when_attached(proc, server, table)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.restart()
    assert proc.returncode == 1, (out, err)  # not 2: the run committed every unit
    if output == "--json":
        report = json.loads(out)
        assert (report["files_loaded"], report["rows_loaded"]) == (FILES, FILES * ROWS), out
        assert [s["rows"] > 0 for s in report["shards"]] == [True] * 3, report["shards"]
        assert report["errors"] and "unreachable" in report["errors"][0], report["errors"]
        assert "the next run settles" in report["errors"][0]
    else:
        assert f"{FILES} files: {FILES} loaded" in out, out
        assert out.count("  shard ") == 3, out  # what each shard committed
        errors = [line for line in err.splitlines() if line.startswith("  error: ")]
        assert any("the next run settles" in e for e in errors), err
        if victim == 1:  # where the run's record is kept
            assert any("chload history will not list it" in e for e in errors), err

    again = _exact_after_rerun(cluster, args, table)
    assert again["files_skipped"] == FILES


def test_a_shard_killed_between_units_fails_the_rest(weighted_cluster, parts):
    """One unit at a time, each pausing after it is routed; shard 2 is killed once the
    first is committed on every shard: the others fail, each named, and the run reports
    the one it loaded (exit 1)."""
    cluster = weighted_cluster
    table = make_tables(cluster, KEY)
    server = cluster.server(2)
    args = ["load", parts, "--table", table, "--target", f"{cluster.servers[0].url}/default",
            *shard_args(cluster), "--workers", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "chload", *args, "--json"],
        env={**os.environ, "CHLOAD_PAUSE_AT": "cluster-routed:1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not all(q(s, f"SELECT count() FROM default.{table}_local") != "0"
                      for s in cluster.servers):
            assert proc.poll() is None and time.monotonic() < deadline, "no commit"
            time.sleep(0.02)
        time.sleep(0.3)  # the ATTACH's answer on its way (the next unit waits 1 s)
        server.kill(signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.restart()
    assert proc.returncode == 1, (out, err)
    report = json.loads(out)
    assert report["files_loaded"] >= 1 and report["files_failed"] >= 1, report
    assert report["files_loaded"] + report["files_failed"] == FILES
    assert report["rows_loaded"] == report["files_loaded"] * ROWS
    failed = [f["error"] for f in report["files"] if f["status"] == "failed"]
    assert all("unreachable" in e for e in failed), failed
    _exact_after_rerun(cluster, args, table)


def _exact_after_rerun(cluster: services.ClickHouseCluster, args: list[str],
                       table: str) -> dict:
    """The same load again, the server back: exit 0, every row once on the cluster."""
    again = subprocess.run([sys.executable, "-m", "chload", *args, "--json"],
                           capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    total = sum(int(q(s, f"SELECT count() FROM default.{table}_local"))
                for s in cluster.servers)
    assert total == FILES * ROWS
    assert q(cluster.servers[0], f"SELECT uniqExact(id) FROM default.{table}") == str(total)
    return json.loads(again.stdout)
