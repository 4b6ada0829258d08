"""Install, start and stop the real services that chload's integration tests load into.

Why this exists: nothing installed by hand survives to a fresh machine or to CI, and
fakes cannot prove the contracts chload makes (exactly once across a server restart, a
real 2-shard cluster, real S3 and HDFS reads). So the project installs and runs the
real things itself, from the package registries it can reach:

- ClickHouse server 18.16 (Debian's clickhouse-server), alone or as a 2-shard cluster;
- MinIO (S3-compatible), built with ``go install``;
- HDFS 3.4.2 (NameNode + DataNode) from Maven Central jars;
- for streams and databases (streams.py): Kafka 4.3.1 (KRaft), PostgreSQL 15, MariaDB 10.11;
- for ClickHouse clusters (clusters.py): ZooKeeper 3.8, a weighted 3-shard cluster and a
  2-shard x 2-replica ReplicatedMergeTree cluster;
- for scraping a load's metrics (observe.py): Prometheus 2 (Debian's prometheus);
- for the az:// source (clouds.py): Azurite, Azure Blob Storage's emulator (npm).

Every service listens on 127.0.0.1 only, on ports picked free at start, keeps all its
state under the ``base_dir`` given to it (a temp folder), and is stopped by PID:
SIGTERM, then SIGKILL after a timeout. As a safety net, what is still running is
stopped at interpreter exit, and processes launched from the main thread get
PR_SET_PDEATHSIG, so they die even when the Python process that started them is
killed -9. (Linux sends that signal when the launching *thread* ends, so a process
launched from another thread, e.g. a restart from a timer thread mid-load, skips it.)

Standard library only (python3.11), so CI can run it before anything is installed;
the exceptions are the client helpers (``minio_create_bucket``: boto3,
``kafka_create_topic``: confluent-kafka), imported lazily: they are declared test
dependencies.

CLI (``all`` is what CI installs; ``streams`` is Kafka, PostgreSQL, MariaDB, ZooKeeper
and, for smoke, the two ZooKeeper-backed ClickHouse clusters)::

    python3 scripts/services/services.py install [clickhouse|minio|hdfs|all]
    python3 scripts/services/services.py install [kafka|postgres|mariadb|zookeeper|streams]
    python3 scripts/services/services.py smoke [clickhouse|minio|hdfs|all]
    python3 scripts/services/services.py smoke [kafka|postgres|mariadb|zookeeper|streams]
    python3 scripts/services/services.py smoke [weighted-cluster|replicated-cluster]
    python3 scripts/services/services.py install|smoke prometheus
    python3 scripts/services/services.py install|smoke azurite
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from xml.etree import ElementTree as ET

HOST = "127.0.0.1"
HDFS_VERSION = "3.4.2"
CLUSTER_NAME = "chload_cluster"
DEFAULT_LOADER_PASSWORD = "loader-secret"
_RUNNING: dict[int, Service] = {}


# --------------------------------------------------------------------------- processes


def _log(message: str) -> None:
    print(f"[services] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where downloaded binaries and jars are kept: ``$CHLOAD_CACHE`` or ~/.cache/chload."""
    root = os.environ.get("CHLOAD_CACHE") or Path.home() / ".cache" / "chload"
    return Path(root)


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1, distinct from each other (all sockets held until chosen)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in socks]


def _die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM the child when its parent dies (prctl 1)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


