"""Kafka into ClickHouse: chload's Kafka load against the same rows from a file, against
a hand-written consumer posting batches over HTTP, and the bare cost of consuming.

    python3 bench/kafka.py [--rows 2000000] [--partitions 4] [--repeat 1]

Starts its own Kafka broker and ClickHouse 18.16 server (scripts/services), produces
`--rows` small JSON messages (zstd) over `--partitions` partitions once, and writes the
same rows as one JSON-lines file. Each figure is from this run; the ratios compare
methods measured in it (docs/kafka.md records them). Prints one JSON object last.

Methods:
  bare        confluent-kafka consume(5000) + b"\\n".join, to /dev/null (the reader's cost)
  file        chload load of the JSON-lines file into a fresh embedded target
  kafka       chload load kafka://... into a fresh embedded target
  server_kafka  chload load kafka://... into the 18.16 server
  hand_http   a hand-written consumer: consume(5000), join, POST each 100k-message batch
              to the server (INSERT ... FORMAT JSONEachRow), no ledger, no exactly-once
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "services"))

import services  # noqa: E402

SCHEMA = "id UInt64, name String, value Float64"


def produce(bootstrap: str, topic: str, rows: int, partitions: int, path: str) -> float:
    from confluent_kafka import Producer

    started = time.monotonic()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                         "batch.size": 1 << 20, "compression.type": "zstd",
                         "queue.buffering.max.messages": 1_000_000})
    with open(path, "wb") as out:
        for i in range(rows):
            value = b'{"id":%d,"name":"user%d","value":%d.5}' % (i, i % 1000, i)
            out.write(value + b"\n")
            while True:
                try:
                    producer.produce(topic, value, partition=i % partitions)
                    break
                except BufferError:
                    producer.poll(0.05)
    producer.flush(120)
    return time.monotonic() - started


def consume_batches(bootstrap: str, topic: str, partitions: int, group: str):
    """Yield joined blocks of values until every partition's end (as at the start)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "enable.partition.eof": True})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1]
            for p in range(partitions)}
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    left, done = sum(ends.values()), set()
    while left > 0 and len(done) < partitions:
        messages = consumer.consume(5000, 1.0)
        values = [m.value() for m in messages if m.error() is None]
        done.update(m.partition() for m in messages if m.error() is not None)
        left -= len(values)
        if values:
            yield len(values), b"\n".join(values) + b"\n"
    consumer.close()


def bare(bootstrap: str, topic: str, partitions: int) -> float:
    started = time.monotonic()
    for _ in consume_batches(bootstrap, topic, partitions, f"bare-{time.time_ns()}"):
        pass
    return time.monotonic() - started


def hand_http(bootstrap: str, topic: str, partitions: int, server: services.Service,
              table: str) -> float:
    services.clickhouse_query(server, f"CREATE TABLE {table} ({SCHEMA}) ENGINE = MergeTree "
                                      "ORDER BY id")
    started = time.monotonic()
    pending: list[bytes] = []
    count = 0
    for n, block in consume_batches(bootstrap, topic, partitions, f"hand-{table}"):
        pending.append(block)
        count += n
        if count >= 100_000:
            _post(server, table, b"".join(pending))
            pending, count = [], 0
    if pending:
        _post(server, table, b"".join(pending))
    return time.monotonic() - started


def _post(server: services.Service, table: str, body: bytes) -> None:
    query = urllib.request.quote(f"INSERT INTO {table} FORMAT JSONEachRow")
    request = urllib.request.Request(f"{server.url}/?query={query}", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=300) as answer:
        answer.read()


def chload(*args: str) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "chload", "load", *args, "-q"],
                          capture_output=True, text=True, env={**os.environ,
                                                               "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise RuntimeError(done.stderr)
    return time.monotonic() - started


def count(server: services.Service, table: str) -> int:
    return int(services.clickhouse_query(server, f"SELECT count() FROM {table}").strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chload-bench-kafka-"))
    broker = services.start_kafka(work)
    server = services.start_clickhouse_server(work)
    try:
        bootstrap, topic = broker.extra["bootstrap"], "events"
        services.kafka_create_topic(broker, topic, args.partitions)
        lines = str(work / "events.jsonl")
        produced = produce(bootstrap, topic, args.rows, args.partitions, lines)
        uri = f"kafka://{bootstrap}/{topic}"
        figures: dict[str, list[float]] = {}
        for i in range(args.repeat):
            runs = {
                "bare": lambda: bare(bootstrap, topic, args.partitions),
                "file": lambda i=i: chload(lines, "--table", "ev", "--target",
                                       str(work / f"file{i}"), "--schema", SCHEMA),
                "kafka": lambda i=i: chload(uri, "--table", "ev", "--target",
                                        str(work / f"kafka{i}"), "--schema", SCHEMA),
                "server_kafka": lambda i=i: chload(uri, "--table", f"sk{i}", "--target",
                                               server.url, "--schema", SCHEMA),
                "hand_http": lambda i=i: hand_http(bootstrap, topic, args.partitions, server,
                                               f"hh{i}"),
            }
            for name, run in runs.items():
                figures.setdefault(name, []).append(run())
            assert count(server, f"sk{i}") == args.rows and count(server, f"hh{i}") == args.rows
        best = {k: min(v) for k, v in figures.items()}
        result = {
            "rows": args.rows, "partitions": args.partitions, "produce_s": round(produced, 2),
            "seconds": {k: round(v, 3) for k, v in best.items()},
            "rows_per_s": {k: round(args.rows / v) for k, v in best.items()},
            "kafka_vs_file": round(best["file"] / best["kafka"], 3),
            "server_kafka_vs_hand_http": round(best["hand_http"] / best["server_kafka"], 3),
            "bare_vs_file": round(best["file"] / best["bare"], 3),
        }
        print(json.dumps(result))
    finally:
        broker.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
