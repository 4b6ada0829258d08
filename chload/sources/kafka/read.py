"""The broker side of a Kafka load: librdkafka's settings, the one client that talks to
Kafka (partitions, watermarks, topic ids), and reading a unit's messages into a spool as
bytes. Apart from source.py, which plans units from the ledger and runs the rounds, so
what depends on confluent-kafka and its message quirks (gaps, nulls, end-of-partition
markers) sits in one place; docs/benchmarks.md measures the reader.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from chload.errors import SourceError, UsageError

CONSUME_BATCH = 5_000  # messages per consume() call (a much larger batch was slower)
READ_TIMEOUT = 30.0  # seconds without a message while a unit's offsets are still due
# --audit: how each row gets its Kafka columns (0: not at all), spool.c's AUDIT_*
AUDIT_JSON, AUDIT_CSV, AUDIT_TSV = 1, 2, 3

# The native reader parses every fetched message, also those past a unit's last offset:
# the Python reader's larger fetch (fewer consume() calls) reads far past a mid-partition
# unit, so the native one keeps librdkafka's default (docs/benchmarks.md). The user's
# --kafka-option still wins.
NATIVE_FETCH = 1 << 20  # max.partition.fetch.bytes of the native reader
# Once a partition's local queue holds queued.min.messages (100k), librdkafka >= 2.3 stops
# fetching it for fetch.queue.backoff.ms, 1 s by default: a reader that drains faster
# than that waits out the backoff again and again. Set for the native reader, which
# drains that fast; the Python reader keeps the default.
FETCH_QUEUE_BACKOFF_MS = "10"
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SECRET_KEYS = ("password", "secret", "key", "token", "jaas")
METADATA_SECONDS = 15.0  # a topic's metadata is asked for this long at most
DOWN_SECONDS = 3.0  # ... or this long once librdkafka says every broker is down
# librdkafka's log (a line per retry while a broker is down), never on stderr: errors
# come by error_cb, and chload's own line says what failed and what to do
LIBRDKAFKA_LOG = logging.getLogger("chload.kafka")
LIBRDKAFKA_LOG.addHandler(logging.NullHandler())
LIBRDKAFKA_LOG.propagate = False


def client_config(bootstrap: str, options: Sequence[tuple[str, str]],
                  consumer: bool = True, native: bool = False) -> dict[str, str]:
    """librdkafka's settings: ours, then the user's --kafka-option (values may name
    environment variables, `${VAR}`, so secrets stay out of shell history and logs)."""
    config = {"bootstrap.servers": bootstrap}
    if consumer:
        config.update({"enable.auto.commit": "false", "enable.partition.eof": "true",
                       "auto.offset.reset": "error", "fetch.max.bytes": str(64 << 20),
                       "max.partition.fetch.bytes": str(NATIVE_FETCH if native else 16 << 20)})
        if native:  # since librdkafka 2.3: "?" = optional (spool.c)
            config["?fetch.queue.backoff.ms"] = FETCH_QUEUE_BACKOFF_MS
    for name, value in options:
        config[name] = _expand(name, value)
    if native and "fetch.queue.backoff.ms" in config:  # the user's wins
        config["?fetch.queue.backoff.ms"] = config.pop("fetch.queue.backoff.ms")
    return config


def _expand(option: str, value: str) -> str:
    return _ENV.sub(lambda m: _env(option, m.group(1)), value)


def _env(option: str, variable: str) -> str:
    if variable not in os.environ:
        raise UsageError(f"--kafka-option {option}: ${{{variable}}} is not set in the "
                         "environment")
    return os.environ[variable]


def safe_options(options: Sequence[tuple[str, str]]) -> str:
    """--kafka-option values as they may be shown: secrets masked."""
    return ", ".join(f"{k}=***" if any(s in k.lower() for s in _SECRET_KEYS) else f"{k}={v}"
                     for k, v in options)


# --------------------------------------------------------------------------- the broker

class Broker:
    """The one place that talks to Kafka (confluent-kafka); its errors become
    SourceError here."""

    def __init__(self, config: dict[str, Any], admin: dict[str, Any], group: str) -> None:
        try:
            from confluent_kafka import Consumer
            from confluent_kafka.admin import AdminClient
        except ImportError as exc:
            raise UsageError("kafka:// needs confluent-kafka: pip install 'chload[kafka]'"
                             ) from exc
        self.config = config
        self._errors: deque[Any] = deque(maxlen=64)  # librdkafka's: its log is kept off stderr
        quiet: dict[str, Any] = {"logger": LIBRDKAFKA_LOG, "error_cb": self._errors.append}
        self.consumer = Consumer({**config, "group.id": group, **quiet})
        admin_config: dict[str, Any] = {**admin, **quiet}
        self.admin = AdminClient(admin_config)  # no consumer settings: it warns of each
        self._down = ""  # what down() found: the run ends with it

    def close(self) -> None:
        self.consumer.close()

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions; a broker that cannot be reached, or a topic it does
        not have, is one line saying what to check (docs/sources-kafka.md "Untidy inputs")."""
        from confluent_kafka import KafkaError

        meta = self._metadata(topic)
        found = meta.topics.get(topic)
        where = self.config["bootstrap.servers"]
        if found is not None and found.error is not None and \
                found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise SourceError(f"kafka://{where}/{topic}: no such topic at {where}; check its "
                              "name (case matters), or create it first")
        if found is None or found.error is not None:
            raise SourceError(f"kafka://{where}/{topic}: "
                              f"{found.error.str() if found else 'not found'} at {where}")
        return sorted(found.partitions)

    def _metadata(self, topic: str) -> Any:
        """The topic's metadata, asked in 1 s slices for up to 15 s; ends after 3 s when
        librdkafka says every broker is down (a wrong host or port, a stopped broker),
        which it would otherwise retry, silently, to the end."""
        from confluent_kafka import KafkaError, KafkaException

        start = time.monotonic()
        while True:
            try:
                return self.consumer.list_topics(topic, timeout=1)
            except KafkaException as exc:
                self.consumer.poll(0)  # serves error_cb
                waited = time.monotonic() - start
                down = any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in self._errors)
                if waited >= METADATA_SECONDS or (down and waited >= DOWN_SECONDS):
                    raise SourceError(self._unreachable(exc)) from None

    def _unreachable(self, exc: Exception, during: bool = False) -> str:
        from confluent_kafka import KafkaError

        where = self.config["bootstrap.servers"]
        why = next((e.str() for e in reversed(self._errors)  # the cause, not "1/1
                    if e.code() != KafkaError._ALL_BROKERS_DOWN), "")  # brokers are down"
        why = re.sub(r"^\S+/(bootstrap|\d+): | \(after \d+ms in state \w+.*\)$", "", why) or \
            str(exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else exc)
        if during:
            return (f"kafka://{where}: cannot reach the broker any more ({why}); what was "
                    "committed stays loaded: check that the broker is running, then run the "
                    "same command again to go on from there")
        return (f"kafka://{where}: cannot reach the broker ({why}); check the host and port "
                "in kafka://host:port/topic and that the broker is running")

    def down(self) -> str:
        """'' if a broker answers now; else the line saying that none can be reached
        (one stopped during the run: a unit's read or a watermark failed), for the run
        to end with instead of the failure it caused. Asked through the admin client,
        which reads no messages (the Python reader may be consuming meanwhile)."""
        from confluent_kafka import KafkaException

        if self._down:
            return self._down
        self._errors.clear()
        try:
            self.admin.list_topics(timeout=DOWN_SECONDS)
            return ""
        except KafkaException as exc:
            self.admin.poll(0)  # serves error_cb: the cause
            self._down = self._unreachable(exc, during=True)
            return self._down

    def topic_id(self, topic: str) -> str:
        """The topic's id (a re-created topic has another); '' if the broker has none."""
        try:
            from confluent_kafka import TopicCollection

            described = self.admin.describe_topics(TopicCollection([topic]))[topic]
            return str(described.result(15).topic_id or "")
        except Exception:  # noqa: BLE001 - an old broker or client: no ids to compare
            return ""

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import TopicPartition

        low, high = self._call(lambda: self.consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=15, cached=False), f"{topic}/{partition}")
        return int(low), int(high)

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        from confluent_kafka import KafkaException

        try:
            return fn()
        except KafkaException as exc:
            down = self.down()
            if down:
                raise SourceError(down) from None
            raise SourceError(f"kafka {what} at {self.config['bootstrap.servers']}: "
                              f"{exc.args[0] if exc.args else exc}") from exc

    def read(self, unit: Unit, out: Any, audit: int = 0) -> Spooled:
        """Write the values of the unit's messages to `out`, one per line (`audit`: each
        with its Kafka columns, `audited`)."""
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(unit.topic, unit.partition, unit.first)])
        try:
            return _read(self.consumer, unit, out, audit)
        finally:
            self.consumer.unassign()