_PR_SET_KEEPCAPS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE = 8, 47, 2
_CAP_DAC_READ_SEARCH = 2


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _become(uid: int, gid: int, groups: list[int]) -> None:
    """In a child, before exec: switch to ``uid`` keeping one capability, DAC_READ_SEARCH.

    Why: PostgreSQL and MariaDB refuse to run as root, but their data dirs sit under a
    ``base_dir`` that root created 0700 (pytest's and tempfile's temp dirs). The
    capability lets them traverse and read those directories (nothing else is widened:
    writes still need ownership). Ambient, so it survives the exec. Only system calls
    here: the user was looked up in the parent (no imports or NSS after a fork).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    bit = 1 << _CAP_DAC_READ_SEARCH
    data = (_CapData * 2)(_CapData(bit, bit, bit), _CapData(0, 0, 0))
    version_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3
    if libc.capset(ctypes.byref(_CapHeader(version_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, _CAP_DAC_READ_SEARCH, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAP_AMBIENT)")


def _child_setup(user: str | None, die_with_parent: bool) -> Callable[[], None] | None:
    """The preexec_fn for a service process: change user first (a credential change
    clears the parent-death signal), then ask for the parent-death signal."""
    if user is None:
        return _die_with_parent if die_with_parent else None
    entry = pwd.getpwnam(user)
    ids = (entry.pw_uid, entry.pw_gid, os.getgrouplist(user, entry.pw_gid))

    def setup() -> None:
        _become(*ids)
        if die_with_parent:
            _die_with_parent()

    return setup


def run_as(user: str | None, argv: list[str], log: Path, timeout: float = 120.0,
           what: str = "") -> None:
    """Run a one-shot command (initdb, install-db) as ``user``; fail with its log tail."""
    _log("$ " + " ".join(argv) + (f"  (as {user})" if user else ""))
    with open(log, "ab") as out:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, timeout=timeout, check=False,
                              preexec_fn=_child_setup(user, die_with_parent=False))  # noqa: PLW1509
    if done.returncode:
        raise RuntimeError(f"{what or argv[0]} failed (exit {done.returncode}):\n{_tail(log, 30)}")


@dataclass
class Service:
    """A running service: one process (plus ``children``), stopped by PID."""

    name: str
    argv: list[str] = field(repr=False)
    data_dir: Path
    ports: dict[str, int]
    url: str
    endpoint: str
    env: dict[str, str] = field(default_factory=dict)
    credentials: dict[str, str] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)
    children: list[Service] = field(default_factory=list)
    ready: Callable[[Service], None] | None = field(default=None, repr=False)
    user: str | None = None  # run as this user (see _become); None: as ourselves
    stop_signal: int = signal.SIGTERM  # PostgreSQL: SIGINT, its "fast" shutdown
    pid: int = 0
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.name}.out"

    def launch(self) -> Service:
        """Start the process (no readiness wait)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        on_main = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.data_dir, env={**os.environ, **self.env}, start_new_session=True,
                preexec_fn=_child_setup(self.user, die_with_parent=on_main),  # noqa: PLW1509
            )
        self.pid = self._proc.pid
        _RUNNING[self.pid] = self
        return self

    def start(self) -> Service:
        """Launch and wait until ready; on failure stop what was started and raise."""
        self.launch()
        try:
            if self.ready:
                self.ready(self)
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the main process only (a crash, for restart tests)."""
        if self.alive():
            os.kill(self.pid, sig)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop children, then this process: ``stop_signal`` (SIGTERM), SIGKILL after
        ``timeout``, reap."""
        for child in reversed(self.children):
            child.stop(timeout)
        proc, self._proc = self._proc, None
        _RUNNING.pop(self.pid, None)
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, self.stop_signal)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def restart(self, hard: bool = False) -> Service:
        """Stop (SIGKILL if ``hard``) and start again on the same ports and data dir."""
        if hard:
            self.kill()
            if self._proc is not None:
                self._proc.wait()
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 30) -> str:
        return _tail(self.log_path, lines)


def _tail(path: Path, lines: int) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"(no {path})"


@atexit.register
def _stop_all() -> None:
    for service in list(_RUNNING.values()):
        with contextlib.suppress(Exception):
            service.stop(timeout=10)


def wait_until(service: Service, check: Callable[[], bool], what: str,
               timeout: float = 30.0, logs: tuple[Path, ...] = ()) -> None:
    """Poll ``check`` until true; fail fast if the process exits; explain with log tails."""
    deadline, last_error = time.monotonic() + timeout, "none"

    def running() -> bool:
        return service.alive() and all(child.alive() for child in service.children)

    while time.monotonic() < deadline and running():
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last_error = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    state = "exited" if not running() else f"not ready after {timeout:.0f}s"
    paths = (service.log_path, *(child.log_path for child in service.children), *logs)
    tails = "\n".join(f"--- {p}:\n{_tail(p, 30)}" for p in paths)
    raise RuntimeError(f"{service.name} (pid {service.pid}) {state}: {what}\n"
                       f"last error: {last_error}\n{tails}")


def owns_listener(pid: int, port: int) -> bool:
    """True if process ``pid`` itself listens on TCP ``port`` (so a readiness probe that
    answers is ours, not another server already holding the port)."""
    links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port and cols[9] in inodes:
                return True
    return False


def http_call(url: str, data: bytes | None = None, method: str = "GET",
              timeout: float = 10.0) -> bytes:
    request = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body: bytes = response.read()
    return body


def _answers(url: str) -> bool:
    """True when ``url`` answers 2xx (urllib raises on anything else)."""
    http_call(url, timeout=2)
    return True


def _run(argv: list[str], **kwargs: object) -> None:
    _log("$ " + " ".join(argv))
    subprocess.run(argv, check=True, **kwargs)  # type: ignore[call-overload]


@contextlib.contextmanager
def _heartbeat(what: str, every: float = 15.0) -> Iterator[None]:
    """Print elapsed time to stderr while a long install runs."""
    done = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            _log(f"{what}: still running, {time.monotonic() - start:.0f}s")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        _log(f"{what}: done in {time.monotonic() - start:.0f}s")


# --------------------------------------------------------------------------- ClickHouse


_POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


