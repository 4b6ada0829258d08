"""Change capture into a 3-shard 18.16 cluster (weights 1/2/1): a PostgreSQL table and a
MariaDB table followed into a Distributed table that `--cluster` makes.

Each test: a first run with --follow (the copy, then changes) stopped by SIGTERM, more
changes, a run without --follow that catches up; then the current rows read from the
Distributed table (`FINAL WHERE NOT _is_deleted`) equal the source's, every column of
every key, and every key's rows (each version, deletes too) are on exactly one shard,
the one its hash names. A Distributed table whose key is not of the followed key alone
is refused in one line. A run SIGKILLed between two shards' commits of a unit of changes
(`CHLOAD_CRASH_AT=cluster-commit-shard-2`: the unit on shard 1 only) is resumed by the
next run, with --follow or without: the same current rows, no version twice on a shard.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from decimal import Decimal

import pytest
import services
from conftest import DATABASE_PASSWORD, run_chload
from test_databases import Source

pytestmark = pytest.mark.integration

ROWS = 300
NULL = "<null>"  # a NULL note as the source's client prints it here
SLOTS = {1: [0], 2: [1, 2], 3: [3]}  # weights 1/2/1: the key's hash % 4 -> shard
PG_TABLE = """CREATE TABLE {t} (id bigint PRIMARY KEY, amount numeric(12,3), note text,
    n int NOT NULL);
