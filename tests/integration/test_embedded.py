"""The embedded target end to end: the real `chload` command into a real chDB directory,
results checked through SQL."""

from __future__ import annotations

import functools
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from common import make_trips
from conftest import kill_moments, kill_when, run_chload, top_block

pytestmark = pytest.mark.integration


def count(target: str, table: str) -> tuple[int, int]:
    out = run_chload("sql", f"SELECT count(), uniqExact(id) FROM {table}", "--target", target,
                     "--format", "TSV")
    assert out.returncode == 0, out.stderr
    a, b = out.stdout.split()
    return int(a), int(b)


def load_json(*args: str) -> tuple[int, dict]:
    out = run_chload("load", *args, "--json")
    assert not out.stderr.strip().startswith("Traceback"), out.stderr
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}


@pytest.fixture(scope="module")
def trips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 gzip CSV files with a header, 50,000 rows each (1,000,000 rows)."""
    directory = tmp_path_factory.mktemp("trips")
    make_trips(str(directory), 20, 50_000)
    return directory


def test_load_rerun_force(trips: Path, target_dir: str) -> None:
    code, report = load_json(str(trips / "*.csv.gz"), "--table", "trips", "--target", target_dir)
    assert code == 0
    assert (report["files_loaded"], report["rows_loaded"]) == (20, 1_000_000)
    assert report["files_failed"] == 0 and report["bytes_read"] > 0
    assert count(target_dir, "trips") == (1_000_000, 1_000_000)
    costs = report["costs"]  # the fixed and per-unit costs, as a server target reports them
    assert costs["files"] == 20 and 1 <= costs["units"] <= 20
    assert costs["data_requests"] >= costs["units"] and costs["setup_requests"] > 0
    assert 0 < costs["first_byte_s"] < report["seconds"] + 60
    assert 0 < costs["data_s"] <= report["seconds"]  # the rows' span, inside the run
    assert costs["commit_requests_per_unit"] > 0 and costs["commit_seconds_per_unit"] > 0

    code, report = load_json(str(trips), "--table", "trips", "--target", target_dir)
    assert (code, report["files_loaded"], report["files_skipped"]) == (0, 0, 20)
    assert count(target_dir, "trips") == (1_000_000, 1_000_000)

    code, report = load_json(str(trips / "trips_00{0..1}.csv.gz"), "--table", "trips",
                             "--target", target_dir, "--force")
    assert (code, report["files_loaded"], report["rows_loaded"]) == (0, 2, 100_000)
    assert count(target_dir, "trips") == (1_100_000, 1_000_000)

    ledger = run_chload("files", "--table", "trips", "--target", target_dir, "--json")
    rows = json.loads(ledger.stdout)
    assert len(rows) == 20 and {r["state"] for r in rows} == {"loaded"}
    assert all(r["rows"] == 50_000 for r in rows)


def test_inferred_schema_is_sensible(trips: Path, target_dir: str) -> None:
    load_json(str(trips / "trips_000.csv.gz"), "--table", "t", "--target", target_dir)
    ddl = run_chload("sql", "SHOW CREATE TABLE t", "--target", target_dir, "--format", "TSVRaw")
    assert "Nullable" not in ddl.stdout  # no column of the data holds a NULL
    assert "ORDER BY id" in ddl.stdout and "MergeTree" in ddl.stdout


def test_changed_file_is_refused_and_reported_until_force(tmp_path: Path,
                                                         target_dir: str) -> None:
    data = tmp_path / "a.csv"
    data.write_text("id,v\n1,x\n2,y\n")
    load_json(str(data), "--table", "t", "--target", target_dir)
    data.write_text("id,v\n3,z\n")
    os.utime(data, ns=(time.time_ns(), time.time_ns() + 10**9))
    code, report = load_json(str(data), "--table", "t", "--target", target_dir)
    assert (code, report["files_loaded"], report["files_failed"],
            report["files_changed"]) == (1, 0, 1, 1)
    assert report["files"][0]["error"].startswith(f"{data}: changed since it was loaded")
    assert count(target_dir, "t") == (2, 2)  # its earlier rows, not doubled
    code, report = load_json(str(data), "--table", "t", "--target", target_dir, "--force")
    assert (code, report["files_loaded"], report["files_changed"]) == (0, 1, 1)
    assert count(target_dir, "t") == (3, 3)


def test_real_data_round_trips_exactly(tmp_path: Path, target_dir: str) -> None:
    """NULLs, timestamps and unicode arrive as the files hold them."""
    (tmp_path / "people.csv").write_text(
        "id,name,born,score,note\n"
        "1,Zoë,2026-01-02 03:04:05,1.5,\n"
        '2,日本語,2026-01-03 00:00:00,,"quoted, with comma"\n'
        '3,"",2026-01-04 10:00:00,2.25,x\n'
    )
    (tmp_path / "events.jsonl").write_text(
        '{"id": 1, "tag": null, "at": "2026-05-01 12:00:00", "emoji": "🦆"}\n'
        '{"id": 2, "tag": "b", "at": "2026-05-02 13:30:00", "emoji": "ß"}\n'
    )
    assert load_json(str(tmp_path / "people.csv"), "--table", "people",
                     "--target", target_dir)[0] == 0
    assert load_json(str(tmp_path / "events.jsonl"), "--table", "events",
                     "--target", target_dir)[0] == 0
    out = run_chload("sql", "SELECT id, name, toString(born), score, note FROM people ORDER BY id",
                     "--target", target_dir, "--format", "TSV").stdout
    assert out.splitlines() == [
        "1\tZoë\t2026-01-02 03:04:05\t1.5\t\\N",
        "2\t日本語\t2026-01-03 00:00:00\t\\N\tquoted, with comma",
        "3\t\t2026-01-04 10:00:00\t2.25\tx",
    ]
    out = run_chload("sql", "SELECT id, tag, toString(at), emoji FROM events ORDER BY id",
                     "--target", target_dir, "--format", "TSV").stdout
    assert out.splitlines() == ["1\t\\N\t2026-05-01 12:00:00\t🦆", "2\tb\t2026-05-02 13:30:00\tß"]
    ddl = run_chload("sql", "SHOW CREATE TABLE people", "--target", target_dir,
                     "--format", "TSVRaw").stdout
    assert "`id` Int64" in ddl and "`score` Nullable(Float64)" in ddl


def test_bad_file_fails_alone(trips: Path, tmp_path: Path, target_dir: str) -> None:
    bad = tmp_path / "broken.csv.gz"
    good = gzip.compress((trips / "trips_000.csv.gz").read_bytes())  # noqa: F841
    bad.write_bytes(gzip.compress(b"id,miles,duration,vehicle_id\n1,2,3,4\n")[:-12])
    out = run_chload("load", str(trips / "trips_00{0..2}.csv.gz"), str(bad), "--table", "trips",
                     "--target", target_dir, "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1
    assert (report["files_loaded"], report["files_failed"]) == (3, 1)
    failed = [f for f in report["files"] if f["status"] == "failed"]
    assert "broken.csv.gz" in failed[0]["error"] and "\n" not in failed[0]["error"]
    assert "Traceback" not in out.stderr
    assert count(target_dir, "trips") == (150_000, 150_000)  # nothing from the bad file
    ledger = json.loads(run_chload("files", "--table", "trips", "--target", target_dir,
                                   "--json").stdout)
    assert [r["state"] for r in ledger if r["uri"].endswith("broken.csv.gz")] == ["failed"]
    quiet = run_chload("load", str(bad), "--table", "trips", "--target", target_dir, "--quiet")
    assert quiet.returncode == 1 and quiet.stdout == ""  # --quiet still says what failed
    lines = [line for line in quiet.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "broken.csv.gz" in lines[0]


@pytest.mark.parametrize("argv, expected", [
    (["nope/*.csv", "--table", "t"], "nope/*.csv: no such file"),
    (["{data}", "--table", "1bad"], "--table 1bad"),
    (["{data}", "--table", "t", "--compression", "rar"], "--compression rar: unknown"),
    (["{data}", "--table", "t", "--setting", "oops"], "--setting oops: write it as name=value"),
])
def test_usage_errors_are_one_line(tmp_path: Path, target_dir: str, argv: list[str],
                                   expected: str) -> None:
    data = tmp_path / "x.csv"
    data.write_text("a\n1\n")
    args = [a.replace("{data}", str(data)) for a in argv]
    out = run_chload("load", *args, "--target", target_dir)
    assert out.returncode == 2
    assert expected in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_an_error_before_loading_answers_json_too(tmp_path: Path, target_dir: str) -> None:
    out = run_chload("load", str(tmp_path / "missing.csv"), "--table", "t", "--target",
                     target_dir, "--json")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert json.loads(out.stdout) == {"error": f"{tmp_path / 'missing.csv'}: no such file or "
                                      "directory", "kind": "SourceError"}


def test_schema_mismatch_is_one_line(tmp_path: Path, target_dir: str) -> None:
    (tmp_path / "a.csv").write_text("id,v\n1,x\n")
    (tmp_path / "b.csv").write_text("id,w,z\n1,x,y\n")
    assert load_json(str(tmp_path / "a.csv"), "--table", "t", "--target", target_dir)[0] == 0
    out = run_chload("load", str(tmp_path / "b.csv"), "--table", "t", "--target", target_dir)
    assert out.returncode == 2
    assert "not in the table: w, z" in out.stderr and "not in the data: v" in out.stderr


def test_second_process_gets_in_use(trips: Path, target_dir: str) -> None:
    first = subprocess.Popen([sys.executable, "-m", "chload", "load", str(trips), "--table",
                              "trips", "--target", target_dir, "--quiet"])
    try:
        time.sleep(0.3)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(target_dir, ".chload.lock")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        out = run_chload("sql", "SELECT 1", "--target", target_dir)
        if first.poll() is None:
            assert out.returncode == 2 and "is in use by another chload process" in out.stderr
    finally:
        first.wait(timeout=120)


def test_audit_columns_come_from_the_engine(trips: Path, target_dir: str) -> None:
    code, _ = load_json(str(trips / "trips_00{0..1}.csv.gz"), "--table", "a", "--audit",
                        "--target", target_dir)
    assert code == 0
    out = run_chload("sql", "SELECT _source_file, count(), min(_loaded_at) > now() - 600 "
                     "FROM a GROUP BY _source_file ORDER BY 1", "--target", target_dir,
                     "--format", "TSV").stdout.splitlines()
    assert [line.split("\t") for line in out] == [
        [str(trips / "trips_000.csv.gz"), "50000", "1"],
        [str(trips / "trips_001.csv.gz"), "50000", "1"],
    ]


def test_stdin(target_dir: str) -> None:
    out = run_chload("load", "-", "--table", "s", "--format", "CSVWithNames", "--target",
                     target_dir, "--json", stdin=b"a,b\n1,x\n2,y\n")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows_loaded"] == 2
    again = run_chload("load", "-", "--table", "s", "--format", "CSVWithNames", "--target",
                       target_dir, "--json", stdin=b"a,b\n3,z\n")
    assert json.loads(again.stdout)["rows_loaded"] == 1  # a stream is never skipped


def test_python_api(trips: Path, target_dir: str) -> None:
    import chload

    report = chload.load([str(trips / "trips_00{0..3}.csv.gz")], table="trips",
                         target=target_dir)
    assert (report.files_loaded, report.rows_loaded, report.ok) == (4, 200_000, True)
    again = chload.load(str(trips / "trips_00{0..3}.csv.gz"), table="trips", target=target_dir)
    assert (again.files_loaded, again.files_skipped) == (0, 4)
    assert [e.state for e in chload.files("trips", target=target_dir)] == ["loaded"] * 4
    assert chload.sql("SELECT count() FROM trips", target=target_dir).strip() == "200000"
    runs = chload.history("trips", target=target_dir)
    assert [r["files_loaded"] for r in runs] == [0, 4]


# -- exactly once under SIGKILL ----------------------------------------------------------

def _start(trips: Path, target: str, env: dict[str, str] | None = None,
           *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "chload", "load", str(trips), "--table", "trips", "--target",
         target, "--quiet", *extra], env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def big_trips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trips dataset: 20 gzip CSV files of 1,000,000 rows, several seconds to load.
    Each file is large enough to load (and commit) alone, not in a batch of small files."""
    directory = tmp_path_factory.mktemp("big_trips")
    make_trips(str(directory), 20, 1_000_000)
    return directory


