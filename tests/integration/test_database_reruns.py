"""What a rerun of a database load says: a finished copy names the run that made it and
the flag that loads the rows added since; the summary counts ranges, not files; and
`--incremental-by` a column other than the key, into a table that keeps every row
version, says so and gives the CREATE of one that keeps the latest. The real `chload`
against PostgreSQL 15 and MariaDB 10.11, into embedded chDB, an 18.16 server and a
3-shard 18.16 cluster."""

from __future__ import annotations

import json
import re

import pytest
import services
from conftest import DATABASE_PASSWORD, run_chload
from test_databases import Source

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "mysql"])
def db(request: pytest.FixtureRequest) -> Source:
    return Source(request.param, request.getfixturevalue(
        "postgres" if request.param == "postgresql" else "mariadb"))


def _load(db: Source, table: str, target: str, *args: str,
          env: dict[str, str] | None = None) -> str:
    """The summary a user reads (not --json), the password nowhere in it."""
    done = run_chload("load", db.url(table), "--table", table, "--target", target, *args,
                      env={**db.env, **(env or {})}, timeout=180)
    assert done.returncode == 0, done.stderr
    assert DATABASE_PASSWORD not in done.stdout + done.stderr
    return done.stdout


def _note(summary: str) -> str:
    notes = [line for line in summary.splitlines() if "note:" in line]
    assert len(notes) == 1, summary
    return notes[0]


def _ch(target: str, sql: str, env: dict[str, str] | None = None) -> str:
    done = run_chload("sql", sql, "--target", target, "--format", "TSV", env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_finished_copy_rerun_names_its_run_and_the_flag_for_new_rows(
        db: Source, table_name: str, target_dir: str) -> None:
    db.orders(table_name, 1, 1000)
    first = _load(db, table_name, target_dir, "--json")
    run_id = json.loads(first)["run_id"]
    assert "1,000 rows" in _load(db, table_name, target_dir + "2")  # (another target)
    db.add(table_name, 1001, 1500)
    again = _load(db, table_name, target_dir)
    summary = again.splitlines()[0]
    assert summary.startswith(f"default.{table_name}: 0 ranges: 0 loaded"), again
    assert " files" not in again, again
    note = _note(again)
    assert f"was copied by run {run_id} at " in note, again
    assert re.search(r" at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", note), note
    assert "--incremental-by id" in note and "--force" in note, note
    assert _ch(target_dir, f"SELECT count() FROM {table_name}") == "1000"
    more = _load(db, table_name, target_dir, "--incremental-by", "id")
    assert more.splitlines()[0].startswith(f"default.{table_name}: "), more
    assert re.search(r": \d+ ranges?: \d+ loaded", more.splitlines()[0]), more
    assert "note:" not in more, more
    assert _ch(target_dir, f"SELECT count(), uniqExact(id) FROM {table_name}") == "1500\t1500"


def test_a_kafka_summary_counts_batches_not_files(kafka: services.Service, target_dir: str,
                                                  table_name: str) -> None:
    topic = f"s_{table_name}"
    services.kafka_create_topic(kafka, topic, 1)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.extra["bootstrap"]})
    for i in range(10):
        producer.produce(topic, json.dumps({"id": i}).encode())
    assert producer.flush(30) == 0
    done = run_chload("load", f"kafka://{kafka.extra['bootstrap']}/{topic}", "--table",
                      table_name, "--target", target_dir, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"default.{table_name}: 1 batch: 1 loaded"), done.stdout
    assert " files" not in done.stdout, done.stdout


VERSIONED_PG = """CREATE TABLE {t} (id bigint PRIMARY KEY, v int NOT NULL,
    updated_at timestamp(0) NOT NULL);
INSERT INTO {t} SELECT g, 0, timestamp '2024-01-01' FROM generate_series(1, 1000) g"""
VERSIONED_MY = """CREATE TABLE {t} (id bigint PRIMARY KEY, v int NOT NULL,
    updated_at datetime NOT NULL) ENGINE=InnoDB;
INSERT INTO {t} SELECT seq, 0, TIMESTAMP '2024-01-01 00:00:00' FROM seq_1_to_1000"""


def _versioned(db: Source, table: str) -> None:
    db.sql((VERSIONED_PG if db.kind == "postgresql" else VERSIONED_MY).format(t=table))


def _update(db: Source, table: str, round_: int) -> None:
    """Rows 1..10 updated: v = round_, updated_at a day later per round."""
    later = f"2024-01-{1 + round_:02d} 00:00:00"
    db.sql(f"UPDATE {table} SET v = {round_}, updated_at = '{later}' WHERE id <= 10")


def _create_in(note: str) -> str:
    """The CREATE a note ends with: `... as: CREATE TABLE ...`."""
    assert " as: CREATE TABLE " in note, note
    return note.split(" as: ", 1)[1]


