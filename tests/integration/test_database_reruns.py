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
    note = next(line for line in again.splitlines() if "note:" in line)
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
