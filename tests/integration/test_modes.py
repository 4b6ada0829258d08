"""--mode replace-partitions and --mode replace-table against the real engines: the
embedded one, a ClickHouse 18.16 server and a 3-shard 18.16 cluster.

Day files are exported, then some re-exported with corrections (other row counts, another
value of `v`): under replace-partitions the table must equal the last export of each day,
also when a load is killed in the middle of a replace and run again. Under replace-table
the table must equal the run's files, a reader never sees a partial table, and a kill at
any step leaves the old table or, after the rerun, the new one exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import services
from conftest import run_chload

SCHEMA = "day Date, id UInt32, v UInt32"
PAIRS = 4  # files, each the export of two days: days 2k and 2k+1


def export(directory: Path, version: int, pairs: range | list[int], rows: int = 3000) -> None:
    """Write days_<k>.csv for each pair k: `rows` + version rows a day, v = version."""
    for k in pairs:
        lines = ["day,id,v"]
        for day in (2 * k, 2 * k + 1):
            lines += [f"2024-01-{day + 1:02d},{i},{version}" for i in range(rows + version)]
        path = directory / f"days_{k}.csv"
        path.write_text("\n".join(lines) + "\n")
        stamp = 1_700_000_000 + version * 1000 + k
        os.utime(path, (stamp, stamp))


def expected(versions: dict[int, int], rows: int = 3000) -> list[str]:
    """The table as `day\tcount\tmin(v)\tmax(v)` lines, each pair at its last version."""
    out = []
    for k in sorted(versions):
        n = rows + versions[k] if versions[k] >= 0 else 1
        for day in (2 * k, 2 * k + 1):
            out.append(f"2024-01-{day + 1:02d}\t{n}\t{versions[k]}\t{versions[k]}")
    return out


class Place:
    """Where a test loads: the embedded target or a server, and how to read it back."""

    def __init__(self, kind: str, target: str, server: services.Service | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        self.kind, self.target, self.server, self.extra = kind, target, server, extra

    def load(self, pattern: str, table: str, *args: str, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
        return run_chload("load", pattern, "--table", table, "--target", self.target,
                          "--schema", SCHEMA, "--json", *self.extra, *args, env=env,
                          timeout=240)

    def query(self, sql: str) -> str:
        if self.server is not None:
            return services.clickhouse_query(self.server, sql).strip()
        done = run_chload("sql", sql, "--target", self.target, "--format", "TSV")
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def days(self, table: str) -> list[str]:
        found = self.query(f"SELECT day, count(), min(v), max(v) FROM {table} GROUP BY day "
                           "ORDER BY day")
        return found.splitlines() if found else []


@pytest.fixture(params=["embedded", "server"])
def place(request, tmp_path: Path) -> Place:
    if request.param == "embedded":
        return Place("embedded", str(tmp_path / "target"))
    server = request.getfixturevalue("clickhouse")
    return Place("server", f"{server.url}/default", server)


def _ok(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


# -- replace-partitions ---------------------------------------------------------------
def test_reexported_days_replace_their_partitions(place: Place, tmp_path: Path,
                                                  table_name: str) -> None:
    files = tmp_path / "files"
    files.mkdir()
    export(files, 1, range(PAIRS))
    pattern = str(files / "*.csv")
    first = _ok(place.load(pattern, table_name, "--mode", "replace-partitions",
                           "--partition-by", "day"))
    assert first["files_loaded"] == PAIRS
    export(files, 2, [0, 2])  # corrections of four days
    second = _ok(place.load(pattern, table_name, "--mode", "replace-partitions"))
    assert (second["files_loaded"], second["files_skipped"]) == (2, PAIRS - 2)
    assert place.days(table_name) == expected({0: 2, 1: 1, 2: 2, 3: 1})
    export(files, 3, [0])
    _ok(place.load(pattern, table_name, "--mode", "replace-partitions"))
    assert place.days(table_name) == expected({0: 3, 1: 1, 2: 2, 3: 1})
    again = _ok(place.load(pattern, table_name, "--mode", "replace-partitions"))
    assert again["files_loaded"] == 0  # nothing changed: nothing replaced
    assert place.days(table_name) == expected({0: 3, 1: 1, 2: 2, 3: 1})


def test_two_files_of_one_day_in_a_run_both_stay(place: Place, tmp_path: Path,
                                                 table_name: str) -> None:
    """Units of one run sharing a partition: the first replaces it, the others add."""
    files = tmp_path / "files"
    files.mkdir()
    for part in range(3):
        (files / f"part_{part}.csv").write_text(
            "day,id,v\n" + "".join(f"2024-02-01,{part * 100 + i},1\n" for i in range(100)))
    old = tmp_path / "old.csv"
    old.write_text("day,id,v\n" + "".join(f"2024-02-01,{i},0\n" for i in range(7)))
    _ok(place.load(str(old), table_name, "--mode", "replace-partitions", "--partition-by",
                   "day"))
    _ok(place.load(str(files / "*.csv"), table_name, "--mode", "replace-partitions",
                   "--workers", "1"))
    assert place.days(table_name) == ["2024-02-01\t300\t1\t1"]


@pytest.mark.parametrize("point", ["before-attach:1", "attach-partition:1", "attach-partition:5",
                                   "after-attach:1"])
def test_a_kill_in_the_middle_of_a_replace_then_a_rerun_is_exact(
        place: Place, tmp_path: Path, table_name: str, point: str) -> None:
    files = tmp_path / "files"
    files.mkdir()
    export(files, 1, range(PAIRS))
    pattern = str(files / "*.csv")
    _ok(place.load(pattern, table_name, "--mode", "replace-partitions", "--partition-by", "day"))
    export(files, 2, range(PAIRS), rows=20_000)  # every day re-exported, larger
    killed = place.load(pattern, table_name, "--mode", "replace-partitions", "--workers", "1",
                        env={"CHLOAD_CRASH_AT": point})
    assert killed.returncode == -9, killed.stderr
    rerun = _ok(place.load(pattern, table_name, "--mode", "replace-partitions"))
    assert rerun["files_failed"] == 0
    assert place.days(table_name) == expected(dict.fromkeys(range(PAIRS), 2), rows=20_000)


def test_a_table_without_partition_by_is_refused_in_one_line(place: Place, tmp_path: Path,
                                                            table_name: str) -> None:
    files = tmp_path / "files"
    files.mkdir()
    export(files, 1, [0])
    done = place.load(str(files / "*.csv"), table_name, "--mode", "replace-partitions")
    assert done.returncode != 0
    assert "--partition-by" in done.stderr and table_name in done.stderr
    _ok(place.load(str(files / "*.csv"), table_name))  # an append creates it unpartitioned
    export(files, 2, [0])
    done = place.load(str(files / "*.csv"), table_name, "--mode", "replace-partitions")
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert f"{table_name} has no PARTITION BY" in line and "replace-table" in line
    assert "Traceback" not in done.stderr


def _cluster_tables(cluster: services.ClickHouseCluster) -> str:
    name = f"t_{uuid.uuid4().hex[:10]}"
    for server in cluster.servers:
        services.clickhouse_query(server, f"CREATE TABLE default.{name}_local ({SCHEMA}) "
                                          "ENGINE = MergeTree PARTITION BY day ORDER BY id")
    services.clickhouse_query(cluster.servers[0], f"CREATE TABLE default.{name} AS "
                              f"default.{name}_local ENGINE = Distributed({cluster.name}, "
                              f"default, {name}_local, id)")
    return name


def test_reexported_days_replace_their_partitions_on_every_shard(weighted_cluster,
                                                                tmp_path: Path) -> None:
    cluster = weighted_cluster
    table = _cluster_tables(cluster)
    shards = tuple(a for s in cluster.servers for a in ("--shard", f"{s.endpoint}={s.url}"))
    place = Place("cluster", f"{cluster.servers[0].url}/default", cluster.servers[0], shards)
    files = tmp_path / "files"
    files.mkdir()
    export(files, 1, range(PAIRS))
    pattern = str(files / "*.csv")
    _ok(place.load(pattern, table, "--mode", "replace-partitions"))
    export(files, 2, [1, 3])
    _ok(place.load(pattern, table, "--mode", "replace-partitions"))
    assert place.days(table) == expected({0: 1, 1: 2, 2: 1, 3: 2})
    # pair 0 re-exported with one row a day: the shards that get none drop those days
    path = files / "days_0.csv"
    path.write_text("day,id,v\n2024-01-01,0,9\n2024-01-02,0,9\n")
    os.utime(path, (1_800_000_000, 1_800_000_000))
    _ok(place.load(pattern, table, "--mode", "replace-partitions"))
    want = expected({0: 1, 1: 2, 2: 1, 3: 2})
    want[0:2] = ["2024-01-01\t1\t9\t9", "2024-01-02\t1\t9\t9"]
    assert place.days(table) == want
    killed = place.load(pattern, table, "--mode", "replace-partitions", "--force",
                        env={"CHLOAD_CRASH_AT": "attach-partition:3"})
    assert killed.returncode == -9, killed.stderr
    _ok(place.load(pattern, table, "--mode", "replace-partitions", "--force"))
    assert place.days(table) == want


# -- replace-table ---------------------------------------------------------------------
def test_replace_table_swaps_in_the_runs_files_and_supersedes_the_ledger(
        place: Place, tmp_path: Path, table_name: str) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    export(old, 1, range(PAIRS))
    export(new, 2, [0, 1])
    _ok(place.load(str(old / "*.csv"), table_name))
    done = _ok(place.load(str(new / "*.csv"), table_name, "--mode", "replace-table"))
    assert done["files_loaded"] == 2
    assert place.days(table_name) == expected({0: 2, 1: 2})
    # the old files are no longer the table's: an append loads them again
    again = _ok(place.load(str(old / "*.csv"), table_name))
    assert again["files_loaded"] == PAIRS
    # and the run's files are: skipped
    assert _ok(place.load(str(new / "*.csv"), table_name))["files_loaded"] == 0
    leftovers = place.query("SELECT count() FROM system.tables WHERE name LIKE "
                            f"'{table_name}__chload%'")
    assert leftovers == "0"


def _replace_killed(place: Place, tmp_path: Path, table_name: str,
                    point: str) -> tuple[Path, Path]:
    """Day files `old` loaded, then a --mode replace-table load of `new` (other values,
    more rows) killed (SIGKILL) at crash point `point`."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    export(old, 1, range(PAIRS))
    export(new, 2, range(PAIRS), rows=5000)
    _ok(place.load(str(old / "*.csv"), table_name))
    killed = place.load(str(new / "*.csv"), table_name, "--mode", "replace-table",
                        "--workers", "1", env={"CHLOAD_CRASH_AT": point})
    assert killed.returncode == -9, killed.stderr
    return old, new