def test_incremental_by_updated_at_into_a_merge_tree_says_versions_stay(
        db: Source, table_name: str, target_dir: str) -> None:
    """Into the table chload creates (MergeTree): each update adds a row, and the note
    says so with the CREATE of a table keeping one; into that one, no note, and FINAL
    reads each id once with its latest values."""
    _versioned(db, table_name)
    first = _load(db, table_name, target_dir, "--incremental-by", "updated_at")
    note = _note(first)
    assert f"default.{table_name} is a MergeTree, which keeps every row" in note, first
    assert "load into a new table with --upsert-key id --version updated_at" in note, note
    for round_ in (1, 2):
        _update(db, table_name, round_)
        again = _load(db, table_name, target_dir, "--incremental-by", "updated_at")
        assert "keeps every row" in again, again
    assert _ch(target_dir, f"SELECT count(), uniqExact(id) FROM {table_name}") == "1020\t1000"
    create = _create_in(note)
    assert "ReplacingMergeTree(`updated_at`) ORDER BY `id`" in create, create
    _ch(target_dir, f"DROP TABLE {table_name}")
    _ch(target_dir, create)
    reloaded = _load(db, table_name, target_dir, "--incremental-by", "updated_at")
    assert "1,000 rows" in reloaded and "note:" not in reloaded, reloaded
    _update(db, table_name, 3)
    last = _load(db, table_name, target_dir, "--incremental-by", "updated_at")
    assert "10 rows" in last and "note:" not in last, last
    assert _ch(target_dir, f"SELECT count(), uniqExact(id), sum(v) FROM {table_name} FINAL"
               ) == "1000\t1000\t30"


def test_incremental_by_the_key_itself_says_nothing(db: Source, table_name: str,
                                                   target_dir: str) -> None:
    """By the primary key, no row is loaded twice: no note."""
    _versioned(db, table_name)
    done = _load(db, table_name, target_dir, "--incremental-by", "id")
    assert "1,000 rows" in done and "note:" not in done, done


def test_incremental_by_updated_at_into_the_18_16_server(
        postgres: services.Service, clickhouse: services.Service, table_name: str) -> None:
    db = Source("postgresql", postgres)
    target = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    env = {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    _versioned(db, table_name)
    first = _load(db, table_name, target, "--incremental-by", "updated_at", env=env)
    note = _note(first)
    assert "is a MergeTree, which keeps every row" in note, first
    create = _create_in(note)
    services.clickhouse_query(clickhouse, f"DROP TABLE default.{table_name}")
    services.clickhouse_query(clickhouse, create)
    reloaded = _load(db, table_name, target, "--incremental-by", "updated_at", env=env)
    assert "1,000 rows" in reloaded and "note:" not in reloaded, reloaded
    _update(db, table_name, 1)
    _load(db, table_name, target, "--incremental-by", "updated_at", env=env)
    assert services.clickhouse_query(
        clickhouse, f"SELECT count(), sum(v) FROM default.{table_name} FINAL").split() == \
        ["1000", "10"]


def test_incremental_by_updated_at_into_a_cluster_names_the_local_table(
        postgres: services.Service, weighted_cluster: services.ClickHouseCluster,
        table_name: str) -> None:
    db = Source("postgresql", postgres)
    _versioned(db, table_name)
    schema = "id Int64, v Int32, updated_at DateTime('UTC')"
    for server in weighted_cluster.servers:
        services.clickhouse_query(server, f"CREATE TABLE default.{table_name}_local "
                                          f"({schema}) ENGINE = MergeTree ORDER BY id")
    services.clickhouse_query(weighted_cluster.servers[0], (
        f"CREATE TABLE default.{table_name} AS default.{table_name}_local ENGINE = "
        f"Distributed({weighted_cluster.name}, default, {table_name}_local, id)"))
    target = f"{weighted_cluster.servers[0].url}/default"
    shards = [a for s in weighted_cluster.servers for a in ("--shard", f"{s.endpoint}={s.url}")]
    first = _load(db, table_name, target, "--incremental-by", "updated_at", *shards)
    note = _note(first)
    assert f"default.{table_name}_local is a MergeTree" in note, first
    assert "on each shard" in note, note
    create = _create_in(note)
    assert f"`{table_name}_local`" in create and "ReplacingMergeTree(`updated_at`)" in create
    for server in weighted_cluster.servers:  # the CREATE as given runs on 18.16
        services.clickhouse_query(server, f"DROP TABLE default.{table_name}_local")
        services.clickhouse_query(server, create)
    reloaded = _load(db, table_name, target, "--incremental-by", "updated_at", *shards)
    assert "1,000 rows" in reloaded and "note:" not in reloaded, reloaded