def apt_install(*packages: str, recommends: bool = True) -> None:
    """``apt-get update`` + ``install -y``, with no service started by the packages.

    A Debian package such as mariadb-server starts its system service on install,
    listening on the default port for every later boot of this machine; a
    policy-rc.d that answers 101 ("action forbidden") stops that. One already present
    (Docker images ship one) is left alone.
    """
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    ours = not _POLICY_RC_D.exists()
    if ours:
        _run([*sudo, "sh", "-c", f"printf '#!/bin/sh\\nexit 101\\n' > {_POLICY_RC_D} && "
                                 f"chmod 755 {_POLICY_RC_D}"])
    try:
        with _heartbeat(f"apt-get install {' '.join(packages)}"):
            _run([*sudo, "apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
            extra = [] if recommends else ["--no-install-recommends"]
            _run([*sudo, "apt-get", "install", "-y", "-q", *extra, *packages], env=env,
                 stdout=subprocess.DEVNULL)
    finally:
        if ours:
            _run([*sudo, "rm", "-f", str(_POLICY_RC_D)])


def install_clickhouse() -> Path:
    """Debian's clickhouse-server/-client (18.16); apt-get update only when missing."""
    if not (shutil.which("clickhouse-server") and shutil.which("clickhouse-client")):
        apt_install("clickhouse-server", "clickhouse-client")
    return Path(shutil.which("clickhouse-server") or "/usr/sbin/clickhouse-server")


def install_loadgen() -> Path:
    """stress-ng and fio (Debian's): bench/adaptive.py loads while they take CPU and disk."""
    if not (shutil.which("stress-ng") and shutil.which("fio")):
        apt_install("stress-ng", "fio", recommends=False)
    return Path(shutil.which("stress-ng") or "/usr/bin/stress-ng")


def _xml(tag: str, children: dict[str, object]) -> ET.Element:
    """Build an element from a nested dict: str/int become text, dicts sub-elements,
    lists repeat the tag."""
    element = ET.Element(tag)
    for name, value in children.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                element.append(_xml(name, item))
            else:
                ET.SubElement(element, name).text = str(item)
    return element


def _write_xml(path: Path, root: ET.Element) -> Path:
    ET.indent(root)
    path.write_bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))
    return path


def _users_xml(loader_password: str) -> ET.Element:
    local = {"ip": ["127.0.0.1", "::1"]}
    user = {"networks": local, "profile": "default", "quota": "default"}
    return _xml("yandex", {
        "profiles": {"default": {"max_memory_usage": 10_000_000_000}},
        "users": {"default": {"password": "", **user},
                  "loader": {"password": loader_password, **user}},
        "quotas": {"default": {"interval": {
            "duration": 3600, "queries": 0, "errors": 0, "result_rows": 0,
            "read_rows": 0, "execution_time": 0}}},
    })


def _cluster_xml(tcp_ports: list[int]) -> dict[str, object]:
    shards = [{"replica": {"host": HOST, "port": port}} for port in tcp_ports]
    return {CLUSTER_NAME: {"shard": shards}}


def _server_xml(data: Path, ports: dict[str, int], remote_servers: dict[str, object],
                macros: dict[str, object], extra: dict[str, object]) -> ET.Element:
    config: dict[str, object] = {
        "logger": {"level": "information", "log": data / "log" / "server.log",
                   "errorlog": data / "log" / "error.log", "size": "100M", "count": 3},
        "http_port": ports["http"], "tcp_port": ports["tcp"],
        "interserver_http_port": ports["interserver"], "interserver_http_host": HOST,
        "listen_host": HOST, "max_connections": 1024, "keep_alive_timeout": 3,
        "max_concurrent_queries": 100, "uncompressed_cache_size": 1 << 30,
        "mark_cache_size": 1 << 30, "mlock_executable": "false",
        "path": f"{data}/data/", "tmp_path": f"{data}/tmp/",
        "user_files_path": f"{data}/user_files/",
        "format_schema_path": f"{data}/format_schemas/",
        "users_config": data / "users.xml", "default_profile": "default",
        "default_database": "default", "timezone": "UTC",
    }
    if remote_servers:
        config["remote_servers"] = remote_servers
    if macros:
        config["macros"] = macros
    return _xml("yandex", {**config, **extra})


def _clickhouse_ready(service: Service) -> None:
    url = f"{service.url}/?query=SELECT+1"
    error_log = service.data_dir / "log" / "error.log"
    port = service.ports["http"]
    wait_until(service, lambda: owns_listener(service.pid, port)
               and http_call(url, timeout=2).strip() == b"1",
               f"GET {url}", timeout=30, logs=(error_log,))