@pytest.mark.parametrize("point", ["attach-partition:1", "before-swap", "after-swap"])
def test_replace_table_killed_then_rerun_is_exact(place: Place, tmp_path: Path,
                                                  table_name: str, point: str) -> None:
    old, new = _replace_killed(place, tmp_path, table_name, point)
    swapped = point == "after-swap"
    want = expected(dict.fromkeys(range(PAIRS), 2), rows=5000) if swapped else \
        expected(dict.fromkeys(range(PAIRS), 1))
    assert place.days(table_name) == want  # the old table whole, or the new one whole
    _ok(place.load(str(new / "*.csv"), table_name, "--mode", "replace-table"))
    assert place.days(table_name) == expected(dict.fromkeys(range(PAIRS), 2), rows=5000)
    assert _ok(place.load(str(new / "*.csv"), table_name))["files_loaded"] == 0
    assert _ok(place.load(str(old / "*.csv"), table_name))["files_loaded"] == PAIRS


def test_a_replace_killed_after_its_swap_is_finished_by_the_next_append(
        place: Place, tmp_path: Path, table_name: str) -> None:
    """The next run, whatever its mode, finds the swap its ledger logged as begun
    (TableSwap.settle) and logs it done: the new files are the table's, the old not."""
    old, new = _replace_killed(place, tmp_path, table_name, "after-swap")
    assert _ok(place.load(str(new / "*.csv"), table_name))["files_loaded"] == 0
    assert place.days(table_name) == expected(dict.fromkeys(range(PAIRS), 2), rows=5000)
    assert _ok(place.load(str(old / "*.csv"), table_name))["files_loaded"] == PAIRS


