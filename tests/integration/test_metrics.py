"""A load's metrics (docs/metrics.md): `/metrics` scraped while a load runs, first
directly during a file load, then by a real Prometheus server during a Kafka --follow
load whose producer keeps adding messages."""

from __future__ import annotations

import functools
import http.server
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import services
from conftest import ROOT, run_chload, serving_http
from test_services import _listening_addresses, _loopback

import chload

pytestmark = pytest.mark.integration

SECRET = "pw-Se7ret-metrics"
TOKEN = "tk-Se7ret-metrics"


def scrape(port: int) -> tuple[str, str]:
    """The content type and text of http://127.0.0.1:port/metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read().decode()


def value(text: str, name: str, **labels: str) -> float:
    """The value of the one sample `name` whose labels include `labels`."""
    found = []
    for line in text.splitlines():
        sample = re.fullmatch(r"([a-z_]+)\{(.*)\} (\S+)", line)
        if sample and sample[1] == name:
            have = dict(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', sample[2]))
            if labels.items() <= have.items():
                found.append(float(sample[3]))
    assert len(found) == 1, f"{name} {labels}: {found} in\n{text}"
    return found[0]


@pytest.fixture
def csv_server(tmp_path: Path) -> Iterator[str]:
    """Three CSV files over HTTP; part_2.csv has one row that is not a number."""
    for i in (1, 2, 3):
        rows = [f"{i * 100 + n}" for n in range(10)]
        if i == 2:
            rows[4] = "not-a-number"
        (tmp_path / f"part_{i}.csv").write_text("id\n" + "\n".join(rows) + "\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    with serving_http(functools.partial(Quiet, directory=str(tmp_path))) as url:
        yield url


def test_metrics_are_served_while_a_file_load_runs(csv_server: str, target_dir: str,
                                                   table_name: str) -> None:
    """At the first unit committed, /metrics already counts it, the other units are
    lag, and no label holds the URL's password or token; after the load, nothing
    listens on the port."""
    (port,) = services.free_ports(1)
    host = csv_server.removeprefix("http://")
    source = f"http://loader:{SECRET}@{host}/part_{{1..3}}.csv?token={TOKEN}"
    scraped: list[tuple[str, str]] = []
    done: list[chload.Event] = []

    def at_first_commit(event: chload.Event) -> None:  # and at the last
        if event.kind == "done":
            done.append(event)
            if len(done) in (1, 3):
                scraped.append(scrape(port))

    report = chload.load(source, table=table_name, target=target_dir, workers=1,
                         schema="id UInt32", max_errors=1, metrics_port=port,
                         listener=at_first_commit)
    assert (report.files_loaded, report.rows_loaded, report.rows_rejected) == (3, 29, 1)
    (content_type, text), (_, last) = scraped
    assert content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n") and SECRET not in text and TOKEN not in text
    labels = {"table": table_name, "source": f"http://{host}/part_{{1..3}}.csv"}
    assert value(text, "chload_units_loaded_total", **labels) == 1
    assert value(text, "chload_rows_loaded_total", **labels) in (9, 10)
    assert value(text, "chload_bytes_loaded_total", **labels) > 0
    assert value(text, "chload_unit_commit_seconds_count", **labels) == 1
    assert value(text, "chload_unit_commit_seconds_bucket", le="+Inf", **labels) == 1
    assert value(text, "chload_lag_seconds", **labels) > 0  # two units planned, not loaded
    assert value(text, "chload_units_failed_total", **labels) == 0
    assert "# TYPE chload_unit_commit_seconds histogram" in text
    assert value(last, "chload_units_loaded_total", **labels) == 3
    assert value(last, "chload_rows_loaded_total", **labels) == 29
    assert value(last, "chload_rows_rejected_total", **labels) == 1
    assert value(last, "chload_unit_commit_seconds_count", **labels) == 3
    assert value(last, "chload_unit_commit_seconds_sum", **labels) == pytest.approx(
        sum(e.seconds for e in done))
    assert value(last, "chload_lag_seconds", **labels) == 0  # none waits
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_a_metrics_port_in_use_is_one_line(tmp_path: Path, target_dir: str,
                                           table_name: str) -> None:
    (tmp_path / "a.csv").write_text("id\n1\n")
    with serving_http(http.server.BaseHTTPRequestHandler) as url:
        port = url.rsplit(":", 1)[1]
        out = run_chload("load", str(tmp_path / "a.csv"), "--table", table_name,
                         "--target", target_dir, "--metrics-port", port)
    assert out.returncode == 2
    assert out.stderr == (f"chload: --metrics-port {port}: 127.0.0.1:{port} is in use "
                          "(Address already in use); choose another port\n")


def _produce_for(kafka: services.Service, topic: str, seconds: float,
                 stop: threading.Event) -> None:
    """Messages {"id": i} on two partitions, 100 every 0.1 s, for `seconds` at most."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.extra["bootstrap"], "linger.ms": 5})
    deadline, i = time.monotonic() + seconds, 0
    while time.monotonic() < deadline and not stop.is_set():
        for _ in range(100):
            producer.produce(topic, b'{"id":%d}' % i, partition=i % 2)
            i += 1
        producer.poll(0)
        time.sleep(0.1)
    producer.flush(30)


def _until(what: str, check: Callable[[], object], loader: subprocess.Popen,
           timeout: float = 90) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert loader.poll() is None, loader.communicate()[1]
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_prometheus_scrapes_a_kafka_follow_load(kafka: services.Service, tmp_path: Path,
                                                target_dir: str, table_name: str) -> None:
    """A real Prometheus scraping --metrics-port of a --follow load while a producer
    adds messages: its query API answers a positive rate() of rows loaded, and the
    messages behind each partition."""
    topic = f"k_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, topic, 2)
    (port,) = services.free_ports(1)
    stop = threading.Event()
    producer = threading.Thread(target=_produce_for, args=(kafka, topic, 40, stop))
    producer.start()
    loader = subprocess.Popen(
        [sys.executable, "-m", "chload", "load", f"kafka://{kafka.extra['bootstrap']}/{topic}",
         "--table", table_name, "--target", target_dir, "--quiet", "--follow",
         "--batch-seconds", "0.5", "--schema", "id UInt64", "--metrics-port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prometheus = services.start_prometheus(tmp_path, [f"127.0.0.1:{port}"], interval=1)
    try:
        assert all(_loopback(a) for a, _ in _listening_addresses(prometheus.pid))
        rate = f'rate(chload_rows_loaded_total{{table="{table_name}"}}[5s])'
        got = _until("a positive rate() of rows loaded", lambda: [
            r for r in services.prometheus_query(prometheus, rate)
            if float(r["value"][1]) > 0], loader)
        assert got[0]["metric"]["source"] == f"kafka://{kafka.extra['bootstrap']}/{topic}"  # type: ignore[index]
        behind = services.prometheus_query(
            prometheus, f'chload_kafka_messages_behind{{table="{table_name}"}}')
        assert {r["metric"]["partition"].rsplit("/", 1)[1] for r in behind} == {"0", "1"}
        loader.send_signal(signal.SIGTERM)
        _, err = loader.communicate(timeout=60)
        assert loader.returncode == 0, err
    finally:
        stop.set()
        producer.join(60)
        prometheus.stop()
        if loader.poll() is None:
            loader.kill()
            loader.communicate()
