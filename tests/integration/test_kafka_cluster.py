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
import uuid

import pytest
import services
from conftest import kill_when
from test_cluster import q, shard_args
from test_kafka import _produce, _report, _topic, _uri
from test_kafka_recreated import _re_create

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
