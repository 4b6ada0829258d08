"""Kafka inputs a new user meets on day one (docs/kafka.md "Untidy inputs"), against a
real broker into the embedded target: a wrong address or topic is one line, soon; odd
messages (tombstones, empty ones, several rows or a trailing newline in one, other keys,
compressed batches, empty partitions) load each row once."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import services
from conftest import run_chload

pytestmark = pytest.mark.integration


def _load(target: str, uri: str, table: str, timeout: float = 120):  # noqa: ANN202
    return run_chload("load", uri, "--table", table, "--target", target, "--json",
                      timeout=timeout)


def _one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert "%3|" not in stderr and "KafkaError{" not in stderr, stderr  # librdkafka's own
    return stderr


def test_missing_topic_is_one_line(kafka: services.Service, target_dir: str,
                                   table_name: str) -> None:
    bootstrap = kafka.extra["bootstrap"]
    done = _load(target_dir, f"kafka://{bootstrap}/no_such_{uuid.uuid4().hex[:6]}", table_name)
    assert done.returncode == 2
    assert "no such topic" in _one_line(done.stderr) and "create it" in done.stderr


def test_wrong_port_is_one_line_soon(target_dir: str, table_name: str) -> None:
    port = services.free_ports(1)[0]  # nothing listens there
    start = time.monotonic()
    done = _load(target_dir, f"kafka://127.0.0.1:{port}/events", table_name, timeout=60)
    took = time.monotonic() - start
    assert done.returncode == 2
    assert "cannot reach the broker" in _one_line(done.stderr), done.stderr
    assert f"127.0.0.1:{port}" in done.stderr
    assert took < 12, took  # librdkafka alone retries its 15 s twice (30 s) before


def test_untidy_messages_load_each_row_once(kafka: services.Service, target_dir: str,
                                            table_name: str) -> None:
    """Three partitions, one left empty; gzip batches; null values and empty messages
    (no row); a trailing newline and a CRLF (one row); two rows in one message; rows
    with other keys (missing ones NULL)."""
    from confluent_kafka import Producer

    topic = f"u_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, topic, 3)
    producer = Producer({"bootstrap.servers": kafka.extra["bootstrap"],
                         "compression.type": "gzip"})
    values = [b'{"id":1,"a":"x"}', None, b"", b'{"id":2}\n', b'{"id":3}\r\n',
              b'{"id":4,"b":7}\n{"id":5,"a":"y"}', b'{"id":6}']
    for i, value in enumerate(values):
        producer.produce(topic, value, key=b"k%d" % i, partition=i % 2,
                         headers=[("h", b"v")])
    assert producer.flush(30) == 0
    done = _load(target_dir, f"kafka://{kafka.extra['bootstrap']}/{topic}", table_name)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows_loaded"] == 6
    out = run_chload("sql", f"SELECT count(), uniqExact(id), countIf(b = 7), "
                     f"countIf(a IS NULL) FROM {table_name}", "--target", target_dir,
                     "--format", "TSV")
    assert out.stdout.split() == ["6", "6", "1", "4"], out.stderr
