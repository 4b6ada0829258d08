"""Kafka topics into a Distributed table on the 3-shard 18.16 cluster, against a real
broker: each shard's ledger holds the units under its local table, and a run's plan,
its commits and a rerun read them there (plan.committed through the cluster's ledger),
so reruns load exactly what is new, a kill -9 mid-load then a rerun ends exact, and a
re-created topic is refused until --force.

Messages are JSON rows `{"id": n, ...}` with ids unique across a topic, so
`count() = uniqExact(id) = produced` over the Distributed table is the exactly-once check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import services
from conftest import kill_when
from test_cluster import q, shard_args
from test_kafka import _produce, _report, _report_of, _topic, _uri
from test_kafka_recreated import _re_create

from chload.core.run import LOADED_IN_PART

pytestmark = pytest.mark.integration

SCHEMA = "id UInt64, name String, v Float64"


def _tables(cluster: services.ClickHouseCluster, key: str = "cityHash64(id)") -> str:
    name = f"t_{uuid.uuid4().hex[:10]}"
    for server in cluster.servers:
        q(server, f"CREATE TABLE default.{name}_local ({SCHEMA}) ENGINE = MergeTree ORDER BY id")
    q(cluster.servers[0], f"CREATE TABLE default.{name} AS default.{name}_local "
                          f"ENGINE = Distributed({cluster.name}, default, {name}_local, {key})")
    return name


def _args(cluster: services.ClickHouseCluster, uri: str, table: str, *extra: str) -> list[str]:
    return ["load", uri, "--table", table, "--target", f"{cluster.servers[0].url}/default",
            *shard_args(cluster), "--json", *extra]


def _load(cluster: services.ClickHouseCluster, uri: str, table: str, *extra: str,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chload", *_args(cluster, uri, table, *extra)],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, **(env or {})})


def _counts(cluster: services.ClickHouseCluster, table: str) -> tuple[int, int]:
    count, unique = q(cluster.servers[0],
                      f"SELECT count(), uniqExact(id) FROM default.{table}").split()
    return int(count), int(unique)


def _loaded(done: subprocess.CompletedProcess[str]) -> int:
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return int(_report(done)["rows_loaded"])


def test_reruns_load_exactly_the_new_messages(kafka, weighted_cluster):
    """The case found: one partition, units of 300; the rerun loaded nothing of 200 new
    messages (its plan read no marks and started at offset 0)."""
    table = _tables(weighted_cluster)
    topic = _topic(kafka, partitions=1)
    uri = _uri(kafka, topic)
    _produce(kafka, topic, range(1_000), partitions=1)
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "300")) == 1_000
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "300")) == 0
    _produce(kafka, topic, range(1_000, 1_200), partitions=1)
    again = _load(weighted_cluster, uri, table, "--batch-rows", "300")
    assert _loaded(again) == 200
    assert [f["uri"].rsplit("/", 1)[1] for f in _report(again)["files"]] == ["1000-1199"]
    assert _counts(weighted_cluster, table) == (1_200, 1_200)


def test_a_unit_whose_rows_all_go_to_one_shard_counts_as_loaded(kafka, weighted_cluster):
    """Keyed by the id itself, multiples of 4 all go to shard 1 (slot 0 of weights
    1/2/1): shards 2 and 3 commit the units empty, and their ledgers record them, so a
    rerun sees every unit loaded and goes on from there."""
    table = _tables(weighted_cluster, key="id")
    topic = _topic(kafka, partitions=2)
    uri = _uri(kafka, topic)
    _produce(kafka, topic, range(0, 4_000, 4), partitions=2)
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "200")) == 1_000
    locals_ = [int(q(s, f"SELECT count() FROM default.{table}_local"))
               for s in weighted_cluster.servers]
    assert locals_ == [1_000, 0, 0]
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "200")) == 0
    _produce(kafka, topic, range(4_000, 4_400, 4), partitions=2)
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "200")) == 100
    assert _counts(weighted_cluster, table) == (1_100, 1_100)


def test_killed_between_shards_commits_then_rerun_is_exact(kafka, weighted_cluster):
    """SIGKILL before shard 2 commits its 3rd unit (shard 1 has it; shard 3 may): the
    rerun, with other --batch-rows, loads that unit again on the shards that lack it,
    whole, then the rest; then a kill -9 at a moment of its own (rows committed, the
    load going on) and a rerun: every message once."""
    table = _tables(weighted_cluster)
    topic = _topic(kafka, partitions=1)
    uri = _uri(kafka, topic)
    _produce(kafka, topic, range(3_000), partitions=1)
    crash = _load(weighted_cluster, uri, table, "--batch-rows", "500",
                  env={"CHLOAD_CRASH_AT": "cluster-commit-shard-2:3"})
    assert crash.returncode == -9, crash.stderr
    shard2 = int(q(weighted_cluster.server(2), f"SELECT count() FROM default.{table}_local"))
    shard1_ids = q(weighted_cluster.server(1), f"SELECT max(id) FROM default.{table}_local")
    assert int(shard1_ids) >= 1_000 and 0 < shard2  # shard 1 ahead of shard 2
    done = _load(weighted_cluster, uri, table, "--batch-rows", "700")
    names = [f["uri"].rsplit("/", 1)[1] for f in _report(done)["files"]]
    assert names[0] == "1000-1499", names  # the unit shard 1 has, whole
    assert _loaded(done) == 3_000 - 1_000 - _shard1_rows_of(weighted_cluster, table, 1_000, 1_499)
    assert _counts(weighted_cluster, table) == (3_000, 3_000)

    _produce(kafka, topic, range(3_000, 60_000), partitions=1)
    args = _args(weighted_cluster, uri, table, "--batch-rows", "2000")
    loader = subprocess.Popen([sys.executable, "-m", "chload", *args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(loader, lambda: _counts(weighted_cluster, table)[0] > 10_000,
              "units committed", timeout=120)
    assert _counts(weighted_cluster, table)[0] < 60_000
    assert _load(weighted_cluster, uri, table, "--batch-rows", "3000").returncode == 0
    assert _counts(weighted_cluster, table) == (60_000, 60_000)


def _shard1_rows_of(cluster: services.ClickHouseCluster, table: str, first: int,
                    last: int) -> int:
    return int(q(cluster.server(1), f"SELECT count() FROM default.{table}_local WHERE "
                                    f"id BETWEEN {first} AND {last}"))


def test_two_loaders_in_a_consumer_group_load_each_message_once(kafka, weighted_cluster):
    table = _tables(weighted_cluster)
    topic = _topic(kafka, partitions=4)
    uri = _uri(kafka, topic)
    _produce(kafka, topic, range(40_000))
    args = _args(weighted_cluster, uri, table, "--batch-rows", "1000")
    loaders = [subprocess.Popen([sys.executable, "-m", "chload", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        ended = [p.communicate(timeout=240) for p in loaders]
    finally:
        for p in loaders:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in loaders] == [0, 0], ended
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in ended]
    assert sum(r["rows_loaded"] for r in reports) == 40_000, reports
    assert _counts(weighted_cluster, table) == (40_000, 40_000)
    _produce(kafka, topic, range(40_000, 41_000))
    assert _loaded(_load(weighted_cluster, uri, table)) == 1_000


def test_a_unit_another_loader_finished_on_a_later_shard_counts_the_rows_committed(
        kafka, weighted_cluster):
    """One unit: `first` commits it on shards 1 and 3, then waits before shard 2; `second`
    finds it there on some shards only and commits it on shard 2; `first`'s shard 2 then
    refuses it. Each report counts the rows its run committed (the first's: shards 1
    and 3, not 0 as if all of it had been loaded elsewhere), so they add up to the
    table's."""
    table = _tables(weighted_cluster)
    topic = _topic(kafka, partitions=1)
    uri = _uri(kafka, topic)
    _produce(kafka, topic, range(1_000), partitions=1)

    def local(n: int) -> int:
        return int(q(weighted_cluster.server(n), f"SELECT count() FROM default.{table}_local"))

    args = _args(weighted_cluster, uri, table, "--batch-rows", "1000", "--kafka-option",
                 f"group.id=first-{table}")
    first = subprocess.Popen(
        [sys.executable, "-m", "chload", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "CHLOAD_PAUSE_AT": "cluster-commit-shard-2:25"})
    try:
        deadline = time.monotonic() + 120
        while not (local(1) and local(3)):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "shards 1 and 3 not committed in 120 s"
            time.sleep(0.2)
        assert local(2) == 0
        second = _report(_load(weighted_cluster, uri, table, "--kafka-option",
                               f"group.id=second-{table}"))
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, err
    report = _report_of(out)
    assert second["rows_loaded"] == local(2) > 0, second
    assert report["rows_loaded"] == local(1) + local(3), out
    assert [f["note"] for f in report["files"]] == [LOADED_IN_PART], out
    assert _counts(weighted_cluster, table) == (1_000, 1_000)