class SpoolReader:
    """Reads a round's units into spool files: natively (kafka_native: no Python object
    per message, all partitions in one call) when the C reader builds here, else
    through confluent-kafka one unit after the other (`why` says why not native)."""

    def __init__(self, broker: Broker, native_config: dict[str, str], group: str) -> None:
        from chload.sources.kafka import native as kafka_native

        self.broker = broker
        lib, self.why = kafka_native.load()
        self.native_config = {**native_config, "group.id": group}
        self.native = (kafka_native.NativeReader(lib, self.native_config)
                       if lib is not None else None)
        self.handles: dict[tuple[str, int], Any] = {}  # stream(): one per partition

    def close(self) -> None:
        if self.native is not None:
            self.native.close()
        for handle in self.handles.values():
            handle.close()
        self.handles.clear()

    def keep_handles(self, keys: set[tuple[str, int]], most: int) -> None:
        """Close the per-partition handles of other partitions than `keys` once there
        are more than `most` (none is in use between rounds)."""
        if len(self.handles) > most:
            for key in [k for k in self.handles if k not in keys]:
                self.handles.pop(key).close()

    def stream(self, unit: Unit, audit: int) -> tuple[str, PipeReading]:
        """The unit's values streamed into a pipe as they are read, for the engine to
        parse while they come (docs/sources-kafka.md: read and parse overlap); the pipe's path
        (/dev/fd/N, db_pipes) and its reading, whose `finish` says whether the unit was
        read whole. Each partition has its own consumer handle and thread, so a writer
        waiting on a full pipe holds up no other partition. Native reader only."""
        from chload.sources import pipes as db_pipes
        from chload.sources.kafka import native as kafka_native

        assert self.native is not None
        handle = self.handles.get((unit.topic, unit.partition))
        if handle is None:
            handle = kafka_native.NativeReader(self.native.lib, self.native_config)
            self.handles[(unit.topic, unit.partition)] = handle
        read_end, write_end = db_pipes.make()
        reading = PipeReading(handle, unit, write_end, audit)
        return db_pipes.register(read_end, reading), reading

    def read(self, jobs: Sequence[tuple[Unit, str]], audit: int = 0) -> list[Spooled]:
        """Each unit's values into its path (created, or emptied); `audit`: each value
        (a JSON object) with the message's Kafka columns as its last fields."""
        if self.native is None:
            return [self._python(unit, path, audit) for unit, path in jobs]
        fds = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for _, path in jobs]
        try:
            done = self.native.read([(u.topic, u.partition, u.first, u.last, fd, audit)
                                     for (u, _), fd in zip(jobs, fds, strict=True)])
        finally:
            for fd in fds:
                os.close(fd)
        return [Spooled(int(r.messages), int(r.bytes), bool(r.contiguous), int(r.first_offset))
                for r in done]

    def _python(self, unit: Unit, path: str, audit: int) -> Spooled:
        with open(path, "wb", buffering=1 << 20) as out:
            return self.broker.read(unit, out, audit)