def clickhouse_service(  # noqa: PLR0913 - keyword-only knobs for the cluster
        base_dir: Path, name: str = "clickhouse", *,
        loader_password: str = DEFAULT_LOADER_PASSWORD, ports: dict[str, int] | None = None,
        cluster_tcp_ports: list[int] | None = None,
        macros: dict[str, object] | None = None,
        remote_servers: dict[str, object] | None = None,
        extra_config: dict[str, object] | None = None) -> Service:
    """Write the config of one server and return it unstarted (see start_clickhouse_server).

    The cluster: ``cluster_tcp_ports`` (one shard per port, CLUSTER_NAME) or a whole
    ``remote_servers`` section; ``extra_config`` adds top-level sections (zookeeper...).
    """
    data = Path(base_dir).resolve() / name
    if ports is None:
        ports = dict(zip(("http", "tcp", "interserver"), free_ports(3), strict=True))
    for sub in ("log", "data", "tmp", "user_files", "format_schemas"):
        (data / sub).mkdir(parents=True, exist_ok=True)
    _write_xml(data / "users.xml", _users_xml(loader_password))
    if remote_servers is None and cluster_tcp_ports:
        remote_servers = _cluster_xml(cluster_tcp_ports)
    config = _write_xml(data / "config.xml", _server_xml(
        data, ports, remote_servers or {}, macros or {}, extra_config or {}))
    return Service(
        name=name, argv=[str(install_clickhouse()), f"--config-file={config}"],
        data_dir=data, ports=ports, url=f"http://{HOST}:{ports['http']}",
        endpoint=f"{HOST}:{ports['tcp']}", ready=_clickhouse_ready,
        credentials={"user": "loader", "password": loader_password},
    )


def start_clickhouse_server(base_dir: Path, loader_password: str = DEFAULT_LOADER_PASSWORD,
                            name: str = "clickhouse") -> Service:
    """One ClickHouse 18.16 server under ``base_dir/name``; url is HTTP, endpoint native TCP.

    Users: ``default`` (no password) and ``loader`` (``loader_password``).
    ``restart()`` keeps ports and data, for kill-and-resume tests.
    """
    return clickhouse_service(base_dir, name, loader_password=loader_password).start()


@dataclass
class ClickHouseCluster:
    """Servers sharing one ``remote_servers`` cluster named ``name``.

    Each server is a Service (url: HTTP, endpoint: native TCP; stop/restart/kill it
    alone); ``helpers`` (a ZooKeeper the cluster started for itself) stop after them.
    Servers built by clusters.py carry extra['shard'] and extra['replica'] (1-based).
    """

    name: str
    servers: list[Service]
    helpers: list[Service] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def endpoints(self) -> list[str]:
        return [server.endpoint for server in self.servers]

    def server(self, shard: int, replica: int = 1) -> Service:
        """The server of ``shard`` / ``replica`` (both 1-based)."""
        for server in self.servers:
            if server.extra.get("shard") == str(shard) and \
                    server.extra.get("replica", "1") == str(replica):
                return server
        raise KeyError(f"{self.name}: no server for shard {shard} replica {replica}")

    def stop(self, timeout: float = 20.0) -> None:
        for server in reversed(self.servers):
            server.stop(timeout)
        for helper in reversed(self.helpers):
            helper.stop(timeout)


def start_clickhouse_cluster(base_dir: Path, shards: int = 2,
                             loader_password: str = DEFAULT_LOADER_PASSWORD) -> ClickHouseCluster:
    """``shards`` servers (no ZooKeeper): Distributed tables, remote() and cluster() work;
    ON CLUSTER DDL and Replicated* do not. Macros ``shard`` (1..n) and ``replica`` set."""
    all_ports = free_ports(3 * shards)
    port_sets = [dict(zip(("http", "tcp", "interserver"), all_ports[3 * i:3 * i + 3], strict=True))
                 for i in range(shards)]
    tcp_ports = [ports["tcp"] for ports in port_sets]
    cluster = ClickHouseCluster(CLUSTER_NAME, [])
    try:
        for i, ports in enumerate(port_sets, start=1):
            server = clickhouse_service(
                base_dir, f"clickhouse-shard{i}", loader_password=loader_password, ports=ports,
                cluster_tcp_ports=tcp_ports, macros={"shard": i, "replica": f"r{i}"})
            server.extra.update(shard=str(i), replica="1")
            cluster.servers.append(server.launch())
        for server in cluster.servers:
            _clickhouse_ready(server)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def clickhouse_query(service: Service, sql: str, data: bytes | None = None, *,
                     user: str = "default", password: str = "",
                     settings: dict[str, object] | None = None) -> str:
    """Run one statement over HTTP (body ``data`` follows the query, for INSERT);
    ``settings`` go in the URL (18.16 ignores an INSERT ... SELECT's SETTINGS clause)."""
    params = urllib.parse.urlencode({"query": sql, "user": user, "password": password,
                                     **(settings or {})})
    is_select = sql.lstrip().upper().startswith("SELECT")
    method = "GET" if data is None and is_select else "POST"
    try:
        return http_call(f"{service.url}/?{params}", data=data, method=method).decode()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{service.name}: {exc.read().decode(errors='replace')}") from exc


# --------------------------------------------------------------------------- MinIO


