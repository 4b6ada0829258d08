"""Files that gain and lose columns (--on-new-column), end to end with the real
`chload` command: three generations of files (v1 `a, b`; v2 adds `c`; v3 adds `d` and
drops `b`) into embedded chDB, a ClickHouse 18.16 server and a 3-shard 18.16 cluster,
results checked through SQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import chdb
import pytest
import services
from conftest import run_chload
from test_databases import Source
from test_headers_and_names import Where

pytestmark = pytest.mark.integration

ROWS = 500  # per file; two files a generation
GENERATIONS = {1: ("a", "b"), 2: ("a", "b", "c"), 3: ("a", "c", "d")}
FORMATS = {"csv": "CSVWithNames", "tsv": "TSVWithNames", "jsonl": "JSONEachRow",
           "parquet": "Parquet"}


@pytest.fixture(params=["embedded", "server"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    if request.param == "embedded":
        return Where(str(tmp_path / "target"), {})
    return _server(request.getfixturevalue("clickhouse"))


def _server(server: services.Service) -> Where:
    return Where(f"http://loader@127.0.0.1:{server.ports['http']}/default",
                 {"CLICKHOUSE_PASSWORD": server.credentials["password"]})


def _values(gen: int, a: int) -> dict[str, object]:
    row: dict[str, object] = {"a": a, "b": f"b{a}", "c": a * 10, "d": f"d{a}"}
    return {name: row[name] for name in GENERATIONS[gen]}


def make_generations(directory: Path, ext: str) -> list[Path]:
    """g1_0, g1_1 (v1), g2_0, g2_1 (v2), g3_0, g3_1 (v3): ids 0.. unique over all."""
    paths, a = [], 0
    for gen in GENERATIONS:
        for i in range(2):
            rows = [_values(gen, a + n) for n in range(ROWS)]
            a += ROWS
            path = directory / f"g{gen}_{i}.{ext}"
            _write(path, ext, rows)
            paths.append(path)
    return paths


def _write(path: Path, ext: str, rows: list[dict[str, object]]) -> None:
    names = list(rows[0])
    if ext in ("csv", "tsv"):
        sep = "," if ext == "csv" else "\t"
        lines = [sep.join(names)] + [sep.join(str(r[n]) for n in names) for r in rows]
        path.write_text("\n".join(lines) + "\n")
    elif ext == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:  # Parquet, written by the engine itself
        body = "".join(json.dumps(r) + "\n" for r in rows)
        src = path.with_suffix(".src.jsonl")
        src.write_text(body)
        types = {"a": "Int64", "b": "String", "c": "Int64", "d": "String"}
        structure = ", ".join(f"{n} {types[n]}" for n in names)
        chdb.query(f"INSERT INTO FUNCTION file('{path}', Parquet) SELECT * FROM "
                   f"file('{src}', JSONEachRow, '{structure}')")
        src.unlink()


def assert_generations(rows: list[list[str]]) -> None:
    """count, c NULL, d NULL, b NULL or empty, sum(c), sum(a): as the three generations say."""
    v = 2 * ROWS
    total = 3 * v
    expect_c = sum(a * 10 for a in range(v, total))
    assert rows == [[str(total), str(v), str(2 * v), str(v), str(expect_c),
                     str(total * (total - 1) // 2)]]


CHECK = ("SELECT count(), countIf(c IS NULL), countIf(d IS NULL), "
         "countIf(b IS NULL OR b = ''), sum(c), sum(a) FROM {table}")


def changes(rows: list[list[str]]) -> list[tuple[str, str, str]]:
    """(column, type, unit file name) of every change the runs recorded."""
    found = []
    for row in rows:
        for change in json.loads(row[0] or "[]"):
            found.append((change["column"], change["type"], Path(change["unit"]).name))
    return sorted(found)


# -- embedded and one 18.16 server --------------------------------------------------
@pytest.mark.parametrize("ext", list(FORMATS))
def test_three_generations_add(where: Where, tmp_path: Path, table_name: str,
                               ext: str) -> None:
    """v1, v2, v3 in one run into a new table: c and d are added (Nullable), v1's rows
    hold NULL in both, v2's in d, v3's no b; the run history names each change and the
    file that brought it."""
    make_generations(tmp_path, ext)
    code, report = where.load(str(tmp_path / f"*.{ext}"), "--table", table_name,
                              "--on-new-column", "add", "--workers", "3")
    assert code == 0, report
    assert report["files_loaded"] == 6 and report["rows_loaded"] == 6 * ROWS
    assert_generations(where.sql(CHECK.format(table=table_name)))
    types = dict(where.columns(table_name))
    assert types["c"].startswith("Nullable(") and types["d"] == "Nullable(String)"
    recorded = changes(where.sql(f"SELECT schema_changes FROM chload.runs WHERE "
                                 f"target_table = 'default.{table_name}'"))
    assert [(c, u) for c, _, u in recorded] == [("c", f"g2_0.{ext}"), ("d", f"g3_0.{ext}")]


def test_later_runs_add_a_generation_each(where: Where, tmp_path: Path,
                                          table_name: str) -> None:
    """One generation a run (the table exists): each run adds its column."""
    paths = make_generations(tmp_path, "csv")
    for gen in (1, 2, 3):
        code, report = where.load(*(str(p) for p in paths[2 * gen - 2:2 * gen]), "--table",
                                  table_name, "--on-new-column", "add")
        assert code == 0, report
        assert [c["column"] for c in report["schema_changes"]] == {1: [], 2: ["c"],
                                                                   3: ["d"]}[gen]
    assert_generations(where.sql(CHECK.format(table=table_name)))


def test_fail_refuses_the_new_file_alone(where: Where, tmp_path: Path,
                                         table_name: str) -> None:
    """Default (fail): the v1 files load; each v2 file fails alone, in one line naming
    the file, the column and the flag."""
    paths = make_generations(tmp_path, "csv")[:4]
    code, report = where.load(*(str(p) for p in paths), "--table", table_name)
    assert code == 1
    assert report["files_loaded"] == 2 and report["files_failed"] == 2
    for f in report["files"]:
        if Path(f["uri"]).name.startswith("g2_"):
            assert f["status"] == "failed"
            error = f["error"]
            assert "\n" not in error and f["uri"] in error
            assert "not in the table: c" in error and "--on-new-column add" in error
    assert where.sql(f"SELECT count() FROM {table_name}") == [[str(2 * ROWS)]]
    assert [n for n, _ in where.columns(table_name)] == ["a", "b"]


def test_fail_names_the_flag_for_json(where: Where, tmp_path: Path, table_name: str) -> None:
    paths = make_generations(tmp_path, "jsonl")[:3]
    code, report = where.load(*(str(p) for p in paths), "--table", table_name)
    assert code == 1 and report["files_loaded"] == 2
    failed = next(f for f in report["files"] if f["status"] == "failed")
    assert Path(failed["uri"]).name == "g2_0.jsonl"
    assert "c" in failed["error"] and "--on-new-column add" in failed["error"]


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
def test_ignore_loads_the_known_columns(where: Where, tmp_path: Path, table_name: str,
                                        ext: str) -> None:
    """ignore: every file loads, c and d are left out (the table keeps a, b), and the
    summary says so once per column."""
    make_generations(tmp_path, ext)
    code, report = where.load(str(tmp_path / f"*.{ext}"), "--table", table_name,
                              "--on-new-column", "ignore")
    assert code == 0, report
    assert report["rows_loaded"] == 6 * ROWS and not report["schema_changes"]
    assert [n for n, _ in where.columns(table_name)] == ["a", "b"]
    notes = [n for n in report["notes"] if "--on-new-column ignore" in n]
    assert len(notes) == 2 and "column c (first in" in notes[0] and "g2_0" in notes[0]
    rows = where.sql(f"SELECT count(), countIf(b = ''), sum(a) FROM {table_name}")
    total = 6 * ROWS
    assert rows == [[str(total), str(2 * ROWS), str(total * (total - 1) // 2)]]


def test_concurrent_loaders_add_one_column(clickhouse: services.Service, tmp_path: Path,
                                           table_name: str) -> None:
    """Two loaders at once, several files and threads each, all bringing column c into
    a v1 table on 18.16 (no ADD COLUMN IF NOT EXISTS), both past their look at the
    table's columns before either adds (CHLOAD_PAUSE_AT): both load every file, and the
    history records one change of c, by one of them."""
    where = _server(clickhouse)
    paths = make_generations(tmp_path, "csv")
    code, _ = where.load(str(paths[0]), "--table", table_name)
    assert code == 0
    lines = paths[2].read_text().splitlines()
    more = []
    for n in range(6):  # 3 v2 files per loader, ids of their own
        extra = tmp_path / f"g2_x{n}.csv"
        extra.write_text("\n".join([lines[0]] + [
            ",".join([str(10_000 * (n + 1) + i), *line.split(",")[1:]])
            for i, line in enumerate(lines[1:])]) + "\n")
        more.append(extra)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "chload", "load", *(str(p) for p in more[i::2]), "--table",
         table_name, "--target", where.target, "--on-new-column", "add", "--workers", "3",
         "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **where.env, "CHLOAD_PAUSE_AT": "add-columns:2"}) for i in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err
        assert json.loads(out)["files_loaded"] == 3
    assert where.sql(f"SELECT count(), countIf(c IS NULL), uniqExact(a) FROM {table_name}"
                     ) == [[str(7 * ROWS), str(ROWS), str(7 * ROWS)]]
    recorded = changes(where.sql(f"SELECT schema_changes FROM chload.runs WHERE "
                                 f"target_table = 'default.{table_name}'"))
    assert [c for c, _, _ in recorded] == ["c"]


# -- the 3-shard 18.16 cluster -----------------------------------------------------
def _cluster_tables(cluster: services.ClickHouseCluster, name: str,
                    everywhere: bool = False) -> None:
    """The local tables, and the Distributed one on the first server (or on every one)."""
    for server in cluster.servers:
        services.clickhouse_query(server, f"CREATE TABLE default.{name}_local (a UInt64, "
                                          "b Nullable(String)) ENGINE = MergeTree ORDER BY a")
    for server in cluster.servers if everywhere else cluster.servers[:1]:
        services.clickhouse_query(server, f"CREATE TABLE default.{name} AS "
                                  f"default.{name}_local ENGINE = Distributed({cluster.name},"
                                  f" default, {name}_local, cityHash64(a))")


def _cluster_load(cluster: services.ClickHouseCluster, pattern: str, name: str,
                  *extra: str) -> subprocess.CompletedProcess[str]:
    shards = [a for s in cluster.servers for a in ("--shard", f"{s.endpoint}={s.url}")]
    return run_chload("load", pattern, "--table", name, "--target",
                      f"{cluster.servers[0].url}/default", *shards, "--json", *extra,
                      timeout=240)


@pytest.mark.parametrize(("ext", "shard_by"), [("csv", "auto"), ("jsonl", "auto"),
                                               ("csv", "file")])
def test_three_generations_add_on_a_cluster(weighted_cluster: services.ClickHouseCluster,
                                            tmp_path: Path, ext: str, shard_by: str) -> None:
    """Into a Distributed table (rows by its key, or whole files by weight): c and d are
    added to every shard's local table and to the Distributed table (by file: made on
    every server, each gets them); every row is there once, old rows NULL in the new
    columns."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    _cluster_tables(weighted_cluster, name, everywhere=shard_by == "file")
    make_generations(tmp_path, ext)
    out = _cluster_load(weighted_cluster, str(tmp_path / f"*.{ext}"), name,
                        "--on-new-column", "add", "--shard-by", shard_by)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [c["column"] for c in report["schema_changes"]] == ["c", "d"]
    first = weighted_cluster.servers[0]
    rows = [services.clickhouse_query(first, CHECK.format(table=f"default.{name}")
                                      ).split()]
    assert_generations(rows)
    for server in weighted_cluster.servers:
        found = services.clickhouse_query(
            server, f"SELECT name, type FROM system.columns WHERE database = 'default' AND "
                    f"table = '{name}_local' ORDER BY name").split()
        assert found == ["a", "UInt64", "b", "Nullable(String)", "c", "Nullable(Int64)",
                         "d", "Nullable(String)"], server.url
    if shard_by == "file":  # (its Distributed table made on every server)
        for server in weighted_cluster.servers:
            assert services.clickhouse_query(
                server, f"SELECT count(), countIf(d IS NULL) FROM default.{name}").split() == [
                str(6 * ROWS), str(4 * ROWS)], server.url
    per_shard = [int(services.clickhouse_query(s, f"SELECT count() FROM default.{name}_local"))
                 for s in weighted_cluster.servers]
    assert sum(per_shard) == 6 * ROWS and (all(per_shard) or shard_by == "file")
    runs = services.clickhouse_query(first, "SELECT schema_changes FROM chload.runs WHERE "
                                            f"target_table = 'default.{name}'")
    assert changes([[line] for line in runs.splitlines()]) == [
        ("c", "Nullable(Int64)", f"g2_0.{ext}"), ("d", "Nullable(String)", f"g3_0.{ext}")]


