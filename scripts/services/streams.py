"""Kafka, PostgreSQL and MariaDB for the stream and database sources (issues 15 and 16).

Why real servers: chload's promise for a stream or a table read is "exactly once",
across a broker restart or a killed loader; only the real broker and the real databases
(read by chDB's ``postgresql()`` / ``mysql()``) show what happens then. The same rules
as services.py: 127.0.0.1 only, free ports, state under ``base_dir``, stop by PID.

- Kafka 4.3.1 in KRaft mode (no ZooKeeper), jars from Maven Central into the cache;
- PostgreSQL 15, Debian's, already on the machine (``install postgres`` only checks);
- MariaDB 10.11, Debian's ``mariadb-server``.

PostgreSQL and MariaDB run as their own system users (they refuse root); see
``services._become`` for how they reach a data dir under root's 0700 temp dirs.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from services import (
    DEFAULT_LOADER_PASSWORD,
    HOST,
    Phases,
    Service,
    _expect,
    _heartbeat,
    _run,
    apt_install,
    cache_dir,
    free_ports,
    owns_listener,
    run_as,
    wait_until,
)

KAFKA_VERSION = "4.3.1"
LOG4J_VERSION = "2.25.4"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
WAL2JSON = Path("/usr/lib/postgresql/15/lib/wal2json.so")
DATABASE = "shop"


# --------------------------------------------------------------------------- Kafka


def _kafka_home() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}"


def _kafka_pom() -> str:
    deps = "".join(
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version></dependency>"
        for group, artifact, version in (
            ("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
            ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION)))
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            "<groupId>chload</groupId><artifactId>kafka-runtime</artifactId><version>1</version>"
            f"<packaging>pom</packaging><dependencies>{deps}</dependencies></project>\n")


def install_kafka() -> Path:
    """Kafka's jars from Maven Central (mvn copy-dependencies) into the cache."""
    home = _kafka_home()
    marker = home / "jars" / ".complete"
    if not marker.exists():
        home.mkdir(parents=True, exist_ok=True)
        (home / "pom.xml").write_text(_kafka_pom())
        with _heartbeat(f"mvn fetch kafka {KAFKA_VERSION} jars"):
            _run(["mvn", "-B", "-q", "-Dstyle.color=never", "dependency:copy-dependencies",
                  "-DoutputDirectory=jars", "-DincludeScope=runtime"], cwd=home)
        marker.touch()
    return home


_KAFKA_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


def _kafka_properties(data: Path, ports: dict[str, int]) -> str:
    broker, controller = ports["broker"], ports["controller"]
    props = {
        "process.roles": "broker,controller", "node.id": 1,
        "controller.quorum.voters": f"1@{HOST}:{controller}",
        "listeners": f"PLAINTEXT://{HOST}:{broker},CONTROLLER://{HOST}:{controller}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{broker}",
        "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": data / "logs", "num.partitions": 1, "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": 1, "offsets.topic.num.partitions": 1,
        "transaction.state.log.replication.factor": 1, "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 1,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "group.initial.rebalance.delay.ms": 0,
        # after a SIGKILL the node re-registers once its old session expires (9 s default)
        "broker.session.timeout.ms": 2000, "broker.heartbeat.interval.ms": 500,
    }
    return "".join(f"{key}={value}\n" for key, value in props.items())


def _kafka_java(home: Path, data: Path, main: str, *args: str) -> list[str]:
    return [shutil.which("java") or "java", "-Xmx512m", "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={data / 'log4j2.properties'}",
            "-cp", str(home / "jars" / "*"), main, *args]


def _kafka_format(home: Path, data: Path) -> None:
    """Format the KRaft log dir once (a restart keeps it)."""
    if (data / "logs" / "meta.properties").exists():
        return
    cluster_id = "-"
    while cluster_id.startswith("-"):  # as Kafka's Uuid.randomUuid(): "-x" reads as a flag
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    argv = _kafka_java(home, data, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                       "-c", str(data / "server.properties"))
    run_as(None, argv, data / "format.out", what="kafka storage format")


