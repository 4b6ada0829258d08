"""Kafka into ClickHouse: chload's Kafka load against the same rows from a file, against
the 18.16 Kafka table engine, against a hand-written consumer posting batches over HTTP,
and the bare cost of the two readers.

    python3 bench/kafka.py [--rows 2000000] [--partitions 4] [--repeat 1] [--only a,b]
                           [--kafka-option name=value ...]

Starts its own Kafka broker and ClickHouse 18.16 server (scripts/services), produces
`--rows` small JSON messages (zstd) over `--partitions` partitions once, and writes the
same rows as one JSON-lines file. Each figure is from this run; the ratios compare
methods measured in it (docs/kafka.md records them). Prints one JSON object last.

Methods (CPU per million rows: the loading process and its children, plus the
ClickHouse server's and the Kafka broker's own CPU over the same interval):
  bare        confluent-kafka consume(5000) + b"\\n".join, to /dev/null (the Python
              reader's cost)
  bare_native chload's native reader (kafka_spool.c) into spool files, every partition
              at once (the C reader's cost)
  file        chload load of the JSON-lines file into a fresh embedded target (a)
  kafka       chload load kafka://... into a fresh embedded target
  kafka_spool the same with each unit spooled to a file first, then loaded
              (CHLOAD_KAFKA_PIPES=0; with an error budget, always)
  kafka_inferred  the same as kafka without --schema: the columns inferred from a sample
              of the first messages, then streamed
  kafka_audit the same with --audit (each row's _topic, _partition, _offset, _timestamp
              and _key written into its JSON object by the reader, parsed as columns)
  kafka_250k  the same with --batch-rows 250000 (two rounds: the second is read while
              the first loads)
  kafka_python  the same through the Python reader (CHLOAD_KAFKA_READER=python: the
              fallback when no cc or librdkafka is found; the first version's reader)
  server_kafka  chload load kafka://... into the 18.16 server
  server_kafka_spool  the same, spooled (CHLOAD_KAFKA_PIPES=0)
  server_kafka_inferred  the same without --schema (a sample's columns, streamed)
  server_kafka_audit  the same with --audit
  hand_http   a hand-written consumer: consume(5000), join, POST each 100k-message batch
              to the server (INSERT ... FORMAT JSONEachRow), no ledger, no exactly-once (c)
  engine_mv   the server's Kafka table engine + a materialized view into MergeTree (b):
              the group's offsets are set to 0 first (a new group starts at the latest),
              timed from CREATE MATERIALIZED VIEW until count() reaches --rows (polled
              every 0.2 s; at most --engine-timeout s, then the rate of what arrived)
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "services"))
sys.path.insert(0, str(ROOT))

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


def bare(bootstrap: str, topic: str, partitions: int) -> None:
    for _ in consume_batches(bootstrap, topic, partitions, f"bare-{time.time_ns()}"):
        pass


def bare_native(bootstrap: str, topic: str, partitions: int, work: Path,
                options: tuple[tuple[str, str], ...] = ()) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from chload.sources.kafka import native as kafka_native
    from chload.sources.kafka.read import client_config

    lib, why = kafka_native.load()
    if lib is None:
        raise RuntimeError(f"no native reader: {why}")
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    ends = [probe.get_watermark_offsets(TopicPartition(topic, p))[1] for p in range(partitions)]
    probe.close()
    reader = kafka_native.NativeReader(lib, {**client_config(bootstrap, options, native=True),
                                                "group.id": "n"})
    fds = [os.open(work / f"native-{p}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
           for p in range(partitions)]
    try:
        reader.read([(topic, p, 0, ends[p] - 1, fds[p], 0) for p in range(partitions)])
    finally:
        for fd in fds:
            os.close(fd)
        reader.close()
        for p in range(partitions):
            os.remove(work / f"native-{p}")


def hand_http(bootstrap: str, topic: str, partitions: int, server: services.Service,
              table: str) -> None:
    services.clickhouse_query(server, f"CREATE TABLE {table} ({SCHEMA}) ENGINE = MergeTree "
                                      "ORDER BY id")
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


def _post(server: services.Service, table: str, body: bytes) -> None:
    query = urllib.request.quote(f"INSERT INTO {table} FORMAT JSONEachRow")
    request = urllib.request.Request(f"{server.url}/?query={query}", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=300) as answer:
        answer.read()


def engine_setup(bootstrap: str, topic: str, partitions: int, server: services.Service,
                 name: str) -> None:
    """The Kafka engine table and the MergeTree table, no view yet (nothing consumed);
    the group's offsets at 0, so it reads the topic from the start."""
    from confluent_kafka import Consumer, TopicPartition

    group = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{name}-group",
                      "enable.auto.commit": False})
    group.commit(offsets=[TopicPartition(topic, p, 0) for p in range(partitions)],
                 asynchronous=False)
    group.close()
    services.clickhouse_query(server, f"CREATE TABLE {name} ({SCHEMA}) ENGINE = MergeTree "
                                      "ORDER BY id")
    services.clickhouse_query(server, f"CREATE TABLE {name}_queue ({SCHEMA}) ENGINE = Kafka("
                                      f"'{bootstrap}', '{topic}', '{name}-group', "
                                      f"'JSONEachRow')")