class PipeReading:
    """A unit being read into a pipe's write end by the native reader, in a thread of
    its own (ctypes releases the GIL); the write end is closed when the unit ends, so
    the engine sees the end of the data there. db_pipes.check asks `finish` after the
    engine read to the end: it raises unless the reader completed the unit."""

    def __init__(self, handle: Any, unit: Unit, write_end: int, audit: int) -> None:
        self.unit, self.done = unit, Spooled()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(handle, write_end, audit),
                                        name=f"chload-kafka-{unit.partition}", daemon=True)
        self._thread.start()

    def _run(self, handle: Any, write_end: int, audit: int) -> None:
        u = self.unit
        try:
            r = handle.read([(u.topic, u.partition, u.first, u.last, write_end, audit)])[0]
            self.done = Spooled(int(r.messages), int(r.bytes), bool(r.contiguous),
                                int(r.first_offset))
        except BaseException as exc:  # noqa: BLE001 - handed to finish(), in the loader
            self.error = exc
        finally:
            os.close(write_end)

    def finish(self) -> None:
        self._thread.join()
        if isinstance(self.error, SourceError):  # it names the unit's partition and offsets
            raise self.error
        if self.error is not None:
            raise SourceError(f"kafka {self.unit.topic}/{self.unit.partition} offsets "
                              f"{self.unit.first}..{self.unit.last}: {self.error}")

    def stop(self) -> None:
        """The engine is done with the pipe (its read end closed: a writer gets EPIPE):
        wait for the thread, so its handle is free for the partition's next unit."""
        self._thread.join()


