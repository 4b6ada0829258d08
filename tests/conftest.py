"""Shared fixtures: real services started once per test session, stopped by PID.

Services come from scripts/services/services.py (installed by scripts/test). A test
that needs one asks for its fixture; a service that is not installed fails the test
with the install command to run, rather than skipping silently: CI installs them all.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "services"))
sys.path.insert(0, str(ROOT / "bench"))

import services  # noqa: E402


def _require(name: str) -> None:
    if not services.is_installed(name):
        pytest.fail(f"{name} is not installed: run python3 scripts/services/services.py "
                    f"install {name} (scripts/test does it)")


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def clickhouse(services_dir: Path) -> Iterator[services.Service]:
    """A real ClickHouse 18.16 server on 127.0.0.1 (user default, and loader/password)."""
    _require("clickhouse")
    server = services.start_clickhouse_server(services_dir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def minio(services_dir: Path) -> Iterator[services.Service]:
    _require("minio")
    server = services.start_minio(services_dir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def hdfs(services_dir: Path) -> Iterator[services.Service]:
    _require("hdfs")
    server = services.start_hdfs(services_dir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kafka(services_dir: Path) -> Iterator[services.Service]:
    """A real Kafka 4.3 broker (KRaft) on 127.0.0.1; topics via services.kafka_create_topic."""
    _require("kafka")
    broker = services.start_kafka(services_dir)
    yield broker
    broker.stop()


DATABASE_PASSWORD = "pw-Db-7f3kq9Zx"  # the tests look for it everywhere: it must not appear


@pytest.fixture(scope="session")
def postgres(services_dir: Path) -> Iterator[services.Service]:
    """A real PostgreSQL 15 on 127.0.0.1: role loader (DATABASE_PASSWORD) owns db shop."""
    _require("postgres")
    server = services.start_postgres(services_dir, password=DATABASE_PASSWORD)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mariadb(services_dir: Path) -> Iterator[services.Service]:
    """A real MariaDB 10.11 on 127.0.0.1: user loader (DATABASE_PASSWORD), db shop."""
    _require("mariadb")
    server = services.start_mariadb(services_dir, password=DATABASE_PASSWORD)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def weighted_cluster(services_dir: Path) -> Iterator[services.ClickHouseCluster]:
    """Three 18.16 servers, one shard each, weighted 1/2/1 (scripts/services/clusters.py)."""
    _require("weighted-cluster")
    cluster = services.start_weighted_cluster(services_dir)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def replicated_cluster(services_dir: Path) -> Iterator[services.ClickHouseCluster]:
    """2 shards x 2 replicas of 18.16 with ZooKeeper (ReplicatedMergeTree, ON CLUSTER)."""
    _require("replicated-cluster")
    cluster = services.start_replicated_cluster(services_dir)
    yield cluster
    cluster.stop()


@pytest.fixture
def table_name() -> str:
    """A table name of its own for each test."""
    return f"t_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def target_dir(tmp_path: Path) -> str:
    """An embedded target directory of its own for each test."""
    return str(tmp_path / "target")


def run_chload(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the real `chload` command (as a user would) and return its result."""
    return subprocess.run(
        [sys.executable, "-m", "chload", *args], input=stdin.decode() if stdin else None,
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


@contextlib.contextmanager
def serving_http(handler: object) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 (a free port) answering with `handler` on its own
    threads while the block runs: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
