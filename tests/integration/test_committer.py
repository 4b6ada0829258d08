"""One committer, both targets (commit/committer.py): a crashed commit of one table is
settled by the next load of that table, whatever was loaded into other tables in
between; a file gone between listing and loading fails alone and is never `loaded`.
The real `chload` command (or the Python API in a child process), real chDB, a real
18.16 server; results checked through SQL."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import services
from common import make_trips
from conftest import kill_moments, kill_when, run_chload, top_block, wait_while_running

from chload.commit.locks import Holder, lock_name

pytestmark = pytest.mark.integration

FILES_A, ROWS_A = 6, 500  # table A: 6 small files (one batch), 3,000 rows


def _write_a(directory: Path) -> None:
    directory.mkdir()
    for i in range(FILES_A):
        rows = "".join(f"{i * ROWS_A + j},v{j}\n" for j in range(ROWS_A))
        (directory / f"a_{i}.csv").write_text("id,v\n" + rows)


def _server_url(server: services.Service) -> str:
    return f"http://loader@127.0.0.1:{server.ports['http']}/default"


def _server_env(server: services.Service) -> dict[str, str]:
    return {"CLICKHOUSE_PASSWORD": server.credentials["password"]}


class Place:
    """Where a test loads: an embedded directory or the server, and how to ask it."""

    def __init__(self, target: str, env: dict[str, str], prefix: str,
                 server: services.Service | None = None) -> None:
        self.target, self.env, self.prefix, self.server = target, env, prefix, server

    def load(self, *args: str, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
        return run_chload("load", *args, "--target", self.target,
                          env={**self.env, **(env or {})}, timeout=180)

    def count(self, table: str) -> int:
        if self.server is not None:
            return int(services.clickhouse_query(self.server, f"SELECT count() FROM {table}"))
        out = run_chload("sql", f"SELECT count() FROM {table}", "--target", self.target,
                         "--format", "TSV")
        assert out.returncode == 0, out.stderr
        return int(out.stdout)

    def ledger(self, table: str) -> dict[str, tuple[str, int]]:
        out = run_chload("files", "--table", table, "--target", self.target, "--json",
                         env=self.env)
        assert out.returncode == 0, out.stderr
        return {r["uri"]: (r["state"], r["rows"]) for r in json.loads(out.stdout)}


@pytest.fixture(params=["embedded", "server"])
def place(request: pytest.FixtureRequest, target_dir: str, table_name: str) -> Place:
    if request.param == "embedded":
        return Place(target_dir, {}, "t")
    server = request.getfixturevalue("clickhouse")
    return Place(_server_url(server), _server_env(server), table_name, server)


# -- a pending commit of table A survives a load into table B -----------------------

@pytest.mark.parametrize("point", ["before-attach", "server-before-attach"])
def test_a_crashed_commit_survives_a_load_into_another_table(
        place: Place, tmp_path: Path, point: str) -> None:
    """Killed between `committing` and the attach into A, then a load into B, then A
    again: every row of A exactly once, the ledger agreeing. The crash point has its
    plain name and its older server- name on both targets."""
    ta, tb = f"{place.prefix}a", f"{place.prefix}b"
    _write_a(tmp_path / "a")
    (tmp_path / "b.csv").write_text("id,w\n1,q\n2,r\n")
    glob = str(tmp_path / "a" / "*.csv")
    crash = place.load(glob, "-t", ta, env={"CHLOAD_CRASH_AT": point})
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    assert place.load(str(tmp_path / "b.csv"), "-t", tb).returncode == 0
    again = place.load(glob, "-t", ta)
    assert again.returncode == 0, again.stderr
    assert place.count(ta) == FILES_A * ROWS_A
    assert set(place.ledger(ta).values()) == {("loaded", ROWS_A)}
    assert place.count(tb) == 2


def test_a_crash_after_the_attach_survives_a_load_into_another_table(
        place: Place, tmp_path: Path) -> None:
    ta, tb = f"{place.prefix}a", f"{place.prefix}b"
    _write_a(tmp_path / "a")
    (tmp_path / "b.csv").write_text("id,w\n1,q\n")
    glob = str(tmp_path / "a" / "*.csv")
    crash = place.load(glob, "-t", ta, env={"CHLOAD_CRASH_AT": "after-attach"})
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    assert place.load(str(tmp_path / "b.csv"), "-t", tb).returncode == 0
    assert place.load(glob, "-t", ta).returncode == 0
    assert place.count(ta) == FILES_A * ROWS_A
    assert set(place.ledger(ta).values()) == {("loaded", ROWS_A)}


def test_kill_9_in_loads_of_a_between_loads_of_b_then_exactly_once(
        tmp_path: Path, target_dir: str) -> None:
    """Real kills at three moments of a load into A, each seen on disk before the kill
    (while its first stage fills, right after its first commit, while a rerun's stage
    fills), each followed by a load into B; the last load of A has every row exactly
    once."""
    make_trips(str(tmp_path / "a"), 12, 1_000_000)  # 5 MB files: several to a stage
    (tmp_path / "b.csv").write_text("id,w\n1,q\n")
    args = [sys.executable, "-m", "chload", "load", str(tmp_path / "a"), "--table", "ta",
            "--target", target_dir, "--quiet", "--workers", "1"]
    for what, ready in kill_moments(target_dir, "ta"):
        before = top_block(target_dir, "ta")
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kill_when(proc, functools.partial(ready, proc.pid, before), what)
        assert run_chload("load", str(tmp_path / "b.csv"), "-t", "tb", "--target",
                          target_dir).returncode == 0
    place = Place(target_dir, {}, "t")
    assert 0 < place.count("ta") < 12_000_000  # the kills left a load half done
    assert subprocess.run(args, timeout=180).returncode == 0
    assert place.count("ta") == 12_000_000
    assert set(place.ledger("ta").values()) == {("loaded", 1_000_000)}


# -- a batched file gone between listing and loading --------------------------------

_DELETE_AT_PLAN = """
import json, os, sys
import chload