def install_minio() -> Path:
    """``go install github.com/minio/minio@latest`` into the cache (about 3 min cold)."""
    gobin = cache_dir() / "bin"
    binary = gobin / "minio"
    if not binary.exists():
        gobin.mkdir(parents=True, exist_ok=True)
        with _heartbeat("go install minio (about 3 min cold)"):
            go = shutil.which("go") or "/usr/local/go/bin/go"
            _run([go, "install", "github.com/minio/minio@latest"],
                 env={**os.environ, "GOBIN": str(gobin)})
    return binary


def _minio_ready(service: Service) -> None:
    url = f"{service.url}/minio/health/live"
    port = service.ports["api"]
    wait_until(service, lambda: owns_listener(service.pid, port) and _answers(url),
               f"GET {url}")


def start_minio(base_dir: Path, root_user: str = "chload",
                root_password: str = "chload-secret", name: str = "minio") -> Service:
    """MinIO under ``base_dir/name``; url is the S3 endpoint, credentials the root keys.
    (MinIO wants a user of 3+ and a password of 8+ characters.)"""
    data = Path(base_dir).resolve() / name
    (data / "data").mkdir(parents=True, exist_ok=True)
    api, console = free_ports(2)
    return Service(
        name=name, data_dir=data, ports={"api": api, "console": console},
        argv=[str(install_minio()), "server", str(data / "data"), "--quiet",
              "--address", f"{HOST}:{api}", "--console-address", f"{HOST}:{console}"],
        env={"MINIO_ROOT_USER": root_user, "MINIO_ROOT_PASSWORD": root_password,
             "MINIO_BROWSER": "off", "MINIO_UPDATE": "off"},
        url=f"http://{HOST}:{api}", endpoint=f"{HOST}:{api}", ready=_minio_ready,
        credentials={"access_key": root_user, "secret_key": root_password},
    ).start()


def minio_client(service: Service) -> object:
    """A boto3 S3 client for ``service`` (boto3 imported here, lazily)."""
    import boto3  # noqa: PLC0415 - a test dependency, not needed by the rest
    from botocore.config import Config  # noqa: PLC0415

    return boto3.client(
        "s3", endpoint_url=service.url, region_name="us-east-1",
        aws_access_key_id=service.credentials["access_key"],
        aws_secret_access_key=service.credentials["secret_key"],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )


def minio_create_bucket(service: Service, bucket: str) -> None:
    """Create ``bucket`` (3+ characters) if missing."""
    client = minio_client(service)
    listing = client.list_buckets()  # type: ignore[attr-defined]
    existing = {b["Name"] for b in listing.get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- HDFS

_HDFS_ARTIFACTS = ("hadoop-hdfs", "hadoop-common", "hadoop-hdfs-client")
_ADD_OPENS = ("java.base/java.lang", "java.base/java.util", "java.base/java.util.concurrent",
              "java.base/java.net", "java.base/java.io", "java.base/java.nio",
              "java.base/sun.nio.ch", "java.base/java.lang.reflect",
              "java.security.jgss/sun.security.krb5")
_LOG4J = """log4j.rootLogger=INFO,console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.out
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n
"""


def _hdfs_home() -> Path:
    return cache_dir() / f"hdfs-{HDFS_VERSION}"


def _hdfs_pom() -> str:
    deps = "".join(f"<dependency><groupId>org.apache.hadoop</groupId><artifactId>{a}</artifactId>"
                   f"<version>{HDFS_VERSION}</version></dependency>" for a in _HDFS_ARTIFACTS)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            "<groupId>chload</groupId><artifactId>hdfs-runtime</artifactId><version>1</version>"
            f"<packaging>pom</packaging><dependencies>{deps}</dependencies></project>\n")


def install_hdfs() -> Path:
    """HDFS jars from Maven Central (mvn copy-dependencies) plus empty webapps/ into the cache."""
    home = _hdfs_home()
    marker = home / "jars" / ".complete"
    if not marker.exists():
        home.mkdir(parents=True, exist_ok=True)
        (home / "pom.xml").write_text(_hdfs_pom())
        with _heartbeat(f"mvn fetch hadoop {HDFS_VERSION} jars"):
            _run(["mvn", "-B", "-q", "-Dstyle.color=never", "dependency:copy-dependencies",
                  "-DoutputDirectory=jars", "-DincludeScope=runtime"], cwd=home)
        marker.touch()
    for app in ("hdfs", "datanode", "secondary"):  # the jars ship no webapps/
        web_xml = home / "res" / "webapps" / app / "WEB-INF" / "web.xml"
        web_xml.parent.mkdir(parents=True, exist_ok=True)
        if not web_xml.exists():
            web_xml.write_text('<web-app version="3.0"/>\n')
    return home


def _site_xml(props: dict[str, object]) -> ET.Element:
    return _xml("configuration", {"property": [{"name": k, "value": v} for k, v in props.items()]})