# -- a database table that gains a column --------------------------------------------
def test_a_postgres_table_that_gains_a_column(postgres: services.Service, tmp_path: Path,
                                              table_name: str) -> None:
    """A source table that gains a column between two incremental loads: refused in one
    line naming the column and the flag; with add, the column is added (Nullable, the
    type the source gives) and the new rows load, the earlier ones NULL in it."""
    source = Source("postgresql", postgres)
    target = str(tmp_path / "target")
    source.sql(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, name text NOT NULL); "
               f"INSERT INTO {table_name} SELECT g, 'n' || g FROM generate_series(1, 1000) g")

    def load(*extra: str) -> subprocess.CompletedProcess[str]:
        return run_chload("load", source.url(table_name), "--table", table_name, "--target",
                          target, "--json", "--incremental-by", "id", *extra, env=source.env)
    assert load().returncode == 0
    source.sql(f"ALTER TABLE {table_name} ADD COLUMN qty integer; INSERT INTO {table_name} "
               "SELECT g, 'n' || g, g % 10 FROM generate_series(1001, 1500) g")
    refused = load()
    assert refused.returncode != 0
    line = refused.stderr.strip().splitlines()[-1]
    assert "not in the table: qty" in line and "--on-new-column add" in line
    done = load("--on-new-column", "add")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["rows_loaded"] == 500
    assert [(c["column"], c["type"]) for c in report["schema_changes"]] == [
        ("qty", "Nullable(Int32)")]
    rows = Where(target, {}).sql(f"SELECT count(), countIf(qty IS NULL), sum(qty) FROM "
                                 f"{table_name}")
    assert rows == [["1500", "1000", str(sum(g % 10 for g in range(1001, 1501)))]]