def _commit_groups(directory: Path, workers: int) -> list[int]:
    """Files per commit, in commit order, as the embedded target groups them."""
    from chload.commit.rejects import ErrorBudget
    from chload.sources.files.local import list_local
    from chload.targets.embedded.target import plan_groups

    return [len(g) for g in plan_groups(list_local(str(directory), None, None),
                                        ErrorBudget(), workers)]


@pytest.mark.parametrize("point, commits", [("before-attach:3", 2), ("after-attach:2", 2)])
def test_crash_inside_the_commit_window(big_trips: Path, target_dir: str, point: str,
                                        commits: int) -> None:
    """One worker, so commits happen in plan order: a crash just before the 3rd attach
    leaves the files of the first 2 commits, a crash just after the 2nd (ledger not yet
    written) keeps its files, and the next run loads every other row exactly once."""
    groups = _commit_groups(big_trips, 1)
    assert len(groups) >= 3 and sum(groups) == 20  # 5 MB files: several per commit
    proc = _start(big_trips, target_dir, {"CHLOAD_CRASH_AT": point}, "--workers", "1")
    assert proc.wait(timeout=120) == -signal.SIGKILL
    assert count(target_dir, "trips")[0] == sum(groups[:commits]) * 1_000_000
    final = _start(big_trips, target_dir)
    assert final.wait(timeout=180) == 0, final.stderr.read() if final.stderr else ""
    assert count(target_dir, "trips") == (20_000_000, 20_000_000)