def _hdfs_conf(data: Path, ports: dict[str, int]) -> Path:
    conf = data / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    _write_xml(conf / "core-site.xml", _site_xml({
        "fs.defaultFS": f"hdfs://{HOST}:{ports['rpc']}", "hadoop.tmp.dir": data / "tmp"}))
    _write_xml(conf / "hdfs-site.xml", _site_xml({
        "dfs.namenode.name.dir": data / "name", "dfs.datanode.data.dir": data / "datanode",
        "dfs.namenode.rpc-address": f"{HOST}:{ports['rpc']}",
        "dfs.namenode.http-address": f"{HOST}:{ports['http']}",
        "dfs.namenode.secondary.http-address": f"{HOST}:0",
        "dfs.datanode.address": f"{HOST}:{ports['datanode']}",
        "dfs.datanode.http.address": f"{HOST}:{ports['datanode_http']}",
        "dfs.datanode.ipc.address": f"{HOST}:{ports['datanode_ipc']}",
        "dfs.datanode.hostname": HOST, "dfs.client.use.datanode.hostname": "true",
        "dfs.datanode.use.datanode.hostname": "true",
        "dfs.namenode.datanode.registration.ip-hostname-check": "false",
        "dfs.replication": 1, "dfs.permissions.enabled": "false",
        "dfs.namenode.safemode.extension": 0, "dfs.namenode.safemode.min.datanodes": 0,
        "dfs.webhdfs.enabled": "true", "dfs.heartbeat.interval": 1,
    }))
    (conf / "log4j.properties").write_text(_LOG4J)
    return conf


def _java(home: Path, conf: Path, main: str, *args: str) -> list[str]:
    classpath = os.pathsep.join([str(conf), str(home / "res"), str(home / "jars" / "*")])
    opens = [f"--add-opens={module}=ALL-UNNAMED" for module in _ADD_OPENS]
    fast_start = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]  # ~30% quicker to ready
    return [shutil.which("java") or "java", "-Xmx512m", *fast_start, *opens,
            f"-Dhadoop.log.dir={conf.parent / 'log'}", f"-Dhadoop.home.dir={home}",
            "-Djava.net.preferIPv4Stack=true", "-cp", classpath, main, *args]


def _webhdfs(service: Service, path: str, op: str, **params: str) -> str:
    query = urllib.parse.urlencode({"op": op, "user.name": "root", **params})
    return f"{service.extra['webhdfs']}{urllib.parse.quote(path)}?{query}"


def hdfs_mkdir(service: Service, hdfs_path: str) -> None:
    """``mkdir -p`` over WebHDFS."""
    body = http_call(_webhdfs(service, hdfs_path, "MKDIRS"), data=b"", method="PUT")
    if not json.loads(body).get("boolean"):
        raise RuntimeError(f"hdfs mkdir {hdfs_path} failed: {body!r}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def hdfs_put(service: Service, local_path: Path | str, hdfs_path: str) -> None:
    """Upload a file (streamed) with WebHDFS's two-step CREATE: the NameNode answers
    307 with the DataNode's address, the body goes there."""
    request = urllib.request.Request(
        _webhdfs(service, hdfs_path, "CREATE", overwrite="true"), data=b"", method="PUT",
        headers={"Content-Type": "application/octet-stream"})
    try:
        urllib.request.build_opener(_NoRedirect).open(request, timeout=30).close()
        raise RuntimeError(f"hdfs put {hdfs_path}: NameNode did not redirect")
    except urllib.error.HTTPError as exc:
        if exc.code != HTTPStatus.TEMPORARY_REDIRECT:
            detail = exc.read().decode(errors="replace")
            raise RuntimeError(f"hdfs put {hdfs_path}: {detail}") from exc
        location = exc.headers["Location"]
    size = os.path.getsize(local_path)
    with open(local_path, "rb") as body:
        upload = urllib.request.Request(location, data=body, method="PUT", headers={
            "Content-Length": str(size), "Content-Type": "application/octet-stream"})
        urllib.request.urlopen(upload, timeout=300).close()


def hdfs_list(service: Service, hdfs_path: str) -> list[str]:
    """Names in a directory, over WebHDFS."""
    body = json.loads(http_call(_webhdfs(service, hdfs_path, "LISTSTATUS")))
    return [status["pathSuffix"] for status in body["FileStatuses"]["FileStatus"]]


def _hdfs_ready(service: Service) -> None:
    """Ready once a real file can be written through the DataNode (not just a mkdir)."""
    def probe() -> bool:
        if not owns_listener(service.pid, service.ports["http"]):
            return False
        with tempfile.NamedTemporaryFile() as tmp:
            tmp.write(b"ok\n")
            tmp.flush()
            hdfs_put(service, tmp.name, "/tmp/.chload-ready")
        return True

    wait_until(service, probe, "a WebHDFS write", timeout=90)


def _format_namenode(home: Path, conf: Path, data: Path) -> None:
    if (data / "name" / "current" / "VERSION").exists():
        return
    argv = _java(home, conf, "org.apache.hadoop.hdfs.server.namenode.NameNode",
                 "-format", "-force", "-nonInteractive")
    with open(data / "format.out", "wb") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False)
        if done.returncode:
            raise RuntimeError(f"HDFS format failed:\n{_tail(data / 'format.out', 30)}")