@dataclass(slots=True)
class Spooled:
    """What reading a unit wrote: messages, bytes, and whether row n of the spool is
    offset first + n - 1 (no gaps: compaction, transaction markers, null values)."""

    messages: int = 0
    bytes: int = 0
    contiguous: bool = True
    first_offset: int = -1


def _read(consumer: Any, unit: Unit, out: Any, audit: int) -> Spooled:
    done = Spooled()
    expect, quiet_since = unit.first, time.monotonic()
    while expect <= unit.last:
        messages = consumer.consume(CONSUME_BATCH, 1.0)
        if not messages:
            if time.monotonic() - quiet_since > READ_TIMEOUT:
                raise SourceError(f"kafka {unit.topic}/{unit.partition}: no message at offset "
                                  f"{expect} for {READ_TIMEOUT:.0f} s (offsets up to "
                                  f"{unit.last} were there at start); run again later")
            continue
        quiet_since = time.monotonic()
        values, expect = _values(messages, unit, expect, done, audit)
        if values:
            block = b"\n".join(values)
            out.write(block)
            out.write(b"\n")
            done.bytes += len(block) + 1
            done.messages += len(values)
    return done


def _values(messages: list, unit: Unit, expect: int, done: Spooled,
            audit: int = 0) -> tuple[list[bytes], int]:
    """The values of one consume() batch within the unit, and the next offset due.

    The usual batch (no error, no gap, no null) costs one list comprehension; any other
    is looked at message by message."""
    if messages[-1].error() is not None:
        tail = messages.pop()
        _check_error(tail, unit)
        if not messages:
            return [], max(expect, tail.offset()) if _is_eof(tail) else expect
    offsets_end = messages[-1].offset()
    if offsets_end > unit.last:  # offsets rise within a partition: cut by bisection
        cut = bisect.bisect_right(_Offsets(messages), unit.last)
        messages = messages[:cut]
        if not messages:
            return [], unit.last + 1
    first, last = messages[0].offset(), messages[-1].offset()
    if done.first_offset < 0:
        done.first_offset = first
    if first != expect or last - first + 1 != len(messages):
        return _slow(messages, unit, done, audit), last + 1
    values = [_audited(m, audit) if audit else m.value() for m in messages]
    if None in values:
        done.contiguous = False
        values = [v for v in values if v is not None]
    return cast("list[bytes]", values), last + 1


def _slow(messages: list, unit: Unit, done: Spooled, audit: int) -> list[bytes]:
    values: list[bytes] = []
    for m in messages:
        if m.error() is not None:
            _check_error(m, unit)
            continue
        value = _audited(m, audit) if audit else m.value()
        if value is not None:
            values.append(value)
    done.contiguous = False
    return values


