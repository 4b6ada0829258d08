"""Azurite, Azure Blob Storage's emulator, for the az:// source's tests.

Microsoft's own emulator (the npm package ``azurite``) speaks the Blob REST API that
chload lists and that chDB's azureBlobStorage() reads, with Shared Key signing: the
real protocol, as MinIO is for S3. Installed with npm into the cache (Debian's nodejs
and npm if missing); started on 127.0.0.1 with its data under ``base_dir``, an account
of its own with a fresh key (``AZURITE_ACCOUNTS``: tests look for that key where it
must not be), telemetry off; stopped by PID like every service here.

GCS has no emulator here that speaks its S3-interoperable XML API (fake-gcs-server
speaks the JSON API): gs:// is tested against MinIO, as that API.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from services import (
    HOST,
    Service,
    _expect,
    _heartbeat,
    _run,
    apt_install,
    cache_dir,
    free_ports,
    owns_listener,
    wait_until,
)

AZURITE_VERSION = "3"
ACCOUNT = "chloadaccount"


def _azurite_home() -> Path:
    return cache_dir() / "azurite"


def _azurite_bin() -> Path:
    return _azurite_home() / "node_modules" / ".bin" / "azurite-blob"


def install_azurite() -> Path:
    """``npm install azurite@3`` into the cache (about 45 s cold), nodejs first if missing."""
    if not _azurite_bin().exists():
        if not shutil.which("npm"):
            apt_install("nodejs", "npm", recommends=False)
        home = _azurite_home()
        home.mkdir(parents=True, exist_ok=True)
        with _heartbeat("npm install azurite (about 45 s cold)"):
            _run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(home),
                  f"azurite@{AZURITE_VERSION}"], stdin=subprocess.DEVNULL)
    return _azurite_bin()


def _azurite_ready(service: Service) -> None:
    port = service.ports["blob"]
    wait_until(service, lambda: owns_listener(service.pid, port), f"Azurite on {port}",
               timeout=60)


def start_azurite(base_dir: Path, name: str = "azurite") -> Service:
    """Azurite's blob service under ``base_dir/name``; url is the account's blob endpoint,
    credentials its account name, key and connection string."""
    data = Path(base_dir).resolve() / name
    data.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    key = base64.b64encode(os.urandom(32)).decode()
    endpoint = f"http://{HOST}:{port}/{ACCOUNT}"
    connection = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};"
                  f"BlobEndpoint={endpoint};")
    return Service(
        name=name, data_dir=data, ports={"blob": port},
        argv=[str(install_azurite()), "--blobHost", HOST, "--blobPort", str(port),
              "--location", str(data / "data"), "--silent", "--skipApiVersionCheck",
              "--disableTelemetry", "--loose"],
        env={"AZURITE_ACCOUNTS": f"{ACCOUNT}:{key}"},
        url=endpoint, endpoint=f"{HOST}:{port}", ready=_azurite_ready,
        credentials={"account": ACCOUNT, "key": key, "connection_string": connection},
    ).start()


def azure_client(service: Service) -> object:
    """An azure-storage-blob BlobServiceClient on the Azurite account (a test dependency)."""
    from azure.storage.blob import BlobServiceClient  # noqa: PLC0415

    return BlobServiceClient.from_connection_string(service.credentials["connection_string"])


def azure_create_container(service: Service, container: str) -> object:
    """Create ``container`` (3+ lowercase characters); its ContainerClient."""
    return azure_client(service).create_container(container)  # type: ignore[attr-defined]


def _smoke_azurite(base: Path) -> str:
    server = start_azurite(base)
    try:
        container = azure_create_container(server, "smoke")
        container.upload_blob("a/b.csv", b"1,2\n")  # type: ignore[attr-defined]
        names = [b.name for b in container.list_blobs()]  # type: ignore[attr-defined]
        _expect(names, ["a/b.csv"])
        return f"{server.url}: container created, blob put, listed {names}"
    finally:
        server.stop()


INSTALLERS: dict[str, Callable[[], Path]] = {"azurite": install_azurite}
INSTALLED: dict[str, Callable[[], bool]] = {"azurite": lambda: _azurite_bin().exists()}
SMOKES: dict[str, Callable[[Path], str]] = {"azurite": _smoke_azurite}