def kafka_api_versions(port: int, timeout: float = 2.0) -> bool:
    """True when a Kafka broker on ``port`` answers an ApiVersions (v0) request."""
    client = b"chload"
    body = struct.pack(">hhih", 18, 0, 7, len(client)) + client
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        head = sock.recv(10)
    if len(head) < 10:
        return False
    _size, correlation, error = struct.unpack(">iih", head)
    return correlation == 7 and error == 0


def _kafka_ready(service: Service) -> None:
    port = service.ports["broker"]
    wait_until(service, lambda: owns_listener(service.pid, port) and kafka_api_versions(port),
               f"ApiVersions on {HOST}:{port}", timeout=60,
               logs=(service.data_dir / "log" / "server.log",))


def start_kafka(base_dir: Path, name: str = "kafka") -> Service:
    """One Kafka broker+controller (KRaft) under ``base_dir/name``.

    ``extra['bootstrap']`` (= endpoint) is ``127.0.0.1:port`` for clients; ``restart()``
    (``hard=True``: SIGKILL) keeps ports, cluster id and every topic, for kill tests.
    Topics are not auto-created: see ``kafka_create_topic``.
    """
    home = install_kafka()
    data = Path(base_dir).resolve() / name
    (data / "log").mkdir(parents=True, exist_ok=True)
    ports = dict(zip(("broker", "controller"), free_ports(2), strict=True))
    (data / "server.properties").write_text(_kafka_properties(data, ports))
    (data / "log4j2.properties").write_text(
        _KAFKA_LOG4J2.format(log=data / "log" / "server.log"))
    _kafka_format(home, data)
    bootstrap = f"{HOST}:{ports['broker']}"
    return Service(
        name=name, data_dir=data, ports=ports, url=f"kafka://{bootstrap}", endpoint=bootstrap,
        argv=_kafka_java(home, data, "kafka.Kafka", str(data / "server.properties")),
        extra={"bootstrap": bootstrap}, ready=_kafka_ready,
    ).start()


def kafka_create_topic(service: Service, topic: str, partitions: int = 1,
                       timeout: float = 30.0) -> None:
    """Create ``topic`` with ``partitions`` partitions (replication 1) and wait until every
    partition has a leader. confluent-kafka is imported here, lazily (a test dependency)."""
    from confluent_kafka.admin import AdminClient, NewTopic  # noqa: PLC0415

    admin = AdminClient({"bootstrap.servers": service.extra["bootstrap"]})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=timeout)
    futures[topic].result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta and not meta.error and len(meta.partitions) == partitions and all(
                p.leader >= 0 for p in meta.partitions.values()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"kafka topic {topic}: {partitions} partitions not led after {timeout}s")


# --------------------------------------------------------------------------- PostgreSQL


def install_postgres() -> Path:
    """PostgreSQL 15 comes with the machine image; install Debian's if it is missing, and
    Debian's wal2json (the logical decoding plugin change capture reads) with it."""
    if not (PG_BIN / "postgres").exists():
        apt_install("postgresql-15")
    if not WAL2JSON.exists():
        apt_install("postgresql-15-wal2json")
    return PG_BIN / "postgres"


def _postgres_ready(service: Service) -> None:
    port = service.ports["pg"]
    probe = [str(PG_BIN / "pg_isready"), "-q", "-h", HOST, "-p", str(port), "-t", "2"]
    wait_until(service, lambda: owns_listener(service.pid, port)
               and subprocess.run(probe, check=False).returncode == 0,
               f"pg_isready on {HOST}:{port}", timeout=30)