INSERT INTO {t} SELECT g, g * 1.125, CASE WHEN g % 5 = 0 THEN NULL ELSE 'note ' || g END,
    g % 7 FROM generate_series(1, {rows}) g"""
MY_TABLE = """CREATE TABLE {t} (id BIGINT PRIMARY KEY, amount DECIMAL(12,3), note VARCHAR(100),
    n INT NOT NULL)"""
MY_ROWS = """INSERT INTO {t} SELECT seq, seq * 1.125, IF(seq % 5 = 0, NULL, CONCAT('note ', seq)),
    seq % 7 FROM seq_1_to_{rows}"""
# inserts, updates, deletes and a key moved, in one transaction; {m} marks the round
CHANGES = """{begin};
INSERT INTO {t} VALUES ({m}, 0.5, 'marker', 1);
UPDATE {t} SET amount = amount + 1, note = 'upd', n = n + 1 WHERE id % 7 = {k};
DELETE FROM {t} WHERE id % 11 = {k};
UPDATE {t} SET id = id + 100000 WHERE id = {moved};
COMMIT"""


def _cluster_args(cluster: services.ClickHouseCluster) -> list[str]:
    return ["--target", f"{cluster.servers[0].url}/default",
            *[a for s in cluster.servers for a in ("--shard", f"{s.endpoint}={s.url}")]]


def _q(server: services.Service, sql: str) -> str:
    return services.clickhouse_query(server, sql).strip()


def _env(source: Source) -> dict[str, str]:
    return {**os.environ, **source.env}


def _changes(source: Source, table: str, marker: int, k: int, moved: int) -> None:
    begin = "BEGIN" if source.kind == "postgresql" else "START TRANSACTION"
    source.sql(CHANGES.format(begin=begin, t=table, m=marker, k=k, moved=moved))


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[str], what: str,
          seconds: float = 45) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the follow ended before {what}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what} did not happen within {seconds:.0f} s")
        time.sleep(0.3)


def _follow_until(source: Source, cluster: services.ClickHouseCluster, table: str,
                  marker: int, *args: str, first_run: bool = False) -> None:
    """A --follow run stopped by SIGTERM once the row `marker` is applied (the first
    run: --cluster makes the table, copies it, then round 1 of changes is made)."""
    first = cluster.servers[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "chload", "load", source.url(table), "--table", table,
         "--follow", *args, *_cluster_args(cluster)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(source))
    try:
        if first_run:
            _wait(lambda: _q(first, "SELECT count() FROM system.tables WHERE database = "
                                    f"'default' AND name = '{table}'") == "1", proc,
                  "the table")
            _wait(lambda: _q(first, f"SELECT count() FROM default.{table}") == str(ROWS),
                  proc, "the copy")
            _changes(source, table, marker, 3, 2)
        _wait(lambda: _q(first, f"SELECT count() FROM default.{table} WHERE id = {marker}")
              == "1", proc, "the changes")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err


def _follow_then_catch_up(source: Source, cluster: services.ClickHouseCluster,
                          table: str) -> None:
    """--follow --cluster: the copy, a round of changes applied, SIGTERM; a second round
    of changes, then a run without --follow that applies it and exits."""
    _follow_until(source, cluster, table, 10_001, "--cluster", cluster.name, first_run=True)
    _changes(source, table, 10_002, 4, 9)
    done = run_chload("load", source.url(table), "--table", table, *_cluster_args(cluster),
                      env=source.env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert DATABASE_PASSWORD not in done.stdout + done.stderr


def _assert_current_rows_and_placement(source: Source, cluster: services.ClickHouseCluster,
                                       table: str) -> None:
    first = cluster.servers[0]
    engines = {_q(s, f"SELECT engine_full FROM system.tables WHERE name = '{table}_local'")
               for s in cluster.servers}
    assert len(engines) == 1 and next(iter(engines)).startswith(
        "ReplacingMergeTree(_version) ORDER BY id"), engines
    assert "cityHash64(id)" in _q(first, f"SELECT engine_full FROM system.tables WHERE "
                                         f"name = '{table}'")
    got = _rows(_q(first, f"SELECT id, amount, note, n FROM default.{table} FINAL "
                          "WHERE NOT _is_deleted ORDER BY id FORMAT TSV"))
    wanted = _source_rows(source, table)
    assert len(wanted) > ROWS // 2 and 10_001 in wanted and 10_002 in wanted
    assert got == wanted
    # every version of a key (deletes too) on one shard: the one its hash names
    seen: dict[int, int] = {}
    versions = 0
    for shard, slots in SLOTS.items():
        server = cluster.server(shard)
        wrong = _q(server, f"SELECT count() FROM default.{table}_local "
                           f"WHERE NOT has({slots}, cityHash64(id) % 4)")
        assert wrong == "0", (shard, wrong)
        for line in _q(server, f"SELECT id FROM default.{table}_local").splitlines():
            key = int(line)
            assert seen.setdefault(key, shard) == shard, (key, seen[key], shard)
            versions += 1
    assert len(seen) > len(wanted) and versions > len(seen)  # deleted keys, old versions kept


def _listed(source: Source, cluster: services.ClickHouseCluster, table: str,
            *args: str) -> list[dict]:
    """`chload sources` on the cluster's entry server: its entries for `table` (and none
    for the shards' local table, which is the cluster's, not a follow of its own)."""
    done = run_chload("sources", *_cluster_args(cluster), "--json", *args, env=source.env,
                      timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout)
    assert not [f for f in found if f["table"] == f"default.{table}_local"], found
    return [f for f in found if f["table"] == f"default.{table}"]


def _rows(text: str) -> dict[int, tuple]:
    out = {}
    for line in text.splitlines():
        id_, amount, note, n = line.split("\t")
        assert int(id_) not in out, f"key {id_} twice: {text}"
        out[int(id_)] = (Decimal(amount), None if note in ("\\N", NULL) else note, int(n))
    return out


def _source_rows(source: Source, table: str) -> dict[int, tuple]:
    return _rows(source.sql(f"SELECT id, amount, coalesce(note, '{NULL}'), n FROM {table}"))


def test_a_postgres_table_followed_into_a_cluster_equals_the_source_and_keys_stay_on_a_shard(
        postgres: services.Service, weighted_cluster: services.ClickHouseCluster) -> None:
    source, table = Source("postgresql", postgres), f"t_{uuid.uuid4().hex[:10]}"
    source.sql(PG_TABLE.format(t=table, rows=ROWS))
    _follow_then_catch_up(source, weighted_cluster, table)
    _assert_current_rows_and_placement(source, weighted_cluster, table)
    # `chload sources` on the entry server lists it at the position every shard has
    # (the slot's, moved there after the catch-up's commit), and --drop drops its slot
    listed = _listed(source, weighted_cluster, table)
    assert len(listed) == 1 and "error" not in listed[0], listed
    slot = listed[0]["slot"]
    confirmed = f"SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"
    assert listed[0]["position"] == source.sql(confirmed).strip(), listed
    assert listed[0]["lag_bytes"] >= 0 and listed[0]["retained_bytes"] >= 0
    dropped = _listed(source, weighted_cluster, table, "--drop", table)
    assert dropped == [{"table": f"default.{table}", "source": listed[0]["source"],
                        "slot": slot, "position": listed[0]["position"], "dropped": True}]
    assert source.sql(confirmed).strip() == ""


def test_a_mariadb_table_followed_into_a_cluster_equals_the_source_and_keys_stay_on_a_shard(
        mariadb: services.Service, weighted_cluster: services.ClickHouseCluster) -> None:
    source, table = Source("mysql", mariadb), f"t_{uuid.uuid4().hex[:10]}"
    source.sql(MY_TABLE.format(t=table))
    source.sql(MY_ROWS.format(t=table, rows=ROWS))
    _follow_then_catch_up(source, weighted_cluster, table)
    _assert_current_rows_and_placement(source, weighted_cluster, table)
    listed = _listed(source, weighted_cluster, table)
    assert len(listed) == 1 and listed[0]["kind"] == "mysql", listed
    assert "error" not in listed[0] and listed[0]["binlog"].count(":") == 1, listed
    assert listed[0]["lag_bytes"] >= 0


@pytest.mark.parametrize(("kind", "key"), [("postgresql", "rand()"),
                                           ("mysql", "intHash64(n)")])
def test_a_distributed_table_not_sharded_by_the_key_is_refused_in_one_line(
        kind: str, key: str, request: pytest.FixtureRequest,
        weighted_cluster: services.ClickHouseCluster) -> None:
    source = Source(kind, request.getfixturevalue("postgres" if kind == "postgresql"
                                                  else "mariadb"))
    table = f"t_{uuid.uuid4().hex[:10]}"
    source.sql((PG_TABLE if kind == "postgresql" else MY_TABLE).format(t=table, rows=ROWS))
    columns = ("id Int64, amount Nullable(Decimal(12, 3)), note Nullable(String), n Int32, "
               "_version UInt64 DEFAULT 0, _is_deleted UInt8 DEFAULT 0")
    for server in weighted_cluster.servers:
        _q(server, f"CREATE TABLE default.{table}_local ({columns}) "
                   "ENGINE = ReplacingMergeTree(_version) ORDER BY id")
    _q(weighted_cluster.servers[0], f"CREATE TABLE default.{table} ({columns}) ENGINE = "
                                    f"Distributed({weighted_cluster.name}, default, "
                                    f"{table}_local, {key})")
    slots = "SELECT count(*) FROM pg_replication_slots"
    before = source.sql(slots) if kind == "postgresql" else ""
    done = run_chload("load", source.url(table), "--table", table, "--follow",
                      *_cluster_args(weighted_cluster), env=source.env, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"table default.{table}: a Distributed table with sharding key {key}" \
        in done.stderr
    assert "different shards" in done.stderr and "cityHash64(id)" in done.stderr
    assert _q(weighted_cluster.servers[0], f"SELECT count() FROM default.{table}") == "0"
    if kind == "postgresql":
        assert source.sql(slots) == before  # refused before a slot was made



@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_cluster_into_an_existing_plain_table_is_refused_in_one_line(
        kind: str, request: pytest.FixtureRequest,
        weighted_cluster: services.ClickHouseCluster) -> None:
    """--cluster NAME with --table naming a plain (not Distributed) table on the target
    server: one line, before a slot, a copy or a row (PostgreSQL and MariaDB alike)."""
    source = Source(kind, request.getfixturevalue("postgres" if kind == "postgresql"
                                                  else "mariadb"))
    table = f"t_{uuid.uuid4().hex[:10]}"
    source.sql((PG_TABLE if kind == "postgresql" else MY_TABLE).format(t=table, rows=ROWS))
    first = weighted_cluster.servers[0]
    _q(first, f"CREATE TABLE default.{table} (id Int64, amount Nullable(Decimal(12, 3)), "
              "note Nullable(String), n Int32, _version UInt64 DEFAULT 0, _is_deleted UInt8 "
              "DEFAULT 0) ENGINE = ReplacingMergeTree(_version) ORDER BY id")
    slots = "SELECT count(*) FROM pg_replication_slots"
    before = source.sql(slots) if kind == "postgresql" else ""
    done = run_chload("load", source.url(table), "--table", table, "--follow", "--cluster",
                      weighted_cluster.name, "--target", f"{first.url}/default",
                      env=source.env, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert (f"--cluster {weighted_cluster.name}: table default.{table} exists and is not a "
            "Distributed table") in done.stderr
    assert _q(first, f"SELECT count() FROM default.{table}") == "0"
    assert _listed(source, weighted_cluster, table) == []  # no follow recorded
    if kind == "postgresql":
        assert source.sql(slots) == before  # refused before a slot was made


def _units(server: services.Service, table: str) -> set[str]:
    """The units of changes a shard's own ledger has committed for its local table."""
    return set(_q(server, "SELECT DISTINCT uri FROM chload.files WHERE target_table = "
                          f"'default.{table}_local' AND state IN ('loaded', 'committing') "
                          "AND uri LIKE '%changes://%'").splitlines())