def engine_mv(server: services.Service, name: str, rows: int, timeout: float) -> int:
    """Start the view; wait until every row is in the MergeTree table (or timeout)."""
    services.clickhouse_query(server, f"CREATE MATERIALIZED VIEW {name}_mv TO {name} AS "
                                      f"SELECT * FROM {name}_queue")
    deadline, arrived = time.monotonic() + timeout, 0
    while arrived < rows and time.monotonic() < deadline:
        time.sleep(0.2)
        arrived = count(server, name)
    services.clickhouse_query(server, f"DROP TABLE {name}_mv")
    services.clickhouse_query(server, f"DROP TABLE {name}_queue")
    return arrived


def chload(*args: str, reader: str = "", pipes: bool = True) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if reader:
        env["CHLOAD_KAFKA_READER"] = reader
    if not pipes:
        env["CHLOAD_KAFKA_PIPES"] = "0"
    done = subprocess.run([sys.executable, "-m", "chload", "load", *args, "-q"],
                          capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(done.stderr)


def count(server: services.Service, table: str) -> int:
    return int(services.clickhouse_query(server, f"SELECT count() FROM {table}").strip())


def _cpu_of(pid: int) -> float:
    """A process's user+system CPU seconds so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(run: Any, pids: dict[str, int]) -> tuple[float, dict[str, float], Any]:
    """Wall seconds, CPU seconds per party (this process and its children: 'loader'),
    and what `run` returned."""
    before_t, before = os.times(), {k: _cpu_of(p) for k, p in pids.items()}
    started = time.monotonic()
    value = run()
    seconds = time.monotonic() - started
    after_t = os.times()
    cpu = {k: _cpu_of(p) - before[k] for k, p in pids.items()}
    cpu["loader"] = sum(after_t[:4]) - sum(before_t[:4])
    return seconds, cpu, value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--engine-timeout", type=float, default=300.0)
    parser.add_argument("--only", default="", help="comma-separated methods (default: all)")
    parser.add_argument("--kafka-option", action="append", default=[],
                        help="name=value: a librdkafka setting for chload's Kafka methods")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chload-bench-kafka-"))
    broker = services.start_kafka(work)
    server = services.start_clickhouse_server(work)
    try:
        result = _bench(args, work, broker, server)
        print(json.dumps(result))
    finally:
        broker.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _methods(args: argparse.Namespace, work: Path, bootstrap: str, topic: str,
             server: services.Service, i: int, lines: str) -> dict[str, Any]:
    uri = f"kafka://{bootstrap}/{topic}"
    opts = [a for o in args.kafka_option for a in ("--kafka-option", o)]
    pairs = tuple(tuple(o.split("=", 1)) for o in args.kafka_option)
    return {
        "bare": lambda: bare(bootstrap, topic, args.partitions),
        "bare_native": lambda: bare_native(bootstrap, topic, args.partitions, work, pairs),
        "file": lambda: chload(lines, "--table", "ev", "--target", str(work / f"file{i}"),
                               "--schema", SCHEMA),
        "kafka": lambda: chload(uri, "--table", "ev", "--target", str(work / f"kafka{i}"),
                                "--schema", SCHEMA, *opts),
        "kafka_spool": lambda: chload(uri, "--table", "ev", "--target",
                                      str(work / f"kafkaspool{i}"), "--schema", SCHEMA, *opts,
                                      pipes=False),
        "kafka_inferred": lambda: chload(uri, "--table", "ev", "--target",
                                         str(work / f"kafkainf{i}"), *opts),
        "kafka_audit": lambda: chload(uri, "--table", "ev", "--target",
                                      str(work / f"kafkaaudit{i}"), "--schema", SCHEMA,
                                      "--audit", *opts),
        "kafka_250k": lambda: chload(uri, "--table", "ev", "--target",
                                     str(work / f"kafka250k{i}"), "--schema", SCHEMA,
                                     "--batch-rows", "250000", *opts),
        "kafka_python": lambda: chload(uri, "--table", "ev", "--target",
                                       str(work / f"kafkapy{i}"), "--schema", SCHEMA,
                                       reader="python"),
        "server_kafka": lambda: chload(uri, "--table", f"sk{i}", "--target", server.url,
                                       "--schema", SCHEMA, *opts),
        "server_kafka_spool": lambda: chload(uri, "--table", f"sks{i}", "--target",
                                             server.url, "--schema", SCHEMA, *opts,
                                             pipes=False),
        "server_kafka_inferred": lambda: chload(uri, "--table", f"ski{i}", "--target",
                                                server.url, *opts),
        "server_kafka_audit": lambda: chload(uri, "--table", f"ska{i}", "--target", server.url,
                                             "--schema", SCHEMA, "--audit", *opts),
        "hand_http": lambda: hand_http(bootstrap, topic, args.partitions, server, f"hh{i}"),
        "engine_mv": lambda: engine_mv(server, f"em{i}", args.rows, args.engine_timeout),
    }


def _bench(args: argparse.Namespace, work: Path, broker: services.Service,
           server: services.Service) -> dict[str, Any]:
    bootstrap, topic = broker.extra["bootstrap"], "events"
    services.kafka_create_topic(broker, topic, args.partitions)
    lines = str(work / "events.jsonl")
    produced = produce(bootstrap, topic, args.rows, args.partitions, lines)
    only = set(filter(None, args.only.split(",")))
    pids = {"server": server.pid, "broker": broker.pid}
    seconds: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    arrived: dict[str, int] = {}
    for i in range(args.repeat):
        for name, run in _methods(args, work, bootstrap, topic, server, i, lines).items():
            if only and name not in only:
                continue
            if name == "engine_mv":
                engine_setup(bootstrap, topic, args.partitions, server, f"em{i}")
            wall, used, value = measure(run, pids)
            if name == "engine_mv":
                arrived[name] = value
            seconds.setdefault(name, []).append(wall)
            cpu.setdefault(name, []).append(sum(used.values()))
        for name, table in (("server_kafka", f"sk{i}"), ("hand_http", f"hh{i}"),
                            ("server_kafka_audit", f"ska{i}"), ("server_kafka_spool", f"sks{i}"),
                            ("server_kafka_inferred", f"ski{i}")):
            if name in seconds:
                assert count(server, table) == args.rows, name
    best = {k: min(v) for k, v in seconds.items()}
    rows = {k: arrived.get(k, args.rows) for k in best}
    return {
        "rows": args.rows, "partitions": args.partitions, "produce_s": round(produced, 2),
        "kafka_options": args.kafka_option,
        "load_average": os.getloadavg()[0], "seconds": {k: round(v, 3) for k, v in best.items()},
        "rows_per_s": {k: round(rows[k] / v) for k, v in best.items()},
        "cpu_s_per_million_rows": {k: round(min(v) / rows[k] * 1e6, 3) for k, v in cpu.items()},
        "engine_rows_arrived": arrived.get("engine_mv"),
        "ratios": _ratios(best, rows),
    }


def _ratios(best: dict[str, float], rows: dict[str, int]) -> dict[str, float]:
    """Throughput ratios (rows/s over rows/s) of the pairs the goals name."""
    rate = {k: rows[k] / v for k, v in best.items()}
    pairs = [  # each gives the ratio named '<a>_vs_<b>'
        ("kafka", "file"), ("server_kafka", "file"), ("server_kafka", "hand_http"),
        ("server_kafka", "engine_mv"), ("kafka", "engine_mv"), ("kafka_audit", "kafka"),
        ("kafka", "kafka_spool"), ("kafka_spool", "file"), ("kafka_inferred", "file"),
        ("server_kafka_inferred", "file"), ("server_kafka_inferred", "hand_http"),
        ("server_kafka", "server_kafka_spool"), ("server_kafka_spool", "file"),
        ("kafka_audit", "file"), ("server_kafka_audit", "server_kafka"),
        ("kafka_250k", "file"), ("kafka_python", "file"), ("kafka", "kafka_python"),
        ("bare_native", "bare"), ("bare", "file"), ("bare_native", "file"),
    ]
    return {f"{a}_vs_{b}": round(rate[a] / rate[b], 3) for a, b in pairs
            if a in rate and b in rate}


if __name__ == "__main__":
    main()
