"""--audit on a Kafka load: each row's `_topic`, `_partition`, `_offset`, `_timestamp` and
`_key` against what the producer was told it wrote (delivery reports), with the native
reader and the Python fallback, into the embedded engine and into 18.16."""

from __future__ import annotations

import json
import uuid

import pytest
import services
from conftest import run_chload
from test_kafka import _load, _report, _uri

BASE_MS = 1_763_960_400_000  # 2025-11-24 05:00:00 UTC; each message i is BASE_MS + 1001 * i


def _key(i: int) -> bytes | None:
    """No key, plain keys, and keys a JSON string must escape."""
    return [None, b"k%d" % i, b'q"uote\\%d' % i, b"tab\t\x01%d" % i][i % 4]


def _produce(kafka: services.Service, topic: str, n: int, partitions: int) -> dict[int, tuple]:
    """Messages with keys and timestamps; id -> (partition, offset, timestamp ms, key)
    as the broker acknowledged them."""
    from confluent_kafka import Producer

    acked: dict[int, tuple] = {}

    def done(err, msg) -> None:
        assert err is None, err
        i = json.loads(msg.value())["id"]
        acked[i] = (msg.partition(), msg.offset(), msg.timestamp()[1], msg.key())

    producer = Producer({"bootstrap.servers": kafka.extra["bootstrap"], "linger.ms": 5})
    for i in range(n):
        value = b'{"id":%d,"name":"u%d"}' % (i, i) if i % 5 else b' { "id" : %d } ' % i
        producer.produce(topic, value, key=_key(i), partition=i % partitions,
                         timestamp=BASE_MS + 1001 * i, on_delivery=done)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert len(acked) == n
    return acked


def _rows(target: str, table: str, millis: bool) -> dict[int, tuple]:
    ts = "toUnixTimestamp64Milli(_timestamp)" if millis else "toUnixTimestamp(_timestamp)"
    out = run_chload("sql", f"SELECT id, _topic, _partition, _offset, {ts}, hex(_key) "
                     f"FROM {table} ORDER BY id", "--target", target, "--format", "TSV")
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        i, topic, partition, offset, when, key = line.split("\t")
        rows[int(i)] = (topic, int(partition), int(offset), int(when), bytes.fromhex(key))
    return rows


def _expected(topic: str, acked: dict[int, tuple], millis: bool) -> dict[int, tuple]:
    return {i: (topic, p, o, ts if millis else ts // 1000, key or b"")
            for i, (p, o, ts, key) in acked.items()}


@pytest.mark.parametrize("reader", ["native", "python"])
def test_audit_columns_are_each_message_s_own(kafka, target_dir, table_name, reader):
    topic = f"k_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, topic, 3)
    acked = _produce(kafka, topic, 3_000, 3)
    env = {"CHLOAD_KAFKA_READER": "python"} if reader == "python" else None
    report = _report(_load(target_dir, _uri(kafka, topic), table_name, "--audit",
                           "--batch-rows", "700", env=env))
    assert report["rows_loaded"] == 3_000 and report["files_failed"] == 0
    assert _rows(target_dir, table_name, millis=True) == _expected(topic, acked, True)
    types = run_chload("sql", f"SELECT name, type FROM system.columns WHERE table = "
                       f"'{table_name}' AND name LIKE '\\_%'", "--target", target_dir,
                       "--format", "TSV").stdout
    assert "_timestamp\tDateTime64(3, \\'UTC\\')" in types and "_source_file" in types


def test_audit_columns_into_a_server_with_a_schema(kafka, clickhouse, table_name):
    topic = f"k_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, topic, 2)
    acked = _produce(kafka, topic, 2_000, 2)
    report = _report(_load(clickhouse.url, _uri(kafka, topic), table_name, "--audit",
                           "--schema", "id UInt64, name String"))
    assert report["rows_loaded"] == 2_000 and report["files_failed"] == 0
    # 18.16 has no DateTime64: _timestamp is DateTime('UTC'), seconds
    assert _rows(clickhouse.url, table_name, millis=False) == _expected(topic, acked, False)


def test_audit_needs_json_objects(kafka, target_dir, table_name):
    done = _load(target_dir, _uri(kafka, "any"), table_name, "--audit", "--format", "CSV")
    assert done.returncode != 0 and "--audit with --format CSV" in done.stderr