def _lsn(text: str) -> int:
    high, _, low = text.strip().partition("/")
    return (int(high, 16) << 32) + int(low, 16)


@pytest.mark.parametrize(("kind", "rerun"), [("postgresql", "follow"), ("mysql", "catch-up"),
                                             ("postgresql", "catch-up"), ("mysql", "follow")])
def test_a_follow_killed_between_two_shards_commits_of_a_unit_resumes_on_the_others(
        kind: str, rerun: str, request: pytest.FixtureRequest,
        weighted_cluster: services.ClickHouseCluster) -> None:
    """The loader SIGKILLed right after shard 1 committed a unit of changes (before
    shard 2's commit): the next run (with --follow, or without) reads that unit's range
    again, commits it on shards 2 and 3 only, then goes on; the slot is not confirmed
    past the unit meanwhile; the current rows equal the source's, no version twice."""
    source = Source(kind, request.getfixturevalue("postgres" if kind == "postgresql"
                                                  else "mariadb"))
    cluster, table = weighted_cluster, f"t_{uuid.uuid4().hex[:10]}"
    source.sql((PG_TABLE if kind == "postgresql" else MY_TABLE).format(t=table, rows=ROWS))
    if kind == "mysql":
        source.sql(MY_ROWS.format(t=table, rows=ROWS))
    _follow_until(source, cluster, table, 10_001, "--cluster", cluster.name, first_run=True)
    before = {n: _units(cluster.server(n), table) for n in SLOTS}
    assert before[1] and before[1] == before[2] == before[3], before
    _changes(source, table, 10_002, 4, 9)
    crashed = run_chload("load", source.url(table), "--table", table, *_cluster_args(cluster),
                         env={**source.env, "CHLOAD_CRASH_AT": "cluster-commit-shard-2"},
                         timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    cut = {n: _units(cluster.server(n), table) - before[n] for n in SLOTS}
    assert len(cut[1]) == 1 and not cut[2] and not cut[3], cut  # on shard 1 only
    listed = _listed(source, cluster, table)
    assert len(listed) == 1 and "error" not in listed[0], listed
    if kind == "postgresql":  # listed at the unit's start; the slot not confirmed past it
        first, _, last = next(iter(cut[1])).rpartition("/")[2].partition("-")
        confirmed = source.sql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE "
                               f"slot_name = '{listed[0]['slot']}'")
        assert _lsn(listed[0]["position"]) == int(first), (listed, cut)
        assert int(first) <= _lsn(confirmed) <= int(last), (confirmed, cut)
    _changes(source, table, 10_003, 5, 17)  # more changes after the unit cut
    if rerun == "follow":
        _follow_until(source, cluster, table, 10_003)
    else:
        done = run_chload("load", source.url(table), "--table", table,
                          *_cluster_args(cluster), env=source.env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    after = {n: _units(cluster.server(n), table) for n in SLOTS}
    assert after[1] == after[2] == after[3] and cut[1] <= after[2], after
    _assert_current_rows_and_placement(source, cluster, table)
    assert 10_003 in _source_rows(source, table)
    for n in SLOTS:  # no version of a key committed twice on any shard
        twice = _q(cluster.server(n), f"SELECT id, _version, count() AS c FROM "
                                      f"default.{table}_local GROUP BY id, _version "
                                      "HAVING c > 1")
        assert twice == "", (n, twice)