def test_a_re_created_topic_is_refused_then_forced(kafka, weighted_cluster):
    table = _tables(weighted_cluster)
    topic = _topic(kafka, partitions=1)
    uri = _uri(kafka, topic)
    _produce(kafka, topic, range(1_100), partitions=1)
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "500")) == 1_100
    _re_create(kafka, topic, 1)
    _produce(kafka, topic, range(10_000, 10_600), partitions=1)
    refused = _load(weighted_cluster, uri, table, "--batch-rows", "500")
    assert refused.returncode == 1, refused.stderr
    assert [f["uri"] for f in _report(refused)["files"] if f["status"] == "failed"
            and "re-created" in f["error"]] == [f"{uri}/0"]
    assert _report(refused)["rows_loaded"] == 0
    forced = _load(weighted_cluster, uri, table, "--batch-rows", "500", "--force")
    assert _loaded(forced) == 600
    assert _report(forced)["files_skipped"] == 0
    assert _counts(weighted_cluster, table) == (1_700, 1_700)
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "500")) == 0
    _produce(kafka, topic, range(20_000, 20_500), partitions=1)
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "500")) == 500
    assert _counts(weighted_cluster, table) == (2_200, 2_200)


def test_by_file_each_partition_goes_whole_to_one_shard(kafka, weighted_cluster):
    """A random key: units go whole to a shard, every unit of a partition to the same
    one (its ledger holds the partition's units in order); reruns load what is new."""
    table = _tables(weighted_cluster, key="rand()")
    topic = _topic(kafka, partitions=4)
    uri = _uri(kafka, topic)
    _produce(kafka, topic, range(4_000))
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "300")) == 4_000
    _produce(kafka, topic, range(4_000, 4_800))
    assert _loaded(_load(weighted_cluster, uri, table, "--batch-rows", "300")) == 800
    assert _counts(weighted_cluster, table) == (4_800, 4_800)
    for server in weighted_cluster.servers:  # each partition's ids (id % 4) on one shard
        held = q(server, f"SELECT DISTINCT id % 4 FROM default.{table}_local").split()
        for other in weighted_cluster.servers:
            if other is not server:
                there = q(other, f"SELECT DISTINCT id % 4 FROM default.{table}_local").split()
                assert not set(held) & set(there), (held, there)