def test_ignore_on_a_cluster_keeps_every_shard_as_it_is(
        weighted_cluster: services.ClickHouseCluster, tmp_path: Path) -> None:
    name = f"t_{uuid.uuid4().hex[:10]}"
    _cluster_tables(weighted_cluster, name)
    make_generations(tmp_path, "csv")
    out = _cluster_load(weighted_cluster, str(tmp_path / "*.csv"), name,
                        "--on-new-column", "ignore")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows_loaded"] == 6 * ROWS
    for server in weighted_cluster.servers:
        assert services.clickhouse_query(
            server, f"SELECT name FROM system.columns WHERE database = 'default' AND "
                    f"table = '{name}_local' ORDER BY name").split() == ["a", "b"]
    total = 6 * ROWS
    assert services.clickhouse_query(
        weighted_cluster.servers[0], f"SELECT count(), uniqExact(a), countIf(b IS NULL) "
                                     f"FROM default.{name}").split() == [
        str(total), str(total), str(2 * ROWS)]


def test_every_replica_shows_the_new_columns(replicated_cluster: services.ClickHouseCluster,
                                             tmp_path: Path) -> None:
    """2 shards x 2 replicas (ReplicatedMergeTree): the columns are added on the replica
    chload loads and reach the other through ZooKeeper before any row moves; every
    replica ends with the columns and its shard's rows."""
    cluster = replicated_cluster
    name = f"t_{uuid.uuid4().hex[:10]}"
    first = cluster.server(1, 1)
    services.clickhouse_query(
        first, f"CREATE TABLE default.{name}_local ON CLUSTER {cluster.name} (a UInt64, b "
               f"Nullable(String)) ENGINE = ReplicatedMergeTree('/clickhouse/tables/"
               f"{{cluster}}/{{shard}}/{name}', '{{replica}}') ORDER BY a")
    services.clickhouse_query(first, f"CREATE TABLE default.{name} AS default.{name}_local "
                              f"ENGINE = Distributed({cluster.name}, default, {name}_local, "
                              "intHash64(a))")
    make_generations(tmp_path, "csv")
    out = run_chload("load", str(tmp_path / "*.csv"), "--table", name, "--target",
                     f"{first.url}/default", "--on-new-column", "add", "--json",
                     *[a for s in cluster.servers for a in ("--shard", f"{s.endpoint}={s.url}")],
                     timeout=240)
    assert out.returncode == 0, out.stderr
    assert_generations([services.clickhouse_query(
        first, CHECK.format(table=f"default.{name}")).split()])
    counts = {}
    deadline = time.monotonic() + 60
    for shard in (1, 2):
        for replica in (1, 2):
            server = cluster.server(shard, replica)
            found = services.clickhouse_query(
                server, f"SELECT name FROM system.columns WHERE database = 'default' AND "
                        f"table = '{name}_local' ORDER BY name").split()
            assert found == ["a", "b", "c", "d"], (shard, replica)
            while True:  # the other replica fetches the parts
                counts[shard, replica] = services.clickhouse_query(
                    server, f"SELECT count(), countIf(c IS NULL) FROM default.{name}_local")
                if replica == 1 or counts[shard, 2] == counts[shard, 1]:
                    break
                assert time.monotonic() < deadline, counts
                time.sleep(0.5)
    assert sum(int(counts[s, 1].split()[0]) for s in (1, 2)) == 6 * ROWS


