"""The cluster target against real 18.16 clusters: a Distributed table loaded
shard by shard, exactly once per (file, shard), every row on the shard its key names.

Each shard is checked on its own server: its rows whose key does not belong there
(the key modulo the total weight, outside the shard's slots) must be none.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import services
from common import make_trips
from conftest import run_chload

SCHEMA = "id UInt64, miles UInt32, duration UInt32, vehicle_id UInt8"
FILES, ROWS = 8, 125_000  # 1M rows
SLOTS = {1: [0], 2: [1, 2], 3: [3]}  # weights 1/2/1: key % 4 -> shard


@pytest.fixture(scope="module")
def trips(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("cluster-trips")
    make_trips(str(directory), FILES, ROWS)
    return str(directory / "*.csv.gz")


def q(server: services.Service, sql: str) -> str:
    return services.clickhouse_query(server, sql).strip()


def shard_args(cluster: services.ClickHouseCluster) -> list[str]:
    return [a for s in cluster.servers for a in ("--shard", f"{s.endpoint}={s.url}")]


def make_tables(cluster: services.ClickHouseCluster, key: str | None,
                local_engine: str = "MergeTree ORDER BY id") -> str:
    name = f"t_{uuid.uuid4().hex[:10]}"
    for server in cluster.servers:
        q(server, f"CREATE TABLE default.{name}_local ({SCHEMA}) ENGINE = {local_engine}")
    args = f"{cluster.name}, default, {name}_local" + (f", {key}" if key else "")
    q(cluster.servers[0], f"CREATE TABLE default.{name} AS default.{name}_local "
                          f"ENGINE = Distributed({args})")
    return name


def load(cluster: services.ClickHouseCluster, pattern: str, table: str, *extra: str,
         env: dict[str, str] | None = None):
    return run_chload("load", pattern, "--table", table, "--target",
                      f"{cluster.servers[0].url}/default", *shard_args(cluster), "--json",
                      *extra, env=env, timeout=240)


def per_shard(cluster: services.ClickHouseCluster, table: str, key: str) -> dict[int, tuple]:
    """shard -> (rows, rows whose key % 4 is not one of the shard's slots)."""
    found = {}
    for shard, slots in SLOTS.items():
        row = q(cluster.server(shard), f"SELECT count(), countIf(NOT has({slots}, {key} % 4)) "
                                       f"FROM default.{table}_local").split("\t")
        found[shard] = (int(row[0]), int(row[1]))
    return found


def assert_exact_and_placed(cluster: services.ClickHouseCluster, table: str,
                            key: str = "cityHash64(id)") -> dict[int, tuple]:
    shards = per_shard(cluster, table, key)
    assert sum(rows for rows, _ in shards.values()) == FILES * ROWS, shards
    assert [bad for _, bad in shards.values()] == [0, 0, 0], shards
    ids = q(cluster.servers[0], f"SELECT uniqExact(id), count() FROM default.{table}")
    assert ids == f"{FILES * ROWS}\t{FILES * ROWS}"
    return shards


def test_rows_by_key_land_on_their_shard_exactly_once(weighted_cluster, trips):
    table = make_tables(weighted_cluster, "cityHash64(id)")
    done = load(weighted_cluster, trips, table)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["rows_loaded"] == FILES * ROWS
    shards = assert_exact_and_placed(weighted_cluster, table)
    assert {s["shard"]: s["rows"] for s in report["shards"]} == {
        n: rows for n, (rows, _) in shards.items()}
    assert 1.7 < shards[2][0] / shards[1][0] < 2.3  # weight 2 against weight 1
    for shard in report["shards"]:  # each shard's server, read from its own counters
        assert shard["server"]["cpu_s"] > 0, shard
        assert shard["server"]["bottleneck"] in ("cpu", "disk", "waiting"), shard

    again = load(weighted_cluster, trips, table)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["files_skipped"] == FILES
    assert_exact_and_placed(weighted_cluster, table)

    listed = run_chload("files", "--table", table, "--target",
                        f"{weighted_cluster.servers[0].url}/default",
                        *shard_args(weighted_cluster), "--json")
    rows = json.loads(listed.stdout)
    assert len(rows) == FILES * 3 and {r["state"] for r in rows} == {"loaded"}
    assert sum(r["rows"] for r in rows if r["table"].endswith("shard 2")) == shards[2][0]


def test_kill_twice_mid_load_then_finish(weighted_cluster, trips):
    """8 small files go in 4 batches of 2 (one per stream), each routed to every shard and
    committed by the 3 shards at once, each shard's batches as one group (one ledger
    INSERT, then the attaches): the first kill lands between shards' commits (shard 3
    held back before its commit; the first of shards 1 and 2 to attach its 2nd batch is
    killed: there some batches attached, the rest `committing`; shard 3 has none), the
    second after the batches' rows were routed again into every shard's stage, before
    any commit (only shard 3 lacks them)."""
    table = make_tables(weighted_cluster, "intHash64(id)")
    killed = load(weighted_cluster, trips, table, "--workers", "4",
                  env={"CHLOAD_CRASH_AT": "after-attach:2",
                       "CHLOAD_PAUSE_AT": "cluster-commit-shard-3:3"})
    assert killed.returncode == -9, killed.stderr
    shards = per_shard(weighted_cluster, table, "intHash64(id)")
    assert 0 < sum(rows for rows, _ in shards.values()) < FILES * ROWS
    assert shards[3][0] == 0
    killed = load(weighted_cluster, trips, table, "--workers", "4",
                  env={"CHLOAD_CRASH_AT": "cluster-routed"})
    assert killed.returncode == -9, killed.stderr
    done = load(weighted_cluster, trips, table)
    assert done.returncode == 0, done.stderr
    shards = assert_exact_and_placed(weighted_cluster, table, "intHash64(id)")
    # each file's rows per shard, batches included: a file's shares add up to the file,
    # and each shard's files to that shard's rows
    listed = json.loads(run_chload("files", "--table", table, "--target",
                                   f"{weighted_cluster.servers[0].url}/default",
                                   *shard_args(weighted_cluster), "--json").stdout)
    by_file: dict[str, int] = {}
    for row in listed:
        by_file[row["uri"]] = by_file.get(row["uri"], 0) + row["rows"]
    assert sorted(by_file.values()) == [ROWS] * FILES, listed
    for number, (rows, _) in shards.items():
        assert sum(r["rows"] for r in listed if r["table"].endswith(f"shard {number}")) == rows
    for server in weighted_cluster.servers:  # no stage or route table left behind
        assert q(server, "SELECT count() FROM system.tables WHERE database = 'chload' AND "
                         "startsWith(name, 'stage_')") == "0"


def test_random_key_loads_whole_files_by_weight(weighted_cluster, trips):
    table = make_tables(weighted_cluster, "rand()")
    done = load(weighted_cluster, trips, table)
    assert done.returncode == 0, done.stderr
    assert "by file" in json.loads(done.stdout)["target"]
    total = 0
    for server in weighted_cluster.servers:
        counts = q(server, f"SELECT intDiv(id, {ROWS}) AS f, count() FROM default.{table}_local "
                           "GROUP BY f").splitlines()
        for line in counts:  # each file on one shard, whole
            assert int(line.split("\t")[1]) == ROWS
        total += len(counts)
    assert total == FILES


def test_a_plain_table_loads_as_before(weighted_cluster, trips):
    table = f"t_{uuid.uuid4().hex[:10]}"
    server = weighted_cluster.servers[0]
    q(server, f"CREATE TABLE default.{table} ({SCHEMA}) ENGINE = MergeTree ORDER BY id")
    done = load(weighted_cluster, trips, table)
    assert done.returncode == 2 and "--shard" in done.stderr  # --shard is for clusters only
    done = run_chload("load", trips, "--table", table, "--target", f"{server.url}/default",
                      "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["shards"] == []
    assert q(server, f"SELECT count() FROM default.{table}") == str(FILES * ROWS)


def test_a_shard_that_does_not_answer_is_one_line_before_any_row(weighted_cluster, trips):
    table = make_tables(weighted_cluster, "cityHash64(id)")
    third = weighted_cluster.server(3)
    args = [a.replace(f"={third.url}", "=http://127.0.0.1:1") for a in
            shard_args(weighted_cluster)]
    done = run_chload("load", trips, "--table", table, "--target",
                      f"{weighted_cluster.servers[0].url}/default", *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "shard 3 has no replica that answers" in lines[0], lines
    assert per_shard(weighted_cluster, table, "cityHash64(id)") == {1: (0, 0), 2: (0, 0),
                                                                      3: (0, 0)}


def test_local_tables_that_differ_are_one_line(weighted_cluster, trips):
    table = make_tables(weighted_cluster, "cityHash64(id)")
    q(weighted_cluster.server(2), f"ALTER TABLE default.{table}_local ADD COLUMN extra String")
    done = load(weighted_cluster, trips, table)
    assert done.returncode == 2
    assert "local tables differ" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_replicated_cluster_with_a_replica_down(replicated_cluster, trips):
    cluster = replicated_cluster
    name = f"t_{uuid.uuid4().hex[:10]}"
    first = cluster.server(1, 1)
    q(first, f"CREATE TABLE default.{name}_local ON CLUSTER {cluster.name} ({SCHEMA}) ENGINE = "
             f"ReplicatedMergeTree('/clickhouse/tables/{{cluster}}/{{shard}}/{name}', "
             "'{replica}') ORDER BY id")
    q(first, f"CREATE TABLE default.{name} AS default.{name}_local ENGINE = "
             f"Distributed({cluster.name}, default, {name}_local, intHash64(id))")
    down = cluster.server(2, 1)
    down.stop()
    try:
        done = run_chload("load", trips, "--table", name, "--target", f"{first.url}/default",
                          *[a for s in cluster.servers
                            for a in ("--shard", f"{s.endpoint}={s.url}")], "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["rows_loaded"] == FILES * ROWS
    finally:
        down.start()
    want = {}
    for shard in (1, 2):
        rows = q(cluster.server(shard, 2 if shard == 2 else 1),
                 f"SELECT count(), countIf(intHash64(id) % 2 != {shard - 1}) FROM "
                 f"default.{name}_local").split("\t")
        assert rows[1] == "0"
        want[shard] = rows[0]
    assert int(want[1]) + int(want[2]) == FILES * ROWS
    deadline = time.monotonic() + 60
    while True:  # every replica agrees: the restarted one fetches what it missed
        got = {(shard, r): q(cluster.server(shard, r),
                             f"SELECT count() FROM default.{name}_local")
               for shard in (1, 2) for r in (1, 2)}
        if all(count == want[shard] for (shard, _), count in got.items()):
            break
        assert time.monotonic() < deadline, (got, want)
        time.sleep(0.5)


def test_files_in_path_stay_out_of_the_ledger_of_other_tables(weighted_cluster, trips):
    """The shards' ledgers name the local table: the Distributed table's own server
    ledger holds no loaded event of it (a plain load into the local table elsewhere is
    not mistaken for the cluster's)."""
    table = make_tables(weighted_cluster, "cityHash64(id)")
    assert load(weighted_cluster, str(Path(trips).parent / "trips_000.csv.gz"),
                table).returncode == 0
    assert q(weighted_cluster.servers[0], f"SELECT count() FROM chload.files WHERE "
                                          f"target_table = 'default.{table}'") == "0"
    assert q(weighted_cluster.server(2), f"SELECT count() FROM chload.files WHERE "
                                         f"target_table = 'default.{table}_local' AND "
                                         "state = 'loaded'") == "1"


def _mutate(server: services.Service, sql: str, table: str) -> None:
    """An ALTER ... DELETE, waited for (18.16 runs mutations in the background)."""
    q(server, sql)
    deadline = time.monotonic() + 30
    while q(server, f"SELECT count() FROM system.mutations WHERE table = '{table}' AND "
                    "NOT is_done") != "0":
        assert time.monotonic() < deadline, "mutation not done in 30 s"
        time.sleep(0.05)


def test_a_changed_sharding_key_is_refused_while_a_unit_is_half_loaded(weighted_cluster,
                                                                      trips):
    """A unit committed on shards 1 and 2 but not 3 (as a crash between shards' commits
    leaves it), then the Distributed table's key changes: routing it again would place
    shard 3's share by the new key. Refused in one line; with the old key back, the
    rerun loads shard 3's share only."""
    table = make_tables(weighted_cluster, "cityHash64(id)")
    assert load(weighted_cluster, trips, table).returncode == 0
    shard3, entry = weighted_cluster.server(3), weighted_cluster.servers[0]
    uri = q(shard3, f"SELECT any(uri) FROM chload.files WHERE target_table = "
                    f"'default.{table}_local'")
    number = int(Path(uri).name.split("_")[1].split(".")[0])  # trips_003.csv.gz: ids 3*ROWS..
    _mutate(shard3, f"ALTER TABLE chload.files DELETE WHERE target_table = "
                    f"'default.{table}_local' AND uri = '{uri}'", "files")
    _mutate(shard3, f"ALTER TABLE default.{table}_local DELETE WHERE intDiv(id, {ROWS}) = "
                    f"{number}", f"{table}_local")
    q(entry, f"DROP TABLE default.{table}")
    q(entry, f"CREATE TABLE default.{table} AS default.{table}_local ENGINE = Distributed("
             f"{weighted_cluster.name}, default, {table}_local, intHash64(id))")
    refused = load(weighted_cluster, trips, table)
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert "sharding changed" in line and uri in line and "but not 3" in line, line
    assert "key cityHash64(id) by row" in line and "key intHash64(id) by row" in line, line
    q(entry, f"DROP TABLE default.{table}")
    q(entry, f"CREATE TABLE default.{table} AS default.{table}_local ENGINE = Distributed("
             f"{weighted_cluster.name}, default, {table}_local, cityHash64(id))")
    done = load(weighted_cluster, trips, table)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["files_loaded"] == 1
    assert_exact_and_placed(weighted_cluster, table)


def test_a_server_without_the_distributed_table_says_its_cluster_has_one(weighted_cluster,
                                                                          trips):
    """--target names shard 2, where the Distributed table (on server 1 only) does not
    exist: chload creates a plain table there and loads into it, as into any server, and
    the report says that the cluster's other servers hold a Distributed table of that
    name. With --shard, the load is refused in one line, before anything is created."""
    table = make_tables(weighted_cluster, "cityHash64(id)")
    second = weighted_cluster.server(2)
    one = str(Path(trips).parent / "trips_000.csv.gz")
    refused = run_chload("load", one, "--table", table, "--target", f"{second.url}/default",
                         *shard_args(weighted_cluster))
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "does not exist on" in line, line
    assert f"cluster {weighted_cluster.name} (Distributed(" in line and "--target" in line
    assert q(second, f"EXISTS TABLE default.{table}") == "0"

    done = run_chload("load", one, "--table", table, "--target", f"{second.url}/default",
                      "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["created_table"] and report["rows_loaded"] == ROWS
    assert len(report["notes"]) == 1, report["notes"]
    note = report["notes"][0]
    assert f"Distributed table default.{table}" in note and weighted_cluster.name in note
    assert "point --target at one of them" in note
    assert q(second, f"SELECT engine FROM system.tables WHERE name = '{table}'") == "MergeTree"

    other = f"t_{uuid.uuid4().hex[:10]}"  # Distributed nowhere: nothing to say
    plain = run_chload("load", one, "--table", other, "--target", f"{second.url}/default")
    assert plain.returncode == 0, plain.stderr
    assert "note:" not in plain.stdout, plain.stdout
    refused = run_chload("load", one, "--table", f"{other}_x", "--target",
                         f"{second.url}/default", *shard_args(weighted_cluster))
    assert refused.returncode == 2
    assert "does not exist on" in refused.stderr and "load without --shard" in refused.stderr


def test_a_partitioned_delta_table_lands_by_key_with_its_partition_values(
        weighted_cluster, tmp_path: Path) -> None:
    """A Delta table partitioned by region (NULL among them), its values only in the
    log, into a Distributed table keyed by id: each row on its shard, with its region."""
    import pyarrow as pa
    from deltalake import write_deltalake

    cluster, name = weighted_cluster, f"t_{uuid.uuid4().hex[:10]}"
    for server in cluster.servers:
        q(server, f"CREATE TABLE default.{name}_local (id UInt64, region Nullable(String)) "
                  "ENGINE = MergeTree ORDER BY id")
    q(cluster.servers[0], f"CREATE TABLE default.{name} AS default.{name}_local ENGINE = "
                          f"Distributed({cluster.name}, default, {name}_local, id)")
    ids = range(4000)
    write_deltalake(str(tmp_path / "d"), pa.table({
        "id": pa.array(ids, pa.int64()),
        "region": pa.array([("EU", "US", None)[i % 3] for i in ids])}), partition_by=["region"])
    done = load(cluster, f"delta+file://{tmp_path}/d", name)
    assert done.returncode == 0 and json.loads(done.stdout)["files_loaded"] == 3, done.stderr
    placed = [q(cluster.server(shard), f"SELECT count(), countIf(NOT has({slots}, id % 4)) "
                                       f"FROM default.{name}_local")
              for shard, slots in SLOTS.items()]
    assert [p.split("\t")[1] for p in placed] == ["0", "0", "0"], placed
    sums = q(cluster.servers[0], f"SELECT groupArray((region, c, s)) FROM (SELECT region, "
                                 f"count() AS c, sum(id) AS s FROM default.{name} "
                                 "GROUP BY region ORDER BY region)")
    expected = {r: [i for i in ids if ("EU", "US", None)[i % 3] == r] for r in ("EU", "US", None)}
    assert sums == "[" + ",".join(
        f"({'NULL' if r is None else repr(r)},{len(v)},{sum(v)})" for r, v in expected.items()
    ) + "]", sums