source, target, table, victim = sys.argv[1:5]

def listener(event):
    if event.kind == "plan" and os.path.exists(victim):
        os.remove(victim)

report = chload.load(source, table=table, target=target, listener=listener)
print(json.dumps(report.to_dict()))
"""


def _load_deleting(place: Place, source: Path, table: str, victim: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _DELETE_AT_PLAN, str(source), place.target,
                          table, str(victim)], capture_output=True, text=True, timeout=180,
                         env={**os.environ, **place.env})
    assert "Traceback" not in out.stderr, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("ext", ["csv", "jsonl"])
def test_a_batched_file_deleted_after_listing_fails_alone(
        place: Place, tmp_path: Path, ext: str) -> None:
    """8 small files in one batch, one deleted once the plan is made: it fails alone
    with one line naming it, is never `loaded`; the others load exactly once. A file
    that is there but empty still loads, with 0 rows."""
    source, table = tmp_path / "small", f"{place.prefix}v"
    source.mkdir()
    for i in range(8):
        if ext == "csv":
            text = "id,name\n" + "".join(f"{i * 10 + j},n{j}\n" for j in range(10))
        else:
            text = "".join(json.dumps({"id": i * 10 + j, "name": f"n{j}"}) + "\n"
                           for j in range(10))
        (source / f"f_{i}.{ext}").write_text(text)
    (source / f"f_8.{ext}").write_text("id,name\n" if ext == "csv" else "")  # empty, there
    victim = source / f"f_3.{ext}"
    report = _load_deleting(place, source, table, victim)
    status = {Path(f["uri"]).name: (f["status"], f["rows"], f["error"])
              for f in report["files"]}
    state, rows, error = status.pop(victim.name)
    assert state == "failed" and "vanished after listing" in error, error
    assert str(victim) in error and "\n" not in error
    assert status == {**{f"f_{i}.{ext}": ("loaded", 10, "") for i in (0, 1, 2, 4, 5, 6, 7)},
                      f"f_8.{ext}": ("loaded", 0, "")}
    assert place.count(table) == 70
    ledger = place.ledger(table)
    assert ledger.get(str(victim), ("", 0))[0] != "loaded"
    assert sorted(ledger[str(source / f"f_{i}.{ext}")][1] for i in (0, 1, 2, 4, 5, 6, 7)) == (
        [10] * 7)
    rerun = place.load(str(source), "-t", table, "--json")
    assert json.loads(rerun.stdout)["files_loaded"] == 0
    assert place.count(table) == 70


def test_a_medium_file_deleted_after_listing_fails_alone(tmp_path: Path,
                                                         target_dir: str) -> None:
    """Files of 1-16 MB share a stage (embedded): one gone fails the group before it
    commits, then fails alone; the others load once."""
    source = tmp_path / "medium"
    make_trips(str(source), 4, 300_000)  # ~1.6 MB each
    victim = source / "trips_002.csv.gz"
    report = _load_deleting(Place(target_dir, {}, "t"), source, "m", victim)
    status = {Path(f["uri"]).name: (f["status"], f["rows"]) for f in report["files"]}
    assert status.pop(victim.name) == ("failed", 0)
    assert set(status.values()) == {("loaded", 300_000)} and len(status) == 3
    assert [f["error"] for f in report["files"] if f["status"] == "failed"] == [
        f"{victim}: vanished after listing; it was not loaded (put it back and run the "
        "same command again to load it)"]
    assert Place(target_dir, {}, "t").count("m") == 900_000


# -- a group commit logs its stages in one statement --------------------------------

def test_a_crash_inside_a_group_commit_into_a_server_then_exactly_once(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    """Six stages commit as one group: another loader (this test) holds the table's
    commit lock until all six are filled, so they queue behind it and the first to get
    the lock takes the others into its group; a kill after the group's second ATTACH
    leaves six stages logged `committing`, two attached. The next load settles each
    stage by its own mark: every row exactly once (with one mark for the whole group,
    the stages after the second would count as attached and their rows be lost).

    The lock makes the group: without it, stages commit in groups of those filled by
    then (commit/batch.py), two when the machine is busy, and a kill after the second
    ATTACH would leave nothing unattached to settle."""
    place = Place(_server_url(clickhouse), _server_env(clickhouse), table_name, clickhouse)
    _write_a(tmp_path / "a")
    glob = str(tmp_path / "a" / "*.csv")
    lock = _hold_commit_lock(clickhouse, table_name)
    crash = subprocess.Popen(
        [sys.executable, "-m", "chload", "load", glob, "-t", table_name, "--workers",
         str(FILES_A), "--target", place.target, "--quiet"],
        env={**os.environ, **place.env, "CHLOAD_CRASH_AT": "attach-partition:2"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_while_running(crash, lambda: _filled_stages(clickhouse, crash.pid) == FILES_A,
                           "all six stages filled behind the held lock")
    finally:
        services.clickhouse_query(clickhouse, f"DROP TABLE IF EXISTS chload.{lock}")
    _, err = crash.communicate(timeout=120)
    assert crash.returncode == -signal.SIGKILL, err
    pending = services.clickhouse_query(
        clickhouse, f"SELECT count() FROM (SELECT uri, argMax(state, seq) AS s FROM "
        f"chload.files WHERE target_table = 'default.{table_name}' GROUP BY uri) "
        "WHERE s = 'committing'")
    assert int(pending) >= 3  # a group of several stages was logged, two attached
    assert place.count(table_name) < FILES_A * ROWS_A
    again = place.load(glob, "-t", table_name)
    assert again.returncode == 0, again.stderr
    assert place.count(table_name) == FILES_A * ROWS_A
    assert set(place.ledger(table_name).values()) == {("loaded", ROWS_A)}


def _hold_commit_lock(server: services.Service, table: str) -> str:
    """Take `default.<table>`'s commit lock on the server as a live loader would (this
    process is its holder, so no loader breaks it); its name, to drop it."""
    lock = lock_name(f"`default`.`{table}`")
    services.clickhouse_query(server, "CREATE DATABASE IF NOT EXISTS chload")
    services.clickhouse_query(
        server, f"CREATE TABLE chload.{lock} (holder String DEFAULT "
        f"'{Holder.this_process().encode()}') ENGINE = Memory")
    return lock


def _filled_stages(server: services.Service, pid: int) -> int:
    """How many stages of loader `pid` hold their rows (one part each, sealed)."""
    return int(services.clickhouse_query(
        server, "SELECT count() FROM (SELECT table FROM system.parts WHERE active AND "
        "database = 'chload' AND startsWith(table, 'stage_') AND splitByChar('_', table)[3] "
        f"= '{pid}' GROUP BY table HAVING count() = 1)"))