def test_a_reader_never_sees_a_partial_table(clickhouse, tmp_path: Path,
                                             table_name: str) -> None:
    place = Place("server", f"{clickhouse.url}/default", clickhouse)
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    export(old, 1, range(PAIRS))
    export(new, 2, range(8), rows=40_000)
    _ok(place.load(str(old / "*.csv"), table_name))
    before, after = PAIRS * 2 * 3001, 8 * 2 * 40_002
    seen: dict[str, int] = {}
    stop = threading.Event()

    def read() -> None:
        url = clickhouse.url + "/?" + urllib.parse.urlencode(
            {"query": f"SELECT count() FROM default.{table_name}"})
        deadline = time.monotonic() + 240
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                got = urllib.request.urlopen(url, timeout=10).read().decode().strip()
            except urllib.error.HTTPError as exc:
                got = "missing" if b"doesn't exist" in exc.read() else "error"
            seen[got] = seen.get(got, 0) + 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _ok(place.load(str(new / "*.csv"), table_name, "--mode", "replace-table",
                       "--workers", "2"))
        time.sleep(0.2)
    finally:
        stop.set()
        reader.join(30)
    assert seen.get(str(before), 0) > 5 and seen.get(str(after), 0) > 0, seen
    # 18.16 renames the two tables one after the other: a reader may find none between
    assert set(seen) <= {str(before), str(after), "missing"}, seen


