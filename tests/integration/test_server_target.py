"""The server target end to end: the real `chload` command into a real ClickHouse 18.16
server over HTTP, results checked through SQL on the server; loaders SIGKILLed, the
server restarted, concurrent loaders."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import services
from common import make_trips
from conftest import run_chload

from chload.commit.committer import stage_name
from chload.commit.locks import Holder, _start_time, machine_id

pytestmark = pytest.mark.integration

FILES, ROWS = 10, 1_000_000  # the trips dataset: 10M rows in 10 gzip CSV files
TOTAL = FILES * ROWS


def url(server: services.Service, database: str = "default", user: str = "loader") -> str:
    return f"http://{user}@127.0.0.1:{server.ports['http']}/{database}"


def env(server: services.Service) -> dict[str, str]:
    return {"CLICKHOUSE_PASSWORD": server.credentials["password"]}


def q(server: services.Service, sql: str) -> str:
    return services.clickhouse_query(server, sql).strip()


def counts(server: services.Service, table: str) -> tuple[int, int]:
    a, b = q(server, f"SELECT count(), uniqExact(id) FROM {table}").split()
    return int(a), int(b)


def load(server: services.Service, *args: str, database: str = "default") -> tuple[int, dict]:
    out = run_chload("load", *args, "--target", url(server, database), "--json",
                     env=env(server), timeout=180)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}


@pytest.fixture(scope="module")
def trips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 gzip CSV files with a header, 1,000,000 rows each."""
    directory = tmp_path_factory.mktemp("server-trips")
    make_trips(str(directory), FILES, ROWS)
    return directory


def test_load_then_rerun_skips_all(clickhouse: services.Service, trips: Path,
                                   table_name: str) -> None:
    code, report = load(clickhouse, str(trips / "*.csv.gz"), "--table", table_name)
    assert code == 0, report
    assert (report["files_loaded"], report["rows_loaded"]) == (FILES, TOTAL)
    assert report["created_table"] and report["target"].startswith("ClickHouse 18.16")
    assert report["notes"] == []  # a server of no cluster: nothing said of other servers
    assert counts(clickhouse, table_name) == (TOTAL, TOTAL)
    costs = report["costs"]  # where the run's time went: before, during and after the rows
    assert 0 < costs["first_byte_s"] and 0 < costs["data_s"] <= report["seconds"]

    code, report = load(clickhouse, str(trips), "--table", table_name)
    assert (code, report["files_loaded"], report["files_skipped"]) == (0, 0, FILES)
    assert counts(clickhouse, table_name) == (TOTAL, TOTAL)

    ledger = run_chload("files", "--table", table_name, "--target", url(clickhouse), "--json",
                        env=env(clickhouse))
    rows = json.loads(ledger.stdout)
    assert len(rows) == FILES and {r["state"] for r in rows} == {"loaded"}
    assert sum(r["rows"] for r in rows) == TOTAL
    sql = run_chload("sql", f"SELECT count() FROM {table_name}", "--target", url(clickhouse),
                     "--format", "TSV", env=env(clickhouse))
    assert sql.stdout.strip() == str(TOTAL)
    ddl = q(clickhouse, f"SHOW CREATE TABLE {table_name}")
    assert "Nullable" not in ddl and "ORDER BY id" in ddl


# -- exactly once: loader SIGKILLs, a server restart -----------------------------------