def postgres_sql(service: Service, sql: str, *, admin: bool = False) -> str:
    """Run ``sql`` with psql over TCP (the server has no Unix socket): as ``loader`` in
    ``shop``, or (``admin``) as the superuser in ``postgres``. Rows come back as
    ``a|b`` lines."""
    user, database, password = (
        ("postgres", "postgres", service.credentials["admin_password"]) if admin else
        (service.credentials["user"], DATABASE, service.credentials["password"]))
    argv = [str(PG_BIN / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
            "-h", HOST, "-p", str(service.ports["pg"]), "-U", user, "-d", database, "-c", sql]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60,
                          env={**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"})
    if done.returncode:
        raise RuntimeError(f"{service.name}: psql as {user} failed: {done.stderr.strip()}")
    return done.stdout


def start_postgres(base_dir: Path, password: str = DEFAULT_LOADER_PASSWORD,
                   name: str = "postgres") -> Service:
    """PostgreSQL 15 under ``base_dir/name`` (run as user postgres), TCP on 127.0.0.1 only.

    Role ``loader`` (``password``) owns database ``shop``; the superuser ``postgres`` has a
    random password (credentials['admin_password']). Auth is scram-sha-256 everywhere;
    there is no Unix socket. endpoint is ``127.0.0.1:port``; url a libpq URL for loader.
    """
    install_postgres()
    data = Path(base_dir).resolve() / name
    pgdata = data / "pgdata"
    (data / "log").mkdir(parents=True, exist_ok=True)
    shutil.chown(data, "postgres", "postgres")
    admin_password = uuid.uuid4().hex
    fresh = not (pgdata / "PG_VERSION").exists()
    if fresh:
        _initdb(data, pgdata, admin_password)
    else:
        admin_password = (data / "admin_password").read_text().strip()
    port = free_ports(1)[0]
    service = Service(
        name=name, data_dir=data, ports={"pg": port}, user="postgres",
        stop_signal=signal.SIGINT, endpoint=f"{HOST}:{port}",
        url=f"postgresql://loader:{password}@{HOST}:{port}/{DATABASE}",
        argv=[str(PG_BIN / "postgres"), "-D", str(pgdata), "-p", str(port),
              "-c", f"listen_addresses={HOST}", "-c", "unix_socket_directories=",
              # no fsync: a killed server loses nothing (the OS keeps its writes), only
              # a machine crash would; logical WAL for change-data-capture tests
              "-c", "logging_collector=off", "-c", "fsync=off", "-c", "full_page_writes=off",
              "-c", "shared_buffers=64MB", "-c", "max_connections=50",
              "-c", "wal_level=logical", "-c", "max_wal_senders=10",
              "-c", "max_replication_slots=20", "-c", "log_min_messages=warning"],
        credentials={"user": "loader", "password": password, "database": DATABASE,
                     "admin_password": admin_password},
        ready=_postgres_ready,
    ).start()
    if fresh:
        postgres_sql(service, f"CREATE ROLE loader LOGIN REPLICATION PASSWORD '{password}'",
                     admin=True)
        postgres_sql(service, f"CREATE DATABASE {DATABASE} OWNER loader", admin=True)
    return service


def _initdb(data: Path, pgdata: Path, admin_password: str) -> None:
    pwfile = data / "admin_password"
    pwfile.write_text(admin_password + "\n")
    pwfile.chmod(0o600)
    shutil.chown(pwfile, "postgres", "postgres")
    run_as("postgres", [str(PG_BIN / "initdb"), "-D", str(pgdata), "-U", "postgres",
                        f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8",
                        "--locale=C.UTF-8", "--no-sync"],
           data / "log" / "initdb.log", what="initdb")


# --------------------------------------------------------------------------- MariaDB


def install_mariadb() -> Path:
    """Debian's ``mariadb-server`` (10.11); its system service is not started."""
    if not shutil.which("mariadbd"):
        apt_install("mariadb-server")
        _stop_system_mariadb()
    return Path(shutil.which("mariadbd") or "/usr/sbin/mariadbd")


def _stop_system_mariadb() -> None:
    """Belt and braces: if the package started its service anyway, stop it."""
    running = subprocess.run(["pgrep", "-x", "mariadbd"], capture_output=True, text=True,
                             check=False).stdout.split()
    for pid in running:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--no-defaults" not in cmdline:  # ours always pass --no-defaults
            subprocess.run(["service", "mariadb", "stop"], check=False)
            break


def _mysql_greets(port: int) -> bool:
    """True when a MySQL-protocol server on ``port`` answers: its handshake (protocol 10),
    or an error packet (0xFF: "host not allowed" until a user for 127.0.0.1 exists)."""
    with socket.create_connection((HOST, port), timeout=2) as sock:
        head = sock.recv(5)
    return len(head) == 5 and head[4] in (10, 0xFF)


def _mariadb_ready(service: Service) -> None:
    port = service.ports["mysql"]
    wait_until(service, lambda: owns_listener(service.pid, port) and _mysql_greets(port),
               f"MySQL handshake on {HOST}:{port}", timeout=60,
               logs=(service.data_dir / "error.log",))


def _mariadb_socket(data: Path, port: int) -> Path:
    """The Unix socket (for root's setup), in the data dir unless that path is too long
    for a socket address (108 bytes)."""
    path = data / "mariadb.sock"
    return path if len(str(path)) < 100 else Path(f"/tmp/chload-mariadb-{port}.sock")


def mariadb_sql(service: Service, sql: str, *, admin: bool = False) -> str:
    """Run ``sql`` with the mariadb client: as ``loader`` in ``shop`` over TCP, or
    (``admin``) as root over the Unix socket (root logs in by unix_socket only).
    Rows come back tab-separated."""
    if admin:
        where, env = [f"--socket={service.extra['socket']}", "-u", "root"], dict(os.environ)
    else:
        where = ["-h", HOST, "-P", str(service.ports["mysql"]), "-u",
                 service.credentials["user"], DATABASE]
        env = {**os.environ, "MYSQL_PWD": service.credentials["password"]}
    argv = ["mariadb", "--no-defaults", *where, "--batch", "--skip-column-names", "-e", sql]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60, env=env)
    if done.returncode:
        raise RuntimeError(f"{service.name}: mariadb failed: {done.stderr.strip()}")
    return done.stdout


def start_mariadb(base_dir: Path, password: str = DEFAULT_LOADER_PASSWORD,
                  name: str = "mariadb", binlog_format: str | None = "ROW") -> Service:
    """MariaDB 10.11 under ``base_dir/name`` (run as user mysql), TCP on 127.0.0.1 only.

    The binary log is on in ``binlog_format`` (ROW, full row images and column metadata:
    what change capture reads; None: off), and ``loader`` may read it.

    User ``loader``@'%' (``password``) has all rights on database ``shop``; root logs in
    only over the Unix socket (extra['socket'], see mariadb_admin_sql). endpoint is
    ``127.0.0.1:port``.
    """
    install_mariadb()
    data = Path(base_dir).resolve() / name
    datadir = data / "datadir"
    data.mkdir(parents=True, exist_ok=True)
    shutil.chown(data, "mysql", "mysql")
    fresh = not (datadir / "mysql").exists()
    if fresh:
        run_as("mysql", ["mariadb-install-db", "--no-defaults", f"--datadir={datadir}",
                         "--auth-root-authentication-method=socket", "--skip-test-db",
                         "--skip-name-resolve", "--innodb-log-file-size=16M"],
               data / "install-db.log", what="mariadb-install-db")
    port = free_ports(1)[0]
    sock = _mariadb_socket(data, port)
    service = Service(
        name=name, data_dir=data, ports={"mysql": port}, user="mysql",
        endpoint=f"{HOST}:{port}", url=f"mysql://loader:{password}@{HOST}:{port}/{DATABASE}",
        argv=[install_mariadb().as_posix(), "--no-defaults", "--user=mysql",
              f"--datadir={datadir}", f"--port={port}", f"--bind-address={HOST}",
              f"--socket={sock}", f"--pid-file={data / 'mariadb.pid'}",
              f"--log-error={data / 'error.log'}", "--skip-name-resolve",
              *_binlog(data, binlog_format),
              "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M",
              "--innodb-flush-log-at-trx-commit=2", "--max-connections=50"],
        credentials={"user": "loader", "password": password, "database": DATABASE},
        extra={"socket": str(sock)}, ready=_mariadb_ready,
    ).start()
    if fresh:
        mariadb_sql(service, f"CREATE DATABASE IF NOT EXISTS {DATABASE}; "
                                   f"CREATE USER IF NOT EXISTS 'loader'@'%' "
                                   f"IDENTIFIED BY '{password}'; "
                                   f"GRANT ALL ON {DATABASE}.* TO 'loader'@'%'; "
                                   "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* "
                                   "TO 'loader'@'%'", admin=True)
    return service


def _binlog(data: Path, binlog_format: str | None) -> list[str]:
    """The server's binary log settings: off, or on in that format (server id 1)."""
    if binlog_format is None:
        return ["--skip-log-bin"]
    return [f"--log-bin={data / 'binlog'}", f"--binlog-format={binlog_format}",
            "--binlog-row-image=FULL", "--binlog-row-metadata=FULL", "--server-id=1"]



# --------------------------------------------------------------------------- smoke


def chdb_query(sql: str, timeout: float = 120.0) -> str:
    """Run ``sql`` in chDB in a child ``python3 -c`` (one chDB engine per process) -> TSV."""
    code = "import sys, chdb; print(chdb.query(sys.argv[1], 'TSV'), end='')"
    done = subprocess.run([sys.executable, "-c", code, sql], capture_output=True, text=True,
                          check=False, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"chdb: {done.stderr.strip()[-500:]}")
    return done.stdout


def _smoke_kafka(base: Path) -> str:
    from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: PLC0415

    phases = Phases()
    with phases("start"):
        broker = start_kafka(base)
    try:
        with phases("topic"):
            kafka_create_topic(broker, "smoke", partitions=3)
        with phases("produce+consume"):
            producer = Producer({"bootstrap.servers": broker.extra["bootstrap"]})
            producer.produce("smoke", key=b"k", value=b'{"id": 1}')
            _expect(producer.flush(30), 0)
            del producer  # its threads would log the broker's stop
            consumer = Consumer({"bootstrap.servers": broker.extra["bootstrap"],
                                 "group.id": "smoke", "enable.auto.commit": False})
            consumer.assign([TopicPartition("smoke", p, -2) for p in range(3)])  # -2: beginning
            got = _poll_one(consumer, 30.0)
            consumer.close()
            _expect(got, b'{"id": 1}')
    finally:
        with phases("stop"):
            broker.stop()
    return f"{broker.endpoint}: topic of 3 partitions, 1 message produced and read back; {phases}"


def _poll_one(consumer: object, timeout: float) -> bytes | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)  # type: ignore[attr-defined]
        if message is not None and not message.error():
            return message.value()
    return None