def test_the_python_api_takes_on_new_column(tmp_path: Path, table_name: str) -> None:
    """chload.load(..., on_new_column="add"): the report lists the changes."""
    import chload

    make_generations(tmp_path, "jsonl")
    report = chload.load(str(tmp_path / "*.jsonl"), table=table_name,
                         target=str(tmp_path / "target"), on_new_column="add")
    assert report.ok and report.rows_loaded == 6 * ROWS
    assert [(c["column"], Path(c["unit"]).name) for c in report.schema_changes] == [
        ("c", "g2_0.jsonl"), ("d", "g3_0.jsonl")]


# -- Kafka JSON messages that gain a key -------------------------------------------------
def test_kafka_messages_that_gain_a_key(kafka: services.Service, tmp_path: Path,
                                        table_name: str) -> None:
    """JSON messages v1 {a, b}, then v2 {a, b, c}: the next load fails its batch naming
    the key (fail), or with add adds c and loads them, the earlier rows NULL in it."""
    from confluent_kafka import Producer

    topic = f"n_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, topic, 2)
    producer = Producer({"bootstrap.servers": kafka.extra["bootstrap"]})
    target = str(tmp_path / "target")

    def produce(gen: int, first: int) -> None:
        for a in range(first, first + 100):
            producer.produce(topic, json.dumps(_values(gen, a)).encode(), partition=a % 2)
        assert producer.flush(30) == 0

    def load(*extra: str) -> subprocess.CompletedProcess[str]:
        return run_chload("load", f"kafka://{kafka.extra['bootstrap']}/{topic}", "--table",
                          table_name, "--target", target, "--json", *extra, timeout=120)
    produce(1, 0)
    assert load().returncode == 0
    produce(2, 100)
    refused = load()
    assert refused.returncode != 0 and "--on-new-column" in refused.stdout + refused.stderr
    done = load("--on-new-column", "add")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["rows_loaded"] == 100
    assert [c["column"] for c in report["schema_changes"]] == ["c"]
    assert Where(target, {}).sql(f"SELECT count(), countIf(c IS NULL), sum(c) FROM "
                                 f"{table_name}") == [["200", "100",
                                                       str(sum(range(1000, 2000, 10)))]]


