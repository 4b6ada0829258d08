"""ZooKeeper, and the ClickHouse 18.16 clusters the cluster target is tested against.

Why: a load into a cluster has failure modes a single server cannot show: rows split by
shard weight, a shard down mid-insert, replicas that must see a part exactly once, and
``ON CLUSTER`` DDL. Two shapes cover them:

- ``start_weighted_cluster``: 3 shards weighted 1/2/1, one server each, no ZooKeeper;
- ``start_replicated_cluster``: 2 shards x 2 replicas of ReplicatedMergeTree, with
  ZooKeeper 3.8 (Debian's jars), ``<macros>`` and ``<distributed_ddl>`` on every server.

Same rules as services.py: 127.0.0.1 only, free ports, state under ``base_dir``, every
process stopped by PID (a cluster's own ZooKeeper after its servers).
"""

from __future__ import annotations

import shutil
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from services import (
    DEFAULT_LOADER_PASSWORD,
    HOST,
    ClickHouseCluster,
    Phases,
    Service,
    _clickhouse_ready,
    _expect,
    apt_install,
    clickhouse_query,
    clickhouse_service,
    free_ports,
    owns_listener,
    wait_until,
)

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")  # its manifest lists the other jars
WEIGHTED_CLUSTER = "chload_weighted"
REPLICATED_CLUSTER = "chload_replicated"

_ZK_LOG4J = """log4j.rootLogger=WARN,CONSOLE
log4j.logger.org.apache.zookeeper.server.ZooKeeperServer=INFO
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p %c{1}: %m%n
"""


# --------------------------------------------------------------------------- ZooKeeper


def install_zookeeper() -> Path:
    """Debian's ``zookeeper`` (3.8): jars only, no service (``zookeeperd`` would add one)."""
    if not ZOOKEEPER_JAR.exists():
        apt_install("zookeeper", recommends=False)
    return ZOOKEEPER_JAR