def _start(server: services.Service, trips: Path, table: str,
           extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "chload", "load", str(trips / "*.csv.gz"), "--table", table,
         "--target", url(server), "--quiet"],
        env={**os.environ, **env(server), **(extra or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for(check: Callable[[], bool], proc: subprocess.Popen[bytes],
              timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"never happened (loader exit {proc.poll()})")


def _loaded_files(server: services.Service, table: str) -> int:
    return int(q(server, f"SELECT uniqExact(uri) FROM chload.files WHERE "
                         f"target_table = 'default.{table}' AND state = 'committing'") or 0)


def _stages(server: services.Service) -> int:
    return int(q(server, "SELECT count() FROM system.tables WHERE database = 'chload' "
                         "AND startsWith(name, 'stage_')"))


def test_sigkills_and_a_server_restart_then_exactly_once(
        clickhouse: services.Service, trips: Path, table_name: str) -> None:
    # 1. killed while stage inserts are in flight
    proc = _start(clickhouse, trips, table_name)
    _wait_for(lambda: _stages(clickhouse) > 0, proc)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL

    # 2. killed inside a commit window: committing logged, lock held, nothing attached
    # (the first group's: a later one would leave the next run too little to load)
    proc = _start(clickhouse, trips, table_name, {"CHLOAD_CRASH_AT": "server-before-attach:1"})
    assert proc.wait(timeout=120) == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    assert q(clickhouse, "SELECT count() FROM system.tables WHERE database = 'chload' AND "
                         "startsWith(name, 'lock_')") != "0"  # the dead loader's lock

    # 3. the server is killed and restarted while a run is loading, right after an
    # attach (each waits 2 s there: filled stages commit together, the whole run's
    # files at once when they finish together, which a poll would miss)
    before = _loaded_files(clickhouse, table_name)
    proc = _start(clickhouse, trips, table_name, {"CHLOAD_PAUSE_AT": "after-attach:2"})
    _wait_for(lambda: _loaded_files(clickhouse, table_name) > before, proc)
    clickhouse.restart(hard=True)
    proc.wait(timeout=180)  # it may finish (retries) or give some files up

    # 4. the final run settles everything: every row exactly once
    code, report = load(clickhouse, str(trips / "*.csv.gz"), "--table", table_name)
    assert code == 0, report
    assert counts(clickhouse, table_name) == (TOTAL, TOTAL)
    assert report["files_loaded"] + report["files_skipped"] == FILES
    leftovers = q(clickhouse, "SELECT name FROM system.tables WHERE database = 'chload' "
                              "AND match(name, '^(stage|lock|dirty)_')")
    assert leftovers == "", leftovers  # (named: a stage's name says its process)


def test_a_dead_loaders_stage_is_dropped_though_its_pid_runs_again(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    """A stage named for a process that is gone is dropped by the next load, though its
    pid now names another live process (pids are given again, to processes and
    threads); a stage of a live process is kept."""
    (tmp_path / "a.csv").write_text("id\n1\n")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        machine, start = machine_id(), _start_time(other.pid)
        dead = stage_name(Holder(machine, other.pid, start - 1))  # its pid, given again
        alive = stage_name(Holder(machine, other.pid, start))
        q(clickhouse, "CREATE DATABASE IF NOT EXISTS chload")
        for stage in (dead, alive):
            q(clickhouse, f"CREATE TABLE chload.{stage} (id UInt64) ENGINE = MergeTree "
                          "ORDER BY id")
        code, report = load(clickhouse, str(tmp_path / "a.csv"), "--table", table_name)
        assert code == 0, report
        stages = q(clickhouse, "SELECT name FROM system.tables WHERE database = 'chload' "
                               f"AND name IN ('{dead}', '{alive}')").split()
        assert stages == [alive]
    finally:
        other.kill()
        other.wait()
        q(clickhouse, f"DROP TABLE IF EXISTS chload.{alive}")


def test_the_server_killed_after_a_commit_the_run_reports_it(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    """The server dies right after the run's first commit (each commit waits 2 s after
    its attach, and the test kills the server then): the other files fail, and the run
    ends with its report, exit 1 (not 2, "nothing was loaded"): the committed file
    loaded, the run's last writes in `errors`. A rerun loads the rest exactly once."""
    make_trips(str(tmp_path), 4, 150_000)  # above 512 KB: a unit each
    files = str(tmp_path / "*.csv.gz")
    proc = subprocess.Popen(
        [sys.executable, "-m", "chload", "load", files, "--table", table_name, "--target",
         url(clickhouse), "--json", "--workers", "1"],
        env={**os.environ, **env(clickhouse), "CHLOAD_PAUSE_AT": "after-attach:2"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _rows(clickhouse, table_name) > 0, proc)
        time.sleep(0.3)  # the ATTACH's answer on its way (the commit waits 2 s)
        clickhouse.kill()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        clickhouse.restart()
    assert proc.returncode == 1, (out, err)
    report = json.loads(out)
    assert (report["files_loaded"], report["rows_loaded"]) == (1, 150_000), report
    assert report["files_failed"] == 3
    assert any("chload history will not list it" in e for e in report["errors"]), report
    code, again = load(clickhouse, files, "--table", table_name)
    assert code == 0, again
    assert again["files_loaded"] + again["files_skipped"] == 4  # (an interrupted commit
    assert counts(clickhouse, table_name) == (600_000, 600_000)  # settled: skipped)


def _rows(server: services.Service, table: str) -> int:
    try:
        return int(q(server, f"SELECT count() FROM {table}"))
    except RuntimeError:  # not created yet
        return 0


def test_two_loaders_at_once_one_killed_in_its_commit(
        clickhouse: services.Service, trips: Path, table_name: str) -> None:
    """Two processes commit into one table; one dies holding the commit lock, the other
    breaks the lock (dead pid on this machine), settles the file, and goes on."""
    first = _start(clickhouse, trips, table_name, {"CHLOAD_CRASH_AT": "server-after-attach:1"})
    # The second starts once the first is loading, so the first commits a file before
    # the second could commit them all (then the first would attach nothing, crash nowhere).
    _wait_for(lambda: q(clickhouse, "SELECT count() FROM system.tables WHERE database = "
                                    "'chload' AND startsWith(name, 'stage_') AND "
                                    f"position(name, '_{first.pid}_') > 0") != "0", first)
    second = _start(clickhouse, trips, table_name)
    assert first.wait(timeout=120) == -signal.SIGKILL
    second.wait(timeout=180)
    code, _ = load(clickhouse, str(trips / "*.csv.gz"), "--table", table_name)
    assert code == 0
    assert counts(clickhouse, table_name) == (TOTAL, TOTAL)


def test_small_files_batched_exactly_once_after_a_kill(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    """Small files share a stage and a commit; a loader killed inside a batch's commit
    leaves it to the next run, and every file's rows are counted on their own."""
    make_trips(str(tmp_path), 40, 2000)
    files = str(tmp_path / "*.csv.gz")
    crash = run_chload("load", files, "--table", table_name, "--target", url(clickhouse),
                       env={**env(clickhouse), "CHLOAD_CRASH_AT": "server-before-attach:1"})
    assert crash.returncode == -signal.SIGKILL
    code, report = load(clickhouse, files, "--table", table_name)
    assert code == 0, report
    assert counts(clickhouse, table_name) == (80_000, 80_000)
    ledger = run_chload("files", "--table", table_name, "--target", url(clickhouse), "--json",
                        env=env(clickhouse))
    assert {(r["state"], r["rows"]) for r in json.loads(ledger.stdout)} == {("loaded", 2000)}
    code, report = load(clickhouse, files, "--table", table_name)
    assert (code, report["files_skipped"]) == (0, 40)


def test_many_small_csv_files_go_in_a_request_a_batch_and_a_bad_one_fails_alone(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    """300 small CSV files in 3 directories, which the server could parse a request each,
    are read by the loader's engine a batch at a time (one request for all its files:
    costs.data_requests); each file's rows are counted, and a bad file fails alone."""
    for i in range(300):
        directory = tmp_path / f"d{i // 100}"
        directory.mkdir(exist_ok=True)
        (directory / f"f{i:03d}.csv").write_text(
            "id,v\n" + "".join(f"{i * 10 + j},{j}\n" for j in range(10)))
    bad = tmp_path / "d1" / "f150.csv"
    bad.write_text("id,v\n1,2\nnot,a,number\n")
    code, report = load(clickhouse, str(tmp_path / "*" / "*.csv"), "--table", table_name)
    assert (code, report["files_loaded"], report["files_failed"]) == (1, 299, 1), report
    assert report["costs"]["data_requests"] < 100, report["costs"]  # not one a file
    assert counts(clickhouse, table_name) == (2990, 2990)
    ledger = json.loads(run_chload("files", "--table", table_name, "--target", url(clickhouse),
                                   "--json", env=env(clickhouse)).stdout)
    assert {r["rows"] for r in ledger if r["state"] == "loaded"} == {10}
    assert [r["uri"] for r in ledger if r["state"] == "failed"] == [str(bad)]


def test_small_json_files_gathered_by_the_loaders_engine(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    """JSON lines with strings and dates go through one chDB read per batch: every file's
    rows counted on their own, audit columns per row, a bad file still fails alone."""
    for i in range(30):
        lines = "".join(json.dumps({"id": i * 100 + j, "name": f"n\u00e9{j}", "at":
                                    f"2024-01-0{1 + j % 9} 10:00:00", "tags": ["a", str(j)]})
                        + "\n" for j in range(100))
        (tmp_path / f"s_{i:02d}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    (tmp_path / "s_17.jsonl.gz").write_bytes(gzip.compress(b'{"id": "x", "name": 1}\n'))
    files = str(tmp_path / "*.jsonl.gz")
    code, report = load(clickhouse, files, "--table", table_name, "--audit", "--schema",
                        "id UInt64, name String, at DateTime, tags Array(String)")
    assert (code, report["files_loaded"], report["files_failed"]) == (1, 29, 1), report
    assert counts(clickhouse, table_name) == (2900, 2900)
    per_file = q(clickhouse, f"SELECT uniqExact(_source_file), min(c), max(c) FROM (SELECT "
                             f"_source_file, count() AS c FROM {table_name} GROUP BY "
                             f"_source_file)")
    assert per_file == "29\t100\t100"
    assert q(clickhouse, f"SELECT count() FROM {table_name} WHERE name LIKE 'n\u00e9%' AND "
                         f"length(tags) = 2 AND toYear(at) = 2024") == "2900"
    ledger = json.loads(run_chload("files", "--table", table_name, "--target", url(clickhouse),
                                   "--json", env=env(clickhouse)).stdout)
    assert {(r["state"], r["rows"]) for r in ledger if r["state"] == "loaded"} == {
        ("loaded", 100)}
    assert [r["uri"] for r in ledger if r["state"] == "failed"] == [str(tmp_path / "s_17.jsonl.gz")]


# -- formats, types, databases ---------------------------------------------------------

def _parquet(path: Path, rows: int) -> None:
    import chdb

    chdb.query(
        f"INSERT INTO FUNCTION file('{path}', 'Parquet') SELECT number AS id, "
        "toString(number % 1000) AS name, if(number % 3 = 0, NULL, number * 2) AS maybe, "
        "toDate('2024-01-01') + toIntervalDay(number % 100) AS day, number % 2 = 1 AS flag, "
        f"number / 4 AS ratio FROM numbers({rows}) SETTINGS engine_file_truncate_on_insert = 1")


def test_parquet_loads_into_1816_through_the_loaders_engine(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    path = tmp_path / "events.parquet"
    _parquet(path, 300_000)
    code, report = load(clickhouse, str(path), "--table", table_name,
                        "--schema", "id UInt64, name String, maybe Nullable(UInt64), "
                        "day Date, flag UInt8, ratio Float64")
    assert code == 0, report
    assert report["rows_loaded"] == 300_000
    got = q(clickhouse, f"SELECT count(), uniqExact(id), sum(id), countIf(isNull(maybe)), "
                        f"sum(maybe), max(day), sum(flag), sum(ratio) FROM {table_name}")
    expect = "\t".join(map(str, [300_000, 300_000, sum(range(300_000)), 100_000,
                                 sum(2 * i for i in range(300_000) if i % 3), "2024-04-09",
                                 150_000, sum(range(300_000)) // 4]))
    assert got == expect


def test_parquet_inferred_types_map_down_or_say_what_to_do(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    import chdb

    path = tmp_path / "typed.parquet"
    chdb.query(f"INSERT INTO FUNCTION file('{path}', 'Parquet') SELECT number AS id, "
               "number % 2 = 1 AS flag, toLowCardinality(toString(number % 7)) AS kind, "
               "if(number % 3 = 0, NULL, 'x') AS maybe FROM numbers(1000)")
    code, report = load(clickhouse, str(path), "--table", table_name)
    assert code == 0, report
    ddl = q(clickhouse, f"SHOW CREATE TABLE {table_name}")
    assert "flag UInt8" in ddl and "kind String" in ddl and "maybe Nullable(String)" in ddl
    assert q(clickhouse, f"SELECT sum(flag), countIf(isNull(maybe)) FROM {table_name}") == \
        "500\t334"

    stamped = tmp_path / "stamped.parquet"
    chdb.query(f"INSERT INTO FUNCTION file('{stamped}', 'Parquet') SELECT number AS id, "
               "toDateTime64(number, 3) AS at FROM numbers(10)")
    out = run_chload("load", str(stamped), "--table", table_name + "_ts", "--target",
                     url(clickhouse), env=env(clickhouse))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "DateTime64(3" in out.stderr and "--schema" in out.stderr
    # into a table that exists, the table's types decide: the engine converts
    q(clickhouse, f"CREATE TABLE {table_name}_ts (id UInt64, at DateTime) ENGINE = MergeTree "
                  "ORDER BY id")
    code, report = load(clickhouse, str(stamped), "--table", table_name + "_ts")
    assert code == 0, report
    assert q(clickhouse, f"SELECT count(), max(at) FROM {table_name}_ts") == \
        "10\t1970-01-01 00:00:09"


def test_gzip_csv_through_the_loaders_engine_too(clickhouse: services.Service, trips: Path,
                                                table_name: str) -> None:
    """?path=push: chDB parses what the server could, and the rows are the same."""
    out = run_chload("load", str(trips / "trips_00{0..2}.csv.gz"), "--table", table_name,
                     "--target", url(clickhouse) + "?path=push", "--json", env=env(clickhouse))
    assert out.returncode == 0, out.stderr
    assert counts(clickhouse, table_name) == (3 * ROWS, 3 * ROWS)
    assert q(clickhouse, f"SELECT sum(miles * 6 = duration) FROM {table_name}") == str(3 * ROWS)


def test_database_from_the_url(clickhouse: services.Service, trips: Path) -> None:
    database = f"db_{uuid.uuid4().hex[:8]}"
    code, report = load(clickhouse, str(trips / "trips_000.csv.gz"), "--table", "trips",
                        database=database)
    assert code == 0 and report["table"] == f"{database}.trips"
    assert q(clickhouse, f"SELECT count() FROM {database}.trips") == str(ROWS)


def test_audit_columns_come_from_the_engine(clickhouse: services.Service, trips: Path,
                                           table_name: str) -> None:
    code, _ = load(clickhouse, str(trips / "trips_00{0..1}.csv.gz"), "--table", table_name,
                   "--audit")
    assert code == 0
    got = q(clickhouse, f"SELECT _source_file, count() FROM {table_name} GROUP BY "
                        f"_source_file ORDER BY _source_file")
    assert got == f"{trips}/trips_000.csv.gz\t{ROWS}\n{trips}/trips_001.csv.gz\t{ROWS}"


# -- failures are one readable line ----------------------------------------------------

def test_wrong_password_is_one_line_without_the_secret(
        clickhouse: services.Service, trips: Path, table_name: str) -> None:
    secret = f"not-it-{uuid.uuid4().hex}"
    for target, extra in ((url(clickhouse), {"CLICKHOUSE_PASSWORD": secret}),
                          (url(clickhouse).replace("loader@", f"loader:{secret}@"), {})):
        out = run_chload("load", str(trips), "--table", table_name, "--target", target,
                         env=extra)
        assert out.returncode == 2
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "authentication failed" in out.stderr and "loader" in out.stderr
        assert secret not in out.stdout + out.stderr

    password = clickhouse.credentials["password"]
    code, report = load(clickhouse, str(trips / "trips_000.csv.gz"), "--table", table_name)
    assert code == 0 and password not in json.dumps(report)
    leaks = q(clickhouse, f"SELECT (SELECT count() FROM chload.files WHERE "
                          f"positionCaseInsensitive(concat(uri, error, stage, target_table), "
                          f"'{password}') > 0) + (SELECT count() FROM chload.runs WHERE "
                          f"position(concat(sources, host), '{password}') > 0)")
    assert leaks == "0"


def test_bad_rows_fail_that_file_alone(clickhouse: services.Service, trips: Path,
                                       tmp_path: Path, table_name: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text('"id","miles","duration","vehicle_id"\n1,2,3,4\nnot-a-number,2,3,4\n')
    code, report = load(clickhouse, str(trips / "trips_000.csv.gz"), str(bad), "--table",
                        table_name)
    assert code == 1 and report["files_loaded"] == 1 and report["files_failed"] == 1
    failed = next(f for f in report["files"] if f["status"] == "failed")
    assert failed["uri"] == str(bad) and "bad.csv" in failed["error"]
    assert "\n" not in failed["error"] and "not-a-number" in failed["error"]
    assert counts(clickhouse, table_name) == (ROWS, ROWS)


def test_unreachable_server_is_one_line(tmp_path: Path) -> None:
    port = services.free_ports(1)[0]
    data = tmp_path / "a.csv"
    data.write_text("id\n1\n")
    out = run_chload("load", str(data), "--table", "t", "--target",
                     f"http://127.0.0.1:{port}/default")
    assert out.returncode == 2
    assert out.stderr.strip() == (f"chload: server 127.0.0.1:{port} unreachable: "
                                  "Connection refused")


@pytest.fixture
def good_and_bad(tmp_path: Path) -> Path:
    """good.csv.gz: 1,000 rows; bad.csv.gz: 1,000 rows, 7 with "abc" as miles."""
    bad_rows = {5, 100, 250, 500, 501, 777, 1000}
    for name, bad in (("good", set()), ("bad", bad_rows)):
        first = 1000 if bad else 0  # ids 1-1000 good, 1001-2000 bad
        rows = "".join(f"{first + i},{'abc' if i in bad else i % 100},{i % 7}\n"
                       for i in range(1, 1001))
        (tmp_path / f"{name}.csv.gz").write_bytes(gzip.compress(
            ("id,miles,duration\n" + rows).encode()))
    return tmp_path


def test_error_budget_keeps_rejects_in_the_server(clickhouse: services.Service,
                                                  good_and_bad: Path, table_name: str) -> None:
    """A load with an error budget into 18.16: the loader's engine parses within the budget, the
    rejected rows land in the server's chload.rejects; over budget, the file leaves
    nothing."""
    glob = str(good_and_bad / "*.csv.gz")
    code, report = load(clickhouse, glob, "--table", table_name, "--max-errors", "10")
    assert code == 0 and (report["rows_loaded"], report["rows_rejected"]) == (1993, 7)
    assert counts(clickhouse, table_name) == (1993, 1993)
    out = run_chload("errors", "--table", table_name, "--target", url(clickhouse), "--json",
                     env=env(clickhouse))
    rejected = json.loads(out.stdout)
    assert [r["line"] for r in rejected] == [6, 101, 251, 501, 502, 778, 1001]
    assert all(r["file"].endswith("bad.csv.gz") and ",abc," in r["raw"] and "miles" in
               r["error"] for r in rejected)
    code, report = load(clickhouse, glob, "--table", table_name + "_3", "--max-errors", "3")
    assert code == 1 and (report["files_loaded"], report["files_failed"]) == (1, 1)
    assert counts(clickhouse, table_name + "_3") == (1000, 1000)
    checks = json.loads(run_chload("validate", glob, "--table", table_name, "--target",
                                   url(clickhouse), "--max-errors", "3", "--json",
                                   env=env(clickhouse)).stdout)
    assert [(c["rows"], c["errors"], c["within_budget"]) for c in checks] == [
        (993, 7, False), (1000, 0, True)]


def test_system_table_queries_ride_out_tables_dropped_meanwhile(
        clickhouse: services.Service) -> None:
    """18.16 fails a query over system.tables with "Table X doesn't exist" when any table
    of the listed database is dropped meanwhile (every commit drops its stage): chload's
    own system queries ask again. Two threads churn tables while both a plain query and
    the target's rows() list the database, for at most 30 s."""
    import threading

    from chload.targets.registry import TargetSpec, open_target

    database = f"churn_{uuid.uuid4().hex[:8]}"
    q(clickhouse, f"CREATE DATABASE {database}")
    env = {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    target = open_target(TargetSpec.resolve(url(clickhouse), env))
    listing = (f"SELECT name FROM system.tables WHERE database = '{database}' "
               "AND name = 'absent'")
    stop = threading.Event()

    def churn(k: int) -> None:
        for i in range(100_000):
            if stop.is_set():
                return
            q(clickhouse, f"CREATE TABLE {database}.s{k}_{i} (x UInt8) ENGINE = TinyLog")
            q(clickhouse, f"DROP TABLE {database}.s{k}_{i}")

    threads = [threading.Thread(target=churn, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    plain_failures = answered = 0
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (plain_failures < 3 or answered < 300):
            try:
                q(clickhouse, listing)
            except RuntimeError as exc:
                assert "doesn't exist" in str(exc), exc
                plain_failures += 1
            assert target.rows(listing) == []
            answered += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        target.close()
        q(clickhouse, f"DROP DATABASE {database}")
    assert plain_failures >= 1, "the race did not show in 30 s: nothing was tested"


def test_auto_workers_adapt_to_backpressure_and_record_why(
        clickhouse: services.Service, trips: Path, table_name: str) -> None:
    """`--workers auto` (the default) into 18.16 into a table that has 125 parts in one
    partition (merges stopped), near `parts_to_delay_insert` (150): the controller
    lowers the streams, the load is exact, and every change with its reason is in the
    report and in the run's record (`chload history`)."""
    pile = 125
    q(clickhouse, f"CREATE TABLE {table_name} (id UInt64, miles UInt32, duration UInt32, "
                  "vehicle_id UInt8) ENGINE = MergeTree ORDER BY id")
    q(clickhouse, f"SYSTEM STOP MERGES {table_name}")
    try:
        for i in range(pile):
            q(clickhouse, f"INSERT INTO {table_name} VALUES ({TOTAL + i}, 1, 6, 0)")
        started = time.monotonic()
        code, report = load(clickhouse, str(trips / "*.csv.gz"), "--table", table_name,
                            "--workers", "auto")
        assert time.monotonic() - started < 120
    finally:
        q(clickhouse, f"SYSTEM START MERGES {table_name}")
    assert code == 0, report
    assert counts(clickhouse, table_name) == (TOTAL + pile, TOTAL + pile)
    streams = report["concurrency"]
    cores = int(q(clickhouse, "SELECT value FROM system.settings WHERE name = 'max_threads'"))
    assert streams["mode"] == "auto" and streams["maximum"] == min(16, 4 * cores)
    assert streams["changes"] and streams["final"] < streams["start"]
    assert any("parts_to_delay_insert" in c["reason"] for c in streams["changes"])
    assert all(1 <= c["to"] <= streams["maximum"] and c["reason"] for c in streams["changes"])
    history = run_chload("history", "--table", table_name, "--target", url(clickhouse),
                         "--json", env=env(clickhouse))
    runs = json.loads(history.stdout)
    assert json.loads(runs[0]["concurrency"]) == streams

    code, report = load(clickhouse, str(trips / "*.csv.gz"), "--table", table_name,
                        "--workers", "3", "--force")
    assert code == 0 and report["concurrency"]["mode"] == "fixed"
    assert report["concurrency"]["final"] == 3 and not report["concurrency"]["changes"]
