"""Pipelines files end to end (docs/pipelines.md): `chload run` of one file declaring a
load of files, of a Kafka topic and of a PostgreSQL table, against the real services,
once and then all at once with the topic followed; `--check` says what each would do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import services
from conftest import DATABASE_PASSWORD, ROOT, run_chload

pytestmark = pytest.mark.integration

PIPELINES = """\
# three loads into one embedded target
[defaults]
target = "{target}"

[loads.trips]
source = "${{DATA}}/*.csv"
table = "trips"

[loads.events]
source = "kafka://{bootstrap}/{topic}"
table = "events"
schema = "id UInt64"
batch_seconds = 0.5

[loads.orders]
source = "postgresql://loader:${{PG_PASSWORD}}@{endpoint}/shop/public.{orders}"
table = "orders"
"""


def _produce(kafka: services.Service, topic: str, ids: range) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.extra["bootstrap"], "linger.ms": 5})
    for i in ids:
        producer.produce(topic, b'{"id":%d}' % i, partition=i % 2)
    assert producer.flush(30) == 0


@pytest.fixture
def pipelines(kafka: services.Service, postgres: services.Service, tmp_path: Path,
              target_dir: str) -> tuple[Path, str, dict[str, str]]:
    """The file, its topic, and the environment its ${VAR}s come from."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        (data / f"part_{i}.csv").write_text("id,miles\n" + "".join(
            f"{i * 100 + n},{n}\n" for n in range(100)))
    topic = f"k_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, topic, 2)
    _produce(kafka, topic, range(1_000))
    orders = f"o_{uuid.uuid4().hex[:10]}"
    services.postgres_sql(postgres, f"CREATE TABLE {orders} (id bigint PRIMARY KEY, "
                                    f"price numeric(10,2)); INSERT INTO {orders} SELECT g, "
                                    "g / 100.0 FROM generate_series(1, 500) g")
    path = tmp_path / "chload.toml"
    path.write_text(PIPELINES.format(target=target_dir, bootstrap=kafka.extra["bootstrap"],
                                     topic=topic, endpoint=postgres.endpoint, orders=orders))
    env = {"DATA": str(data), "PG_PASSWORD": DATABASE_PASSWORD}
    return path, topic, env


def _counts(target: str) -> list[str]:
    out = run_chload("sql", "SELECT (SELECT count() FROM trips), (SELECT count() FROM events), "
                     "(SELECT count() FROM orders)", "--target", target, "--format", "TSV")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def _no_password_in(directory: str) -> None:
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                assert DATABASE_PASSWORD.encode() not in f.read(), path


def test_a_pipelines_file_runs_files_kafka_and_postgresql_loads(
        pipelines: tuple[Path, str, dict[str, str]], target_dir: str) -> None:
    path, topic, env = pipelines
    check = run_chload("run", "--check", str(path), env=env)
    assert check.returncode == 0, check.stderr
    lines = check.stdout.splitlines()
    assert lines[0] == f"{path}: 3 loads, one after another; nothing loaded"
    assert lines[1] == f"  trips: local ${{DATA}}/*.csv -> trips in {target_dir}: once"
    assert lines[2].startswith("  events: kafka kafka://") and lines[2].endswith(": once")
    assert lines[3].startswith("  orders: postgres postgresql://loader@")
    assert not os.path.exists(target_dir)  # nothing loaded, nothing made

    done = run_chload("run", str(path), "--json", env=env)
    assert done.returncode == 0, done.stderr
    reports = {r["load"]: r["report"] for r in json.loads(done.stdout)}
    assert {name: r["rows_loaded"] for name, r in reports.items()} == {
        "trips": 300, "events": 1_000, "orders": 500}
    assert _counts(target_dir) == ["300", "1000", "500"]
    again = run_chload("run", str(path), env=env)
    assert again.returncode == 0, again.stderr
    assert [line.split(":")[0] for line in again.stdout.splitlines()
            if not line.startswith(" ")] == ["trips", "events", "orders"]
    assert _counts(target_dir) == ["300", "1000", "500"]
    for out in (check, done, again):
        assert DATABASE_PASSWORD not in out.stdout + out.stderr
    _no_password_in(target_dir)


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


def _loaded(text: str, table: str) -> int:
    for line in text.splitlines():
        if line.startswith("chload_rows_loaded_total{") and f'table="{table}"' in line:
            return int(line.rsplit(" ", 1)[1])
    return 0


def test_run_follow_runs_the_loads_at_once_sharing_the_embedded_target(
        pipelines: tuple[Path, str, dict[str, str]], kafka: services.Service,
        target_dir: str) -> None:
    """With --follow the topic is followed while the files and the table load once,
    all into the one embedded target; SIGTERM ends the run, exit 0."""
    path, topic, env = pipelines
    (port,) = services.free_ports(1)
    check = run_chload("run", "--check", "--follow", str(path), env=env)
    assert check.stdout.splitlines()[0].endswith("3 loads, at once (one follows); nothing loaded")
    assert "events: kafka" in check.stdout and ": follows until SIGINT/SIGTERM" in check.stdout
    runner = subprocess.Popen(
        [sys.executable, "-m", "chload", "run", str(path), "--follow", "--metrics-port",
         str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 120
        while _loaded(text := _scrape(port), "events") < 1_000 or \
                _loaded(text, "trips") < 300 or _loaded(text, "orders") < 500:
            assert runner.poll() is None, runner.communicate()
            assert time.monotonic() < deadline, text
            time.sleep(0.3)
        _produce(kafka, topic, range(1_000, 1_500))
        while _loaded(_scrape(port), "events") < 1_500:
            assert runner.poll() is None, runner.communicate()
            assert time.monotonic() < deadline, "the messages added were not loaded"
            time.sleep(0.3)
        runner.send_signal(signal.SIGTERM)
        out, err = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 0, err
    assert DATABASE_PASSWORD not in out + err
    assert _counts(target_dir) == ["300", "1500", "500"]