def start_hdfs(base_dir: Path, name: str = "hdfs") -> Service:
    """NameNode + DataNode under ``base_dir/name``. url is ``hdfs://127.0.0.1:rpc``,
    endpoint the NameNode http address, extra['webhdfs'] the WebHDFS base URL."""
    home = install_hdfs()
    data = Path(base_dir).resolve() / name
    keys = ("rpc", "http", "datanode", "datanode_http", "datanode_ipc")
    ports = dict(zip(keys, free_ports(len(keys)), strict=True))
    conf = _hdfs_conf(data, ports)
    _format_namenode(home, conf, data)
    server = "org.apache.hadoop.hdfs.server"
    datanode = Service(name=f"{name}-datanode", data_dir=data, ports=ports, url="", endpoint="",
                       argv=_java(home, conf, f"{server}.datanode.DataNode"))
    namenode = Service(
        name=name, data_dir=data, ports=ports, url=f"hdfs://{HOST}:{ports['rpc']}",
        endpoint=f"{HOST}:{ports['http']}", children=[datanode], ready=_start_datanode,
        argv=_java(home, conf, f"{server}.namenode.NameNode"),
        extra={"webhdfs": f"http://{HOST}:{ports['http']}/webhdfs/v1"},
    )
    return namenode.start()


def _start_datanode(namenode: Service) -> None:
    for child in namenode.children:
        child.launch()
    _hdfs_ready(namenode)


# --------------------------------------------------------------------------- more services

# Kafka, PostgreSQL, MariaDB live in streams.py; ZooKeeper and the weighted and replicated
# ClickHouse clusters in clusters.py. Both import this module's core, so they are loaded
# on first use of one of their names here (``services.start_kafka``), in any import order.
_ELSEWHERE = {
    "streams": ("install_kafka", "start_kafka", "kafka_create_topic", "kafka_api_versions",
                "install_postgres", "start_postgres", "postgres_sql",
                "install_mariadb", "start_mariadb", "mariadb_sql", "chdb_query"),
    "observe": ("install_prometheus", "start_prometheus", "prometheus_query"),
    "clouds": ("install_azurite", "start_azurite", "azure_client", "azure_create_container"),
    "clusters": ("install_zookeeper", "start_zookeeper", "zookeeper_command",
                 "start_weighted_cluster", "start_replicated_cluster",
                 "WEIGHTED_CLUSTER", "REPLICATED_CLUSTER"),
}


def __getattr__(name: str) -> object:
    import importlib  # noqa: PLC0415

    for module, names in _ELSEWHERE.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'services' has no attribute {name!r}")


# --------------------------------------------------------------------------- CLI

INSTALLERS: dict[str, Callable[[], Path]] = {
    "clickhouse": install_clickhouse, "minio": install_minio, "hdfs": install_hdfs,
    "loadgen": install_loadgen}
# What CI installs and smokes (``all``), and what the stream/cluster issues will need.
GROUPS = {"all": ["clickhouse", "minio", "hdfs", "kafka", "postgres", "mariadb", "zookeeper",
                  "loadgen", "prometheus", "azurite"],
          "streams": ["kafka", "postgres", "mariadb", "zookeeper"]}
SMOKE_GROUPS = {**GROUPS, "streams": [*GROUPS["streams"], "weighted-cluster",
                                      "replicated-cluster"]}


def _registries() -> tuple[dict[str, Callable[[], Path]], dict[str, Callable[[Path], str]],
                           dict[str, Callable[[], bool]]]:
    """Installers, smokes and installed-checks of every service, this module's and the others'."""
    import clouds  # noqa: PLC0415 - they import this module: load them once it is complete
    import clusters  # noqa: PLC0415
    import observe  # noqa: PLC0415
    import streams  # noqa: PLC0415

    installed: dict[str, Callable[[], bool]] = {
        "clickhouse": lambda: shutil.which("clickhouse-server") is not None,
        "minio": lambda: (cache_dir() / "bin" / "minio").exists(),
        "hdfs": lambda: (_hdfs_home() / "jars" / ".complete").exists(),
        "loadgen": lambda: bool(shutil.which("stress-ng") and shutil.which("fio")),
    }
    return ({**INSTALLERS, **streams.INSTALLERS, **clusters.INSTALLERS, **observe.INSTALLERS,
             **clouds.INSTALLERS},
            {**SMOKES, **streams.SMOKES, **clusters.SMOKES, **observe.SMOKES, **clouds.SMOKES},
            {**installed, **streams.INSTALLED, **clusters.INSTALLED, **observe.INSTALLED,
             **clouds.INSTALLED})


