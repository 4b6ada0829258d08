"""The services the stream, database and cluster work will test against, each used once.

Why: fixtures for Kafka, PostgreSQL, MariaDB, ZooKeeper and the two ZooKeeper-era
ClickHouse clusters land before the tests that need them; this file proves they start,
answer through the real clients (the test extras), listen on 127.0.0.1 only and keep
their data across a restart. Opt-in, because installing them costs CI time:

    python3 scripts/services/services.py install streams
    CHLOAD_TEST_STREAMS=1 python3 -m pytest -q tests/integration/test_services_new.py
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import services

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("CHLOAD_TEST_STREAMS") != "1",
        reason="stream/database/cluster services: run `python3 scripts/services/services.py "
               "install streams`, then set CHLOAD_TEST_STREAMS=1"),
]


def _require(*names: str) -> None:
    for name in names:
        if not services.is_installed(name):
            pytest.fail(f"{name} is not installed: run python3 scripts/services/services.py "
                        f"install {name}")


def _listening_addresses(pid: int) -> set[str]:
    """Local addresses of the TCP sockets process ``pid`` listens on ("127.0.0.1:port")."""
    fd_dir = Path(f"/proc/{pid}/fd")
    links = [os.readlink(fd) for fd in fd_dir.iterdir()]
    inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                address, port = cols[1].split(":")
                ip = ".".join(str(b) for b in reversed(bytes.fromhex(address))) \
                    if len(address) == 8 else address
                found.add(f"{ip}:{int(port, 16)}")
    return found


def assert_loopback_only(service: services.Service) -> None:
    addresses = _listening_addresses(service.pid)
    assert addresses, f"{service.name} listens on nothing"
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def kafka(base: Path) -> Iterator[services.Service]:
    _require("kafka")
    broker = services.start_kafka(base)
    yield broker
    broker.stop()


def _consume_all(bootstrap: str, topic: str, partitions: int, want: int) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < want and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            got.append(message.value())
    consumer.close()
    return got


def test_kafka_keeps_topics_and_messages_across_a_hard_restart(kafka: services.Service) -> None:
    from confluent_kafka import Producer

    bootstrap = kafka.extra["bootstrap"]
    assert bootstrap == kafka.endpoint and bootstrap.startswith("127.0.0.1:")
    assert_loopback_only(kafka)
    services.kafka_create_topic(kafka, "events", partitions=4)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(100):
        producer.produce("events", key=str(i).encode(), value=f'{{"id": {i}}}'.encode())
    assert producer.flush(30) == 0
    del producer

    kafka.restart(hard=True)

    assert kafka.extra["bootstrap"] == bootstrap
    got = _consume_all(bootstrap, "events", 4, 100)
    assert sorted(got) == sorted(f'{{"id": {i}}}'.encode() for i in range(100))


def test_postgres_as_loader_and_through_chdb(base: Path) -> None:
    import psycopg

    _require("postgres")
    server = services.start_postgres(base)
    try:
        assert_loopback_only(server)
        with psycopg.connect(server.url) as conn:
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, doc jsonb)")
            conn.execute("INSERT INTO orders SELECT g, jsonb_build_object('n', g) "
                         "FROM generate_series(1, 1000) g")
        server.restart()
        pw = server.credentials["password"]
        got = services.chdb_query(f"SELECT count(), sum(id) FROM postgresql("
                                  f"'{server.endpoint}', 'shop', 'orders', 'loader', '{pw}')")
        assert got.split() == ["1000", "500500"]
    finally:
        server.stop()


def test_mariadb_as_loader_and_through_chdb(base: Path) -> None:
    import pymysql

    _require("mariadb")
    server = services.start_mariadb(base)
    try:
        assert_loopback_only(server)
        host, port = server.endpoint.split(":")
        conn = pymysql.connect(host=host, port=int(port), user="loader",
                               password=server.credentials["password"], database="shop",
                               autocommit=True)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, name VARCHAR(20))")
            cur.executemany("INSERT INTO orders VALUES (%s, %s)",
                            [(i, f"n{i}") for i in range(1, 101)])
        conn.close()
        pw = server.credentials["password"]
        got = services.chdb_query(f"SELECT count(), sum(id) FROM mysql("
                                  f"'{server.endpoint}', 'shop', 'orders', 'loader', '{pw}')")
        assert got.split() == ["100", "5050"]
    finally:
        server.stop()


def test_zookeeper_standalone_on_loopback(base: Path) -> None:
    _require("zookeeper")
    zk = services.start_zookeeper(base)
    try:
        assert_loopback_only(zk)
        assert "Mode: standalone" in services.zookeeper_command(zk.ports["client"], "srvr")
    finally:
        zk.stop()


def q(server: services.Service, sql: str, **settings: object) -> str:
    return services.clickhouse_query(server, sql, settings=settings).strip()


def test_weighted_cluster_splits_rows_by_weight(base: Path) -> None:
    _require("clickhouse")
    cluster = services.start_weighted_cluster(base, internal_replication=True)
    try:
        first = cluster.servers[0]
        weights = q(first, "SELECT groupArray(shard_weight) FROM "
                           f"(SELECT shard_weight FROM system.clusters "
                           f"WHERE cluster = '{cluster.name}' ORDER BY shard_num)")
        assert weights == "[1,2,1]"
        for server in cluster.servers:
            assert_loopback_only(server)
            q(server, "CREATE TABLE t_local (a UInt32) ENGINE = MergeTree ORDER BY a")
        q(first, f"CREATE TABLE t AS t_local ENGINE = Distributed({cluster.name}, default, "
                 "t_local, a)")
        q(first, "INSERT INTO t SELECT toUInt32(number) FROM system.numbers LIMIT 4000",
          insert_distributed_sync=1)
        cluster.server(2).restart(hard=True)
        assert [q(s, "SELECT count() FROM t_local") for s in cluster.servers] == \
            ["1000", "2000", "1000"]
        assert q(first, "SELECT count() FROM t") == "4000"
    finally:
        cluster.stop()


def test_replicated_cluster_replicates_within_a_shard(base: Path) -> None:
    _require("clickhouse", "zookeeper")
    cluster = services.start_replicated_cluster(base)
    try:
        assert len(cluster.servers) == 4 and len(cluster.helpers) == 1
        for server in [*cluster.servers, *cluster.helpers]:
            assert_loopback_only(server)
        entry = cluster.servers[0]
        q(entry, f"CREATE TABLE t ON CLUSTER {cluster.name} (a UInt32) ENGINE = "
                 "ReplicatedMergeTree('/clickhouse/tables/{cluster}/{shard}/t', '{replica}') "
                 "ORDER BY a")
        q(entry, f"CREATE TABLE t_all ON CLUSTER {cluster.name} AS t "
                 f"ENGINE = Distributed({cluster.name}, default, t, a)")
        q(cluster.server(1, 1), "INSERT INTO t VALUES (1), (2), (3)")
        q(cluster.server(2, 2), "INSERT INTO t VALUES (4)")
        _wait(lambda: q(cluster.server(1, 2), "SELECT count() FROM t") == "3")
        _wait(lambda: q(cluster.server(2, 1), "SELECT count() FROM t") == "1")
        assert q(cluster.server(2, 1), "SELECT sum(a) FROM t_all") == "10"
    finally:
        cluster.stop()


def _wait(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not replicated in time"
        time.sleep(0.2)