def test_validate_says_what_a_mode_would_do(tmp_path: Path, table_name: str) -> None:
    files = tmp_path / "files"
    files.mkdir()
    export(files, 1, [0])
    done = subprocess.run([sys.executable, "-m", "chload", "validate", str(files / "*.csv"),
                           "--table", table_name, "--target", str(tmp_path / "t"), "--mode",
                           "replace-partitions"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "REPLACE PARTITION" in done.stdout and "PARTITION BY" in done.stdout


@pytest.mark.parametrize("mode", ["replace-table", "replace-partitions"])
def test_a_database_table_loaded_again_whole_equals_the_source(postgres, tmp_path: Path,
                                                               table_name: str,
                                                               mode: str) -> None:
    """A PostgreSQL table whose rows were deleted and changed between two loads: under
    replace-table the copy is the source's table; under replace-partitions (by status)
    each status the source still has is replaced."""
    from test_databases import CHECK_CH, Source

    db = Source("postgresql", postgres)
    db.orders(table_name, 1, 20_000)
    target = str(tmp_path / "target")

    def load(*args: str) -> dict:
        done = run_chload("load", db.url(table_name), "--table", table_name, "--target",
                          target, "--json", *args, env=db.env, timeout=180)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    load("--partition-by", "status")
    db.sql(f"DELETE FROM {table_name} WHERE id > 15000; "
           f"UPDATE {table_name} SET qty = qty + 1, price = price + 1 WHERE id <= 100")
    load("--mode", mode)
    copy = run_chload("sql", CHECK_CH.format(t=table_name), "--target", target,
                      "--format", "TSV")
    assert copy.stdout.strip().split("\t") == db.check(table_name)
    qty = run_chload("sql", f"SELECT sum(qty) FROM {table_name}", "--target", target,
                     "--format", "TSV").stdout.strip()
    assert qty == db.sql(f"SELECT sum(qty) FROM {table_name}").strip()
