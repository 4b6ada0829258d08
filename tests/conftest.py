"""Shared fixtures: real services started once per test session, stopped by PID.

Services come from scripts/services/services.py (installed by scripts/test). A test
that needs one asks for its fixture; a service that is not installed fails the test
with the install command to run, rather than skipping silently: CI installs them all.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "services"))
sys.path.insert(0, str(ROOT / "bench"))

import services  # noqa: E402

from chload.targets.registry import TargetSpec  # noqa: E402


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
def azurite(services_dir: Path) -> Iterator[services.Service]:
    """Azurite's blob service: an account of its own, credentials["connection_string"]."""
    _require("azurite")
    server = services.start_azurite(services_dir)
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


def target_spec(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> TargetSpec:
    """The target of `kind`: embedded chDB in tmp_path, or the 18.16 server as loader."""
    if kind == "embedded":
        return TargetSpec.resolve(str(tmp_path / "target"), {})
    server: services.Service = request.getfixturevalue("clickhouse")
    return TargetSpec.resolve(f"http://loader@127.0.0.1:{server.ports['http']}/default",
                              {"CLICKHOUSE_PASSWORD": server.credentials["password"]})


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


# -- an embedded load, watched from outside -----------------------------------------------
# While a load runs, its process holds the target directory's flock (runtime/engine.py),
# so `chload sql` cannot look in; the directory itself shows how far the load is. A kill
# test waits for one of these and then kills, rather than after a guessed sleep.

_PART = re.compile(r"^(?!tmp|delete_tmp).+_(\d+)_(\d+)_\d+(?:_\d+)?$")  # partition_min_max_level


def _part_blocks(table_dir: Path) -> list[int]:
    """The highest block number of each active-or-old part in a MergeTree table's data
    directory (temporary parts of an INSERT, merge or attach left out)."""
    if not table_dir.is_dir():
        return []
    return [int(m.group(2)) for m in map(_PART.match, os.listdir(table_dir)) if m]


def top_block(target: str, table: str, database: str = "default") -> int:
    """The highest block number committed into `table`: it grows with each commit (an
    ATTACH PARTITION ... FROM takes new block numbers; a merge does not); 0 before any."""
    return max(_part_blocks(Path(target, "data", database, table)), default=0)


def stage_holds_rows(target: str, pid: int) -> bool:
    """True once a stage table of process `pid` (chload.stage_<machine>_<pid>_<start>_<id>)
    holds a part: that load is parsing rows it has not committed yet."""
    for sql in Path(target, "metadata", "chload").glob(f"stage_*_{pid}_*.sql"):
        try:
            text = sql.read_text(errors="replace")
        except FileNotFoundError:  # that stage was committed and dropped since the glob
            continue
        found = re.search(r"UUID '([0-9a-f-]{36})'", text)
        if found and _part_blocks(Path(target, "store", found[1][:3], found[1])):
            return True
    return False


def wait_while_running(proc: subprocess.Popen, ready: Callable[[], bool], what: str,
                       timeout: float = 120, poll: float = 0.01) -> None:
    """Return once `ready()` holds; fail the test if `proc` ends first or `ready()` does
    not hold within `timeout` (then `proc` is killed)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the load ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(poll)


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], what: str,
              timeout: float = 120) -> None:
    """SIGKILL `proc` as soon as `ready()` holds; fail the test if the process ends first
    (the kill would have interrupted nothing) or `ready()` does not hold within `timeout`."""
    wait_while_running(proc, ready, what, timeout)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL, f"the load ended before {what}"


def kill_moments(target: str, table: str) -> list[tuple[str, Callable[[int, int], bool]]]:
    """Three moments to kill an embedded load of `table` at, as (what, ready(pid, top
    block before the run)): while its first stage fills (on a fresh directory: nothing
    committed), right after its first commit, while a rerun's stage fills over committed
    rows. Each needs the load to have at least two commits' worth of files."""
    def filling(pid: int, before: int) -> bool:
        return stage_holds_rows(target, pid)

    def committed(pid: int, before: int) -> bool:
        return top_block(target, table) > before

    return [("its first stage holds rows", filling), ("its first commit", committed),
            ("a stage of the rerun holds rows", filling)]