def zookeeper_command(port: int, word: str = "ruok", timeout: float = 2.0) -> str:
    """Send a four-letter word (ruok, srvr, mntr) and return the answer."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(word.encode())
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _zookeeper_ready(service: Service) -> None:
    port = service.ports["client"]
    # "ruok" answers imok before the server serves; "srvr" tells its mode once it does
    wait_until(service, lambda: owns_listener(service.pid, port)
               and "Mode: standalone" in zookeeper_command(port, "srvr"),
               f"srvr on {HOST}:{port}", timeout=60)


def start_zookeeper(base_dir: Path, name: str = "zookeeper") -> Service:
    """A standalone ZooKeeper under ``base_dir/name``; endpoint ``127.0.0.1:port``.

    No admin server (it would bind 0.0.0.0:8080), no JMX port; four-letter words
    ruok/srvr/mntr allowed. ``restart()`` keeps the port and the data.
    """
    install_zookeeper()
    data = Path(base_dir).resolve() / name
    conf = data / "conf"
    for sub in (conf, data / "data", data / "log"):
        sub.mkdir(parents=True, exist_ok=True)
    port = free_ports(1)[0]
    settings = {"tickTime": 2000, "initLimit": 10, "syncLimit": 5, "dataDir": data / "data",
                "clientPort": port, "clientPortAddress": HOST, "maxClientCnxns": 0,
                "admin.enableServer": "false", "4lw.commands.whitelist": "ruok,srvr,mntr"}
    (conf / "zoo.cfg").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    (conf / "log4j.properties").write_text(_ZK_LOG4J)
    argv = [shutil.which("java") or "java", "-Xmx256m", "-XX:+UseSerialGC",
            "-Djava.net.preferIPv4Stack=true", f"-Dzookeeper.log.dir={data / 'log'}",
            "-cp", f"{conf}:{ZOOKEEPER_JAR}",
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(conf / "zoo.cfg")]
    return Service(name=name, argv=argv, data_dir=data, ports={"client": port},
                   url=f"zookeeper://{HOST}:{port}", endpoint=f"{HOST}:{port}",
                   ready=_zookeeper_ready).start()


# --------------------------------------------------------------------------- clusters


def _remote_servers(name: str, layout: list[list[dict[str, int]]], weights: list[int],
                    internal_replication: bool) -> dict[str, object]:
    shards = [{"weight": weight, "internal_replication": str(internal_replication).lower(),
               "replica": [{"host": HOST, "port": ports["tcp"]} for ports in replicas]}
              for weight, replicas in zip(weights, layout, strict=True)]
    return {name: {"shard": shards}}


def _start_cluster(  # noqa: PLR0913 - one builder for both shapes
        base_dir: Path, name: str, shape: list[int], weights: list[int], *,
        internal_replication: bool, loader_password: str,
        zookeeper: Service | None = None) -> ClickHouseCluster:
    """``shape[i]`` replicas for shard i+1; servers launched together, then awaited."""
    all_ports = iter(free_ports(3 * sum(shape)))
    layout = [[{key: next(all_ports) for key in ("http", "tcp", "interserver")}
               for _ in range(replicas)] for replicas in shape]
    remote = _remote_servers(name, layout, weights, internal_replication)
    extra: dict[str, object] = {}
    if zookeeper is not None:
        extra = {"zookeeper": {"node": {"host": HOST, "port": zookeeper.ports["client"]},
                               "session_timeout_ms": 30000},
                 "distributed_ddl": {"path": f"/clickhouse/{name}-{uuid.uuid4().hex[:8]}/ddl"}}
    cluster = ClickHouseCluster(name, [])
    try:
        for shard, replicas in enumerate(layout, start=1):
            for replica, ports in enumerate(replicas, start=1):
                server = clickhouse_service(
                    base_dir, f"clickhouse-{name}-s{shard}r{replica}",
                    loader_password=loader_password, ports=ports, remote_servers=remote,
                    macros={"cluster": name, "shard": shard, "replica": f"s{shard}r{replica}"},
                    extra_config=extra)
                server.extra.update(shard=str(shard), replica=str(replica))
                cluster.servers.append(server.launch())
        for server in cluster.servers:
            _clickhouse_ready(server)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_weighted_cluster(base_dir: Path, weights: tuple[int, ...] = (1, 2, 1), *,
                           internal_replication: bool = False,
                           loader_password: str = DEFAULT_LOADER_PASSWORD,
                           name: str = WEIGHTED_CLUSTER) -> ClickHouseCluster:
    """One server per shard, shard i weighted ``weights[i]`` (default 3 shards, 1/2/1).

    No ZooKeeper: Distributed tables, remote() and cluster() work, ON CLUSTER does not.
    A Distributed table sharded by ``key`` sends a row to the shard whose slot holds
    ``key % sum(weights)`` (shard 1: slot 0, shard 2: slots 1-2, shard 3: slot 3).
    """
    return _start_cluster(base_dir, name, [1] * len(weights), list(weights),
                          internal_replication=internal_replication,
                          loader_password=loader_password)


def start_replicated_cluster(base_dir: Path, shards: int = 2, replicas: int = 2, *,
                             zookeeper: Service | None = None,
                             loader_password: str = DEFAULT_LOADER_PASSWORD,
                             name: str = REPLICATED_CLUSTER) -> ClickHouseCluster:
    """``shards`` x ``replicas`` servers with ZooKeeper; internal_replication is true.

    Macros on every server: ``{cluster}``, ``{shard}`` (1..n) and ``{replica}``
    (``s<shard>r<replica>``), so one ON CLUSTER statement creates
    ``ReplicatedMergeTree('/clickhouse/tables/{cluster}/{shard}/TABLE', '{replica}')``
    everywhere. Give each table its own ZooKeeper path (the table name in it).
    Without ``zookeeper``, the cluster starts its own (``helpers``), stopped with it.
    """
    own = start_zookeeper(base_dir, f"zookeeper-{name}") if zookeeper is None else None
    try:
        cluster = _start_cluster(base_dir, name, [replicas] * shards, [1] * shards,
                                 internal_replication=True, loader_password=loader_password,
                                 zookeeper=zookeeper or own)
    except BaseException:
        if own is not None:
            own.stop()
        raise
    if own is not None:
        cluster.helpers.append(own)
    return cluster



# --------------------------------------------------------------------------- smoke


def _smoke_zookeeper(base: Path) -> str:
    phases = Phases()
    with phases("start"):
        zk = start_zookeeper(base)
    try:
        with phases("mntr"):
            stats = dict(line.split("\t", 1) for line in
                         zookeeper_command(zk.ports["client"], "mntr").splitlines() if "\t" in line)
            _expect(stats.get("zk_server_state"), "standalone")
    finally:
        with phases("stop"):
            zk.stop()
    return f"{zk.endpoint}: standalone, {stats.get('zk_znode_count')} znodes; {phases}"


def _smoke_weighted(base: Path) -> str:
    phases = Phases()
    with phases("start 3 servers"):
        cluster = start_weighted_cluster(base)
    try:
        with phases("distributed insert"):
            for server in cluster.servers:
                clickhouse_query(server, "CREATE TABLE t_local (a UInt32) "
                                         "ENGINE = MergeTree ORDER BY a")
            first = cluster.servers[0]
            clickhouse_query(first, "CREATE TABLE t AS t_local "
                                    f"ENGINE = Distributed({cluster.name}, default, t_local, a)")
            clickhouse_query(first, "INSERT INTO t SELECT toUInt32(number) "
                                    "FROM system.numbers LIMIT 400",
                             settings={"insert_distributed_sync": 1})
            counts = [int(clickhouse_query(server, "SELECT count() FROM t_local"))
                      for server in cluster.servers]
            _expect(counts, [100, 200, 100])
    finally:
        with phases("stop"):
            cluster.stop()
    return f"{cluster.name}: 400 rows by a % 4 landed {counts} on weights 1/2/1; {phases}"


def _smoke_replicated(base: Path) -> str:
    phases = Phases()
    with phases("start zookeeper + 4 servers"):
        cluster = start_replicated_cluster(base)
    try:
        with phases("ON CLUSTER create"):
            clickhouse_query(cluster.servers[0], (
                f"CREATE TABLE t ON CLUSTER {cluster.name} (a UInt32) ENGINE = "
                "ReplicatedMergeTree('/clickhouse/tables/{cluster}/{shard}/t', '{replica}') "
                "ORDER BY a"))
        with phases("replicate"):
            clickhouse_query(cluster.server(1, 1), "INSERT INTO t VALUES (1), (2), (3)")
            got = _wait_count(cluster.server(1, 2), "t", 3, timeout=30.0)
            others = [clickhouse_query(cluster.server(2, r), "SELECT count() FROM t").strip()
                      for r in (1, 2)]
            _expect(others, ["0", "0"])
    finally:
        with phases("stop"):
            cluster.stop()
    return (f"{cluster.name}: 3 rows into shard 1 replica 1 seen on replica 2 ({got}), "
            f"shard 2 untouched; {phases}")


def _wait_count(server: Service, table: str, want: int, timeout: float) -> int:
    deadline, got = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        got = int(clickhouse_query(server, f"SELECT count() FROM {table}"))
        if got == want:
            return got
        time.sleep(0.2)
    raise RuntimeError(f"{server.name}: {table} has {got} rows, want {want}, after {timeout}s")


INSTALLERS: dict[str, Callable[[], Path]] = {"zookeeper": install_zookeeper}
INSTALLED: dict[str, Callable[[], bool]] = {
    "zookeeper": ZOOKEEPER_JAR.exists,
    "weighted-cluster": lambda: shutil.which("clickhouse-server") is not None,
    "replicated-cluster": lambda: bool(shutil.which("clickhouse-server"))
    and ZOOKEEPER_JAR.exists(),
}
SMOKES: dict[str, Callable[[Path], str]] = {
    "zookeeper": _smoke_zookeeper, "weighted-cluster": _smoke_weighted,
    "replicated-cluster": _smoke_replicated}