def test_the_summary_and_history_name_the_added_columns(tmp_path: Path,
                                                        table_name: str) -> None:
    make_generations(tmp_path, "csv")
    target = str(tmp_path / "target")
    out = run_chload("load", str(tmp_path / "*.csv"), "--table", table_name, "--target",
                     target, "--on-new-column", "add")
    assert out.returncode == 0, out.stderr
    assert "added column c Nullable(Int64) to default." in out.stdout
    assert "(first in " in out.stdout and "g3_0.csv)" in out.stdout
    history = run_chload("history", "--table", table_name, "--target", target)
    assert "columns added" in history.stdout and "c, d" in history.stdout, history.stdout


# -- files that keep arriving (--follow) -------------------------------------------------
def test_a_followed_directory_gains_a_column(tmp_path: Path, table_name: str) -> None:
    """Following a directory with add: v1 files load, then a v2 file arrives and its poll
    adds c; the run's report and record name the change."""
    from test_follow import Follower

    source, target = tmp_path / "in", str(tmp_path / "target")
    source.mkdir()
    paths = make_generations(tmp_path, "csv")
    old = time.time() - 60

    def arrive(path: Path) -> None:
        (source / path.name).write_text(path.read_text())
        os.utime(source / path.name, (old, old))
    arrive(paths[0])
    follower = Follower(str(source), "--table", table_name, "--target", target,
                        "--on-new-column", "add")
    follower.wait_for(lambda line: line.startswith("poll 1: 1 new file"))
    arrive(paths[2])
    follower.wait_for(lambda line: ": 1 new file," in line)
    code, rest, err = follower.stop()
    assert code == 0, err
    added = [line for line in rest if "added column" in line]
    assert len(added) == 1 and "added column c Nullable(Int64)" in added[0], rest
    assert Where(target, {}).sql(f"SELECT count(), countIf(c IS NULL) FROM {table_name}"
                                 ) == [[str(2 * ROWS), str(ROWS)]]
    recorded = changes(Where(target, {}).sql(f"SELECT schema_changes FROM chload.runs "
                                             f"WHERE target_table = 'default.{table_name}'"))
    assert [(c, u) for c, _, u in recorded] == [("c", "g2_0.csv")]
