"""--audit on a Kafka load: each row's `_topic`, `_partition`, `_offset`, `_timestamp` and
`_key` against what the producer was told it wrote (delivery reports), with the native
reader and the Python fallback, into the embedded engine and into 18.16."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
import services
from conftest import run_chload
from test_kafka import _load, _report, _uri

# An hour ago, whole seconds; each message i is BASE_MS + 1001 * i. Not a fixed date: the
# broker's retention (7 days) deleted older messages while a test read them.
BASE_MS = (int(time.time()) - 3600) * 1000


def _key(i: int) -> bytes | None:
    """No key, plain keys, and keys a JSON string must escape."""
    return [None, b"k%d" % i, b'q"uote\\%d' % i, b"tab\t\x01%d" % i][i % 4]


def _produce(kafka: services.Service, topic: str, n: int, partitions: int,
             value: Callable[[int], bytes] | None = None) -> dict[int, tuple]:
    """Messages with keys and timestamps (JSON values unless `value` makes them); id ->
    (partition, offset, timestamp ms, key) as the broker acknowledged them."""
    from confluent_kafka import Producer

    value = value or _json_value
    sent: dict[bytes, int] = {}
    acked: dict[int, tuple] = {}

    def done(err, msg) -> None:
        assert err is None, err
        acked[sent[msg.value()]] = (msg.partition(), msg.offset(), msg.timestamp()[1],
                                    msg.key())

    producer = Producer({"bootstrap.servers": kafka.extra["bootstrap"], "linger.ms": 5})
    for i in range(n):
        sent[value(i)] = i
        producer.produce(topic, value(i), key=_key(i), partition=i % partitions,
                         timestamp=BASE_MS + 1001 * i, on_delivery=done)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert len(acked) == n
    return acked


def _json_value(i: int) -> bytes:
    return b'{"id":%d,"name":"u%d"}' % (i, i) if i % 5 else b' { "id" : %d } ' % i


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


def _produce_lines(kafka: services.Service, topic: str, n: int, partitions: int,
                   fmt: str) -> dict[int, tuple]:
    """CSV or TSV lines (a field the format must quote or escape in each, a trailing
    line break in some) with keys and timestamps, as `_produce`."""
    def line(i: int) -> bytes:
        return (b'%d,"a, ""b"" %d",%d.5' % (i, i, i) if fmt == "CSV"
                else b"%d\ta\\tb\\\\ %d\t%d.5" % (i, i, i)) + (b"\n" if i % 3 == 0 else b"")

    return _produce(kafka, topic, n, partitions, line)


@pytest.mark.parametrize(("fmt", "reader"), [("CSV", "native"), ("TSV", "native"),
                                             ("CSV", "python"), ("TSV", "python")])
def test_audit_columns_of_csv_and_tsv_lines(kafka, target_dir, table_name, fmt, reader):
    """Inferred (c1..c3 and the five Kafka columns named by position), then a rerun into
    the table that now exists; each row's columns equal its delivery report."""
    topic = f"k_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, topic, 3)
    acked = _produce_lines(kafka, topic, 1_500, 3, fmt)
    env = {"CHLOAD_KAFKA_READER": "python"} if reader == "python" else None
    done = _load(target_dir, _uri(kafka, topic), table_name, "--audit", "--format", fmt,
                 "--batch-rows", "300", env=env)
    report = _report(done)
    assert report.get("rows_loaded") == 1_500, done.stdout + done.stderr
    assert report["files_failed"] == 0
    again = _produce_lines(kafka, topic, 1_800, 3, fmt)  # ids 0..1799 once more
    done = _load(target_dir, _uri(kafka, topic), table_name, "--audit", "--format", fmt,
                 env=env)
    report = _report(done)
    assert report.get("rows_loaded") == 1_800, done.stdout + done.stderr
    assert report["files_failed"] == 0
    out = run_chload("sql", f"SELECT c1, _topic, _partition, _offset, "
                     f"toUnixTimestamp64Milli(_timestamp), hex(_key), c2 FROM {table_name}",
                     "--target", target_dir, "--format", "TSV")
    assert out.returncode == 0, out.stderr
    rows: dict[int, list] = {}
    for line in out.stdout.splitlines():
        i, t, p, o, when, key, text = line.split("\t")
        rows.setdefault(int(i), []).append((t, int(p), int(o), int(when), bytes.fromhex(key)))
        assert text == (f'a, "b" {i}' if fmt == "CSV" else f"a\\tb\\\\ {i}")
    assert len(rows) == 1_800 and sum(len(v) for v in rows.values()) == 3_300
    for produced in (acked, again):
        assert all(v in rows[i] for i, v in _expected(topic, produced, True).items())


def test_audit_columns_of_tsv_into_a_server(kafka, clickhouse, table_name):
    topic = f"k_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, topic, 2)
    acked = _produce_lines(kafka, topic, 1_000, 2, "TSV")
    report = _report(_load(clickhouse.url, _uri(kafka, topic), table_name, "--audit",
                           "--format", "TSV", "--schema", "id UInt64, name String, v Float64"))
    assert report["rows_loaded"] == 1_000 and report["files_failed"] == 0
    assert _rows(clickhouse.url, table_name, millis=False) == _expected(topic, acked, False)


def test_audit_needs_a_format_it_can_extend(kafka, target_dir, table_name):
    done = _load(target_dir, _uri(kafka, "any"), table_name, "--audit", "--format",
                 "JSONCompactEachRow")
    assert done.returncode != 0 and "--audit with --format JSONCompactEachRow" in done.stderr