def _audited(m: Any, mode: int) -> bytes | None:
    """A message's value with its Kafka columns (the fallback reader's; the native
    reader's put_audited and put_audited_line write the same bytes)."""
    value = m.value()
    if value is None:
        return None
    fields = (m.topic(), m.partition(), m.offset(), m.timestamp()[1], m.key())
    return audited(value, *fields) if mode == AUDIT_JSON else audited_line(value, *fields,
                                                                           mode)


def audited(value: bytes, topic: str, partition: int, offset: int, timestamp_ms: int,
            key: bytes | None) -> bytes:
    """--audit: a JSON object with `_topic`, `_partition`, `_offset`, `_timestamp` (UTC,
    milliseconds) and `_key` ("" if none) as its last fields, so the engine parses them
    as columns with the rest (docs/sources-kafka.md); a value that is not an object goes as it
    is, and the engine rejects it like any malformed row."""
    body = value.rstrip(b" \t\r\n")
    if not body.endswith(b"}"):
        return value
    head = body[:-1].rstrip(b" \t\r\n")
    fields = (b'"_topic":' + _json_string(topic.encode()) + b',"_partition":%d,"_offset":%d,'
              b'"_timestamp":"%s","_key":' % (partition, offset, _stamp(timestamp_ms))
              + _json_string(key or b""))
    return head + (b"" if head.endswith(b"{") else b",") + fields + b"}"


def audited_line(value: bytes, topic: str, partition: int, offset: int, timestamp_ms: int,
                 key: bytes | None, mode: int) -> bytes:
    """--audit, CSV (`mode` AUDIT_CSV) and TSV lines: the five Kafka columns as the
    line's last fields, quoted or escaped as the format wants (no key: empty)."""
    line = value.rstrip(b"\r\n")
    if mode == AUDIT_CSV:
        return b"%s,%s,%d,%d,\"%s\",%s" % (line, _csv_string(topic.encode()), partition,
                                           offset, _stamp(timestamp_ms), _csv_string(key or b""))
    return b"%s\t%s\t%d\t%d\t%s\t%s" % (line, _tsv_string(topic.encode()), partition, offset,
                                        _stamp(timestamp_ms), _tsv_string(key or b""))


def _stamp(timestamp_ms: int) -> bytes:
    ms = max(0, timestamp_ms)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}"
    return when.encode()


def _csv_string(raw: bytes) -> bytes:
    return b'"' + raw.replace(b'"', b'""') + b'"'


_TSV_ESCAPES = {ord("\\"): b"\\\\", ord("\t"): b"\\t", ord("\n"): b"\\n", ord("\r"): b"\\r",
                0: b"\\0"}


def _tsv_string(raw: bytes) -> bytes:
    if not any(c in _TSV_ESCAPES for c in raw):
        return raw
    return b"".join(_TSV_ESCAPES.get(c, bytes((c,))) for c in raw)


def _json_string(raw: bytes) -> bytes:
    out = raw.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    if any(c < 0x20 for c in out):
        out = b"".join(b"\\u%04x" % c if c < 0x20 else bytes((c,)) for c in out)
    return b'"' + out + b'"'


class _Offsets:
    """A batch's offsets as a sequence, for bisect (one call per probe, not per message)."""

    def __init__(self, messages: list) -> None:
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, i: int) -> int:
        return int(self.messages[i].offset())


def _is_eof(message: Any) -> bool:
    from confluent_kafka import KafkaError

    return bool(message.error().code() == KafkaError._PARTITION_EOF)


def _check_error(message: Any, unit: Unit) -> None:
    if _is_eof(message):
        return
    raise SourceError(f"kafka {unit.topic}/{unit.partition} at offset {unit.first}..."
                      f"{unit.last}: {message.error().str()}")


@dataclass(frozen=True, slots=True)
class Unit:
    topic: str
    partition: int
    first: int
    last: int  # inclusive