def is_installed(service: str) -> bool:
    """True if ``service`` (or, for a cluster smoke, everything it needs) is installed."""
    return _registries()[2][service]()


def _expect(got: object, want: object) -> None:
    if got != want:
        raise RuntimeError(f"expected {want!r}, got {got!r}")


class Phases:
    """Wall time of each step of a smoke, reported as ``start 2.1s, insert 0.3s``."""

    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.times.append((what, time.monotonic() - start))

    def __str__(self) -> str:
        return ", ".join(f"{what} {seconds:.1f}s" for what, seconds in self.times)


def _smoke_clickhouse(base: Path) -> str:
    server = start_clickhouse_server(base)
    try:
        user, password = server.credentials["user"], server.credentials["password"]
        clickhouse_query(server, "CREATE TABLE t (a UInt32, s String) "
                                 "ENGINE = MergeTree ORDER BY a")
        clickhouse_query(server, "INSERT INTO t FORMAT TSV", b"1\tx\n2\ty\n",
                         user=user, password=password)
        got = clickhouse_query(server, "SELECT sum(a), count() FROM t",
                               user=user, password=password).strip()
        _expect(got, "3\t2")
        version = clickhouse_query(server, "SELECT version()").strip()
        return f"server {version} at {server.url}, inserted 2 rows as 'loader', read back {got!r}"
    finally:
        server.stop()


def _smoke_minio(base: Path) -> str:
    server = start_minio(base)
    try:
        minio_create_bucket(server, "smoke")
        client = minio_client(server)
        client.put_object(  # type: ignore[attr-defined]
            Bucket="smoke", Key="a/b.csv", Body=b"1,2\n")
        listing = client.list_objects_v2(Bucket="smoke")  # type: ignore[attr-defined]
        keys = [o["Key"] for o in listing["Contents"]]
        _expect(keys, ["a/b.csv"])
        return f"{server.url}: bucket created, object put, listed {keys}"
    finally:
        server.stop()


def _smoke_hdfs(base: Path) -> str:
    server = start_hdfs(base)
    try:
        hdfs_mkdir(server, "/smoke")
        local = base / "smoke.csv"
        local.write_text("1,2\n")
        hdfs_put(server, local, "/smoke/data.csv")
        names = hdfs_list(server, "/smoke")
        _expect(names, ["data.csv"])
        return f"{server.url}: put /smoke/data.csv, listed {names}"
    finally:
        server.stop()


def _smoke_loadgen(base: Path) -> str:
    """A second of CPU stress and a small fio write: both run and exit 0."""
    subprocess.run(["stress-ng", "--cpu", "1", "--timeout", "1s", "--quiet"], check=True,
                   capture_output=True, timeout=30)
    subprocess.run(["fio", "--name=smoke", f"--directory={base}", "--size=4m", "--bs=1m",
                    "--rw=write", "--direct=0"], check=True, capture_output=True, timeout=60)
    return "stress-ng and fio ran"


SMOKES: dict[str, Callable[[Path], str]] = {
    "clickhouse": _smoke_clickhouse, "minio": _smoke_minio, "hdfs": _smoke_hdfs,
    "loadgen": _smoke_loadgen}


def _smoke(names: list[str]) -> int:
    _installers, smokes, installed = _registries()
    failures = 0
    for name in names:
        if not installed[name]():
            print(f"{name:<18} SKIP  not installed (run: install {name})", flush=True)
            continue
        start = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix=f"chload-smoke-{name}-") as base:
                detail = smokes[name](Path(base))
            print(f"{name:<18} OK    {time.monotonic() - start:5.1f}s  {detail}", flush=True)
        except Exception as exc:  # noqa: BLE001 - report every service, then fail
            failures += 1
            print(f"{name:<18} FAIL  {time.monotonic() - start:5.1f}s  {exc}", flush=True)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("install", "smoke"):
        usage = (__doc__ or "").partition("CLI (")[2]
        print("usage (" + usage.strip("\n") if usage else "usage: install|smoke SERVICE",
              file=sys.stderr)
        return 2
    installers, smokes, _installed = _registries()
    command, choice = args[0], args[1] if len(args) > 1 else "all"
    singles, groups = (installers, GROUPS) if command == "install" else (smokes, SMOKE_GROUPS)
    if choice not in (*singles, *groups):
        print(f"unknown service {choice!r}: choose {', '.join([*singles, *groups])}",
              file=sys.stderr)
        return 2
    names = groups.get(choice, [choice])
    if command == "smoke":
        return _smoke(names)
    for name in names:
        start = time.monotonic()
        path = installers[name]()
        print(f"{name:<11} installed  {time.monotonic() - start:6.1f}s  {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.modules.setdefault("services", sys.modules[__name__])  # streams.py imports us by name
    sys.exit(main())
