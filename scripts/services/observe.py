"""Prometheus, for the test that scrapes a load's `--metrics-port` as a real server would.

Debian's `prometheus` package (installed with its service kept from starting: see
services.apt_install); the test starts its own server on 127.0.0.1, a free port, its
config and data under a temp dir, stopped by PID like every other service here.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from services import (
    HOST,
    Service,
    _answers,
    apt_install,
    free_ports,
    http_call,
    owns_listener,
    wait_until,
)

PROMETHEUS = Path("/usr/bin/prometheus")


def install_prometheus() -> Path:
    """Debian's Prometheus server (2.x), if missing."""
    if not PROMETHEUS.exists():
        apt_install("prometheus", recommends=False)
    return PROMETHEUS


def _prometheus_ready(service: Service) -> None:
    port = service.ports["http"]
    url = f"{service.url}/-/ready"
    wait_until(service, lambda: owns_listener(service.pid, port) and _answers(url),
               f"GET {url}", timeout=60)


def start_prometheus(base_dir: Path, targets: list[str], interval: float = 1.0,
                     name: str = "prometheus") -> Service:
    """A Prometheus under ``base_dir/name`` scraping ``targets`` (HOST:PORT each) every
    ``interval`` seconds; url is its HTTP API."""
    data = Path(base_dir).resolve() / name
    (data / "tsdb").mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    config = data / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{interval:g}s"},
        "scrape_configs": [{"job_name": "chload", "static_configs": [{"targets": targets}]}],
    }))
    return Service(
        name=name, data_dir=data, ports={"http": port},
        argv=[str(install_prometheus()), f"--config.file={config}",
              f"--storage.tsdb.path={data / 'tsdb'}", f"--web.listen-address={HOST}:{port}"],
        url=f"http://{HOST}:{port}", endpoint=f"{HOST}:{port}", ready=_prometheus_ready,
    ).start()


def prometheus_query(service: Service, query: str) -> list[dict]:
    """The result of an instant PromQL query (its `data.result` list)."""
    url = f"{service.url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    answer = json.loads(http_call(url))
    if answer.get("status") != "success":
        raise RuntimeError(f"{service.name}: {query}: {answer}")
    result: list[dict] = answer["data"]["result"]
    return result


def _smoke_prometheus(base: Path) -> str:
    server = start_prometheus(base, [])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = prometheus_query(server, "vector(1)")
            if got:
                return f"{server.url}: vector(1) answered {got[0]['value'][1]}"
            time.sleep(0.5)
        raise RuntimeError(f"{server.name}: no answer to vector(1)")
    finally:
        server.stop()


INSTALLERS: dict[str, Callable[[], Path]] = {"prometheus": install_prometheus}
INSTALLED: dict[str, Callable[[], bool]] = {"prometheus": PROMETHEUS.exists}
SMOKES: dict[str, Callable[[Path], str]] = {"prometheus": _smoke_prometheus}