def _smoke_postgres(base: Path) -> str:
    phases = Phases()
    with phases("start"):
        server = start_postgres(base)
    try:
        with phases("create+insert+select"):
            postgres_sql(server, "CREATE TABLE t (id int PRIMARY KEY, name text, doc jsonb); "
                                 "INSERT INTO t VALUES (1, 'a', '{\"k\": 1}'), (2, 'b', NULL)")
            _expect(postgres_sql(server, "SELECT count(*), sum(id) FROM t").strip(), "2|3")
        with phases("chdb postgresql()"):
            pw = server.credentials["password"]
            got = chdb_query(f"SELECT count(), sum(id) FROM postgresql("
                             f"'{server.endpoint}', 'shop', 't', 'loader', '{pw}')")
            _expect(got.strip(), "2\t3")
    finally:
        with phases("stop"):
            server.stop()
    return f"{server.endpoint}: 2 rows in shop.t as loader, read back by chDB; {phases}"


def _smoke_mariadb(base: Path) -> str:
    phases = Phases()
    with phases("start"):
        server = start_mariadb(base)
    try:
        with phases("create+insert+select"):
            mariadb_sql(server, "CREATE TABLE t (id INT PRIMARY KEY, name TEXT); "
                                "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
            _expect(mariadb_sql(server, "SELECT count(*), sum(id) FROM t").strip(), "2\t3")
        with phases("chdb mysql()"):
            pw = server.credentials["password"]
            got = chdb_query(f"SELECT count(), sum(id) FROM mysql("
                             f"'{server.endpoint}', 'shop', 't', 'loader', '{pw}')")
            _expect(got.strip(), "2\t3")
    finally:
        with phases("stop"):
            server.stop()
    return f"{server.endpoint}: 2 rows in shop.t as loader, read back by chDB; {phases}"


INSTALLERS: dict[str, Callable[[], Path]] = {
    "kafka": install_kafka, "postgres": install_postgres, "mariadb": install_mariadb}
INSTALLED: dict[str, Callable[[], bool]] = {
    "kafka": lambda: (_kafka_home() / "jars" / ".complete").exists(),
    "postgres": lambda: (PG_BIN / "postgres").exists() and WAL2JSON.exists(),
    "mariadb": lambda: shutil.which("mariadbd") is not None,
}
SMOKES: dict[str, Callable[[Path], str]] = {
    "kafka": _smoke_kafka, "postgres": _smoke_postgres, "mariadb": _smoke_mariadb}
