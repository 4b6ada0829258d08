"""The services the suite starts (conftest's session fixtures) listen on loopback only.

Why: scripts/services starts real servers on a shared machine, on 127.0.0.1 (and ::1
where a server adds it); one that also bound 0.0.0.0 (ZooKeeper's admin server, a JVM's
JMX port, a DataNode's defaults) would open a loader account to the network. The rest of
what these services promise (they answer through the real clients, a restarted
ClickHouse keeps its data, the clusters shard and replicate) is what the source and
target tests stand on.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from pathlib import Path

import pytest
import services

pytestmark = pytest.mark.integration


def _listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets process ``pid`` listens on."""
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # closed since the listing: not a listener
            links.append(os.readlink(fd))
    inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                address, port = cols[1].split(":")
                # the kernel prints each 32-bit word of the address in host (little) order
                raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1]
                               for i in range(0, len(address), 8))
                found.add((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or ip).is_loopback


def _processes(started: services.Service | services.ClickHouseCluster,
               ) -> list[services.Service]:
    if isinstance(started, services.ClickHouseCluster):
        return [p for s in [*started.servers, *started.helpers] for p in _processes(s)]
    return [started, *(p for child in started.children for p in _processes(child))]


@pytest.mark.parametrize("fixture", ["clickhouse", "minio", "hdfs", "kafka", "postgres",
                                     "mariadb", "weighted_cluster", "replicated_cluster",
                                     "azurite"])
def test_every_service_listens_on_loopback_only(request: pytest.FixtureRequest,
                                                fixture: str) -> None:
    for service in _processes(request.getfixturevalue(fixture)):
        addresses = _listening_addresses(service.pid)
        assert addresses, f"{service.name} listens on nothing"
        assert all(_loopback(a) for a, _ in addresses), (service.name, addresses)