def test_medium_files_share_a_stage_and_a_bad_one_fails_alone(tmp_path: Path,
                                                              target_dir: str) -> None:
    """Files of 1-16 MB load several to a stage and a commit; a corrupt one among them
    fails the group before anything is committed, then loads (and fails) alone."""
    data_dir = tmp_path / "medium"
    make_trips(str(data_dir), 6, 300_000)  # ~1.6 MB each
    data = (data_dir / "trips_003.csv.gz").read_bytes()
    (data_dir / "trips_003.csv.gz").write_bytes(data[: len(data) * 3 // 4])  # truncated
    assert _commit_groups(data_dir, 2) == [3, 3]
    code, report = load_json(str(data_dir), "--table", "m", "--target", target_dir)
    assert code == 1 and (report["files_loaded"], report["files_failed"]) == (5, 1)
    assert count(target_dir, "m") == (5 * 300_000, 5 * 300_000)
    ledger = json.loads(run_chload("files", "--table", "m", "--target", target_dir,
                                   "--json").stdout)
    assert sorted((r["state"], r["rows"]) for r in ledger) == [("failed", 0)] + [
        ("loaded", 300_000)] * 5


def _rows_so_far(target: str, table: str) -> int:
    """Rows committed into `table` so far; 0 before the table exists (a loaded machine
    can kill the first load before it created it)."""
    if not os.path.exists(target):
        return 0
    out = run_chload("sql", "SELECT sum(rows) FROM system.parts WHERE active AND "
                     f"database = 'default' AND table = '{table}'", "--target", target,
                     "--format", "TSV")
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip() or 0)


def test_sigkill_at_three_moments_then_resume(big_trips: Path, target_dir: str) -> None:
    """Kill a loading process at three moments, each seen on disk before the kill: while
    its first stages fill (nothing committed), right after its first commit, and while a
    rerun's stage fills over committed rows. The final run completes the load with every
    row exactly once."""
    seen = []
    for what, ready in kill_moments(target_dir, "trips"):
        before = top_block(target_dir, "trips")
        proc = _start(big_trips, target_dir)
        kill_when(proc, functools.partial(ready, proc.pid, before), what)
        seen.append(_rows_so_far(target_dir, "trips"))
    assert seen[0] == 0 and 0 < seen[1] <= seen[2] < 20_000_000, seen
    final = _start(big_trips, target_dir)
    assert final.wait(timeout=120) == 0
    assert count(target_dir, "trips") == (20_000_000, 20_000_000)
    states = {r["state"] for r in json.loads(run_chload(
        "files", "--table", "trips", "--target", target_dir, "--json").stdout)}
    assert states == {"loaded"}


# -- many small files, batched -----------------------------------------------------------

@pytest.fixture
def small_files(tmp_path: Path) -> Path:
    """600 small CSV files of 50 rows (3 batches), one of them corrupt."""
    directory = tmp_path / "small"
    directory.mkdir()
    for i in range(600):
        rows = "".join(f"{i * 50 + j},{j}\n" for j in range(50))
        (directory / f"s_{i:04d}.csv").write_text("id,v\n" + rows)
    (directory / "s_0333.csv").write_text("id,v\n1,2\nnot,a,number\n")
    return directory


def test_small_files_batch_and_a_bad_one_fails_alone(small_files: Path, target_dir: str) -> None:
    code, report = load_json(str(small_files), "--table", "s", "--target", target_dir)
    assert code == 1
    assert (report["files_loaded"], report["files_failed"]) == (599, 1)
    assert report["rows_loaded"] == 599 * 50
    assert count(target_dir, "s") == (599 * 50, 599 * 50)
    ledger = json.loads(run_chload("files", "--table", "s", "--target", target_dir,
                                   "--json").stdout)
    assert {r["rows"] for r in ledger if r["state"] == "loaded"} == {50}
    assert [r["uri"] for r in ledger if r["state"] == "failed"] == [
        str(small_files / "s_0333.csv")]


LONG_NAME = "a_name_long_enough_that_2500_of_them_exceed_the_engines_max_query_size_"


@pytest.fixture
def many_small(tmp_path: Path) -> Path:
    """5,000 CSV files of 3 rows in 5 directories, of long names: a few batches (each read
    by one file() across directories), however many workers."""
    root = tmp_path / "many"
    for d in range(5):
        (root / f"d{d}").mkdir(parents=True)
        for i in range(d * 1000, d * 1000 + 1000):
            (root / f"d{d}" / f"{LONG_NAME}{i:05d}.csv").write_text(
                "id,v\n" + "".join(f"{i * 3 + j},{j}\n" for j in range(3)))
    return root


def ledger_sql(target_dir: str, sql: str) -> str:
    out = run_chload("sql", sql, "--target", target_dir, "--format", "TSV")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_bad_file_in_a_large_batch_fails_alone_and_the_rest_commit_in_few_batches(
        many_small: Path, target_dir: str) -> None:
    bad = many_small / "d3" / f"{LONG_NAME}03217.csv"
    bad.write_text("id,v\n1,2\nnot,a,number\n")
    code, report = load_json(f"{many_small}/*/*.csv", "--table", "s", "--target", target_dir,
                             "--workers", "1")
    assert code == 1
    assert (report["files_loaded"], report["files_failed"]) == (4999, 1)
    assert report["costs"]["data_requests"] < 2 * report["costs"]["units"]  # few failed
    failed = ledger_sql(target_dir, "SELECT uri, error FROM chload.files WHERE state = "
                                    "'failed'").split("\t")
    assert failed[0] == str(bad) and "line 3, column id" in failed[1] and "Int64" in failed[1]
    assert count(target_dir, "s") == (4999 * 3, 4999 * 3)
    # the failed batch was halved, not loaded file by file: a commit per halving
    stages = int(ledger_sql(target_dir, "SELECT uniqExact(stage) FROM chload.files WHERE "
                                        "state = 'committing'"))
    assert stages <= 2 + 2 * 12, stages
    assert ledger_sql(target_dir, "SELECT count(), uniqExact(uri) FROM chload.files WHERE "
                                  "state = 'loaded'").split() == ["4999", "4999"]


@pytest.mark.parametrize("point", ["before-attach:2", "after-attach:1"])
def test_crash_inside_a_batch_commit(many_small: Path, target_dir: str, point: str) -> None:
    """Killed between a batch's `committing` events and its attach (the second batch), or
    between its attach and `loaded` (the first): the rerun ends with every file's rows
    once, each file once in the ledger as loaded, and a third run loads nothing."""
    args = ["load", f"{many_small}/*/*.csv", "--table", "s", "--target", target_dir,
            "--workers", "1"]
    proc = subprocess.run([sys.executable, "-m", "chload", *args, "--quiet"],
                          env={**os.environ, "CHLOAD_CRASH_AT": point}, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert 0 < count(target_dir, "s")[0] < 15_000  # the first batch's rows only
    assert run_chload(*args).returncode == 0
    assert count(target_dir, "s") == (15_000, 15_000)
    assert ledger_sql(target_dir, "SELECT count(), uniqExact(uri) FROM chload.files WHERE "
                                  "state = 'loaded'").split() == ["5000", "5000"]
    code, again = load_json(*args[1:])
    assert (code, again["files_loaded"], again["files_skipped"]) == (0, 0, 5000)
    rm = subprocess.run(["rm", "-rf", target_dir], check=True)
    assert rm.returncode == 0
    code, clean = load_json(*args[1:])  # no batch too long for a statement: none halved
    assert (code, clean["files_loaded"]) == (0, 5000)
    assert clean["costs"]["data_requests"] == clean["costs"]["units"], clean["costs"]
    assert count(target_dir, "s") == (15_000, 15_000)


@pytest.mark.parametrize("point", ["attach-partition:2", "attach-partition:1", "after-attach:1"])
def test_partitioned_table_crash_and_resume(trips: Path, target_dir: str, point: str) -> None:
    """A commit attaches 4 partitions one by one; a crash between two of them (2 of 4
    attached) or after them resumes with every row exactly once."""
    args = [sys.executable, "-m", "chload", "load", str(trips), "--table", "p", "--target",
            target_dir, "--quiet", "--partition-by", "vehicle_id % 4", "--workers", "1"]
    crashed = subprocess.run(args, env={**os.environ, "CHLOAD_CRASH_AT": point}, timeout=120)
    assert crashed.returncode == -signal.SIGKILL
    partial = count(target_dir, "p")[0]
    if point.startswith("attach-partition"):  # some partitions of the batch are in, not all
        assert 0 < partial < 1_000_000
    assert subprocess.run(args, timeout=120).returncode == 0
    assert count(target_dir, "p") == (1_000_000, 1_000_000)
    partitions = run_chload("sql", "SELECT uniqExact(partition_id) FROM system.parts WHERE "
                            "table = 'p' AND active", "--target", target_dir, "--format", "TSV")
    assert partitions.stdout.strip() == "4"


def test_sessions_compile_no_expressions(tmp_path: Path, target_dir: str) -> None:
    """The engine's sessions run without JIT (engine.SESSION_SETTINGS): compiling the
    commit's repeated queries cost 25-40 ms each at the end of a load."""
    (tmp_path / "a.csv").write_text("id\n1\n")
    assert run_chload("load", str(tmp_path / "a.csv"), "--table", "a", "--target",
                      target_dir, "--quiet").returncode == 0
    out = run_chload("sql", "SELECT name, value FROM system.settings WHERE name IN "
                     "('compile_expressions', 'compile_aggregate_expressions') ORDER BY name",
                     "--target", target_dir, "--format", "TSV")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["compile_aggregate_expressions", "0", "compile_expressions", "0"]
