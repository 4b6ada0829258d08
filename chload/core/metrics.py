"""A load's metrics for Prometheus, in OpenMetrics text, drawn from its progress events.

`--metrics-port N` (chload.load(metrics_port=N)) serves `/metrics` on 127.0.0.1:N while
the load runs. Nothing below the API counts for it: `LoadMetrics.on_event` is one more
listener of the events the runner already emits (core/run.py: plan, done, skip, fail,
lag), as the progress bar is (cli/render.py). Loads of one process given the same port
share one server (a pipelines file's loads: cli/pipelines.py), each its own series,
labelled by table and source; a source's label is what the user typed without a secret
(Source.display), and without any userinfo, query or fragment a URL still holds.

The exposition is written here (a few families of three kinds), not by a client
library: no dependency for what a page of code does, and nothing imported for a load
that serves no metrics.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit, urlunsplit

from chload.core.run import Event, Listener
from chload.errors import UsageError

HOST = "127.0.0.1"
CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
# Upper bounds (seconds) of the unit-commit histogram: a small file to a large one.
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)


def without_secrets(source: str) -> str:
    """A source as a label: a URL without userinfo, query or fragment (a path as is)."""
    if "://" not in source:
        return source
    parts = urlsplit(source)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class LoadMetrics:
    """One load's counters, fed by its events. Thread-safe: the runner's threads emit."""

    def __init__(self, table: str, source: str) -> None:
        self.labels = {"table": table, "source": source}
        self._guard = threading.Lock()
        self.rows = self.bytes = self.units = self.skipped = self.failed = self.rejected = 0
        self.buckets = [0] * (len(BUCKETS) + 1)  # the last: +Inf
        self.seconds_sum = 0.0
        self._planned_at = 0.0  # when the units of the plan in flight were seen
        self._pending = 0  # of them, not yet loaded, skipped or failed
        self.behind: dict[str, int] = {}  # a Kafka partition -> messages not yet loaded

    def on_event(self, event: Event) -> None:
        with self._guard:
            if event.kind == "plan":  # a load's plan (each round of a stream has one)
                self._planned_at, self._pending = time.monotonic(), event.files_total
            elif event.kind == "done":
                self.rows += event.rows
                self.bytes += event.bytes
                self.units += 1
                self.rejected += event.rejected
                self.buckets[bisect.bisect_left(BUCKETS, event.seconds)] += 1
                self.seconds_sum += event.seconds
                self._finished()
            elif event.kind in ("skip", "fail"):
                self.skipped += event.kind == "skip"
                self.failed += event.kind == "fail"
                self._finished()
            elif event.kind == "lag":
                self.behind[without_secrets(event.uri)] = event.rows

    def _finished(self) -> None:
        self._pending = max(0, self._pending - 1)

    def lag_seconds(self) -> float:
        """The age of the oldest unit planned (seen) and not yet finished; 0 when none."""
        with self._guard:
            return time.monotonic() - self._planned_at if self._pending else 0.0

    def exposition(self) -> dict[str, list[str]]:
        """This load's samples, by metric family (name -> lines)."""
        lag = self.lag_seconds()
        with self._guard:
            out = {
                "chload_rows_loaded": [_sample("chload_rows_loaded_total", self.labels,
                                               self.rows)],
                "chload_bytes_loaded": [_sample("chload_bytes_loaded_total", self.labels,
                                                self.bytes)],
                "chload_units_loaded": [_sample("chload_units_loaded_total", self.labels,
                                                self.units)],
                "chload_units_skipped": [_sample("chload_units_skipped_total", self.labels,
                                                 self.skipped)],
                "chload_units_failed": [_sample("chload_units_failed_total", self.labels,
                                                self.failed)],
                "chload_rows_rejected": [_sample("chload_rows_rejected_total", self.labels,
                                                 self.rejected)],
                "chload_unit_commit_seconds": self._histogram(),
                "chload_lag_seconds": [_sample("chload_lag_seconds", self.labels, lag)],
                "chload_kafka_messages_behind": [
                    _sample("chload_kafka_messages_behind", {**self.labels, "partition": p}, n)
                    for p, n in sorted(self.behind.items())],
            }
        return out

    def _histogram(self) -> list[str]:
        name, lines, seen = "chload_unit_commit_seconds", [], 0
        for bound, count in zip((*BUCKETS, float("inf")), self.buckets, strict=True):
            seen += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(_sample(f"{name}_bucket", {**self.labels, "le": le}, seen))
        lines.append(_sample(f"{name}_count", self.labels, seen))
        lines.append(_sample(f"{name}_sum", self.labels, self.seconds_sum))
        return lines


# Each family: its type and help, in the order served.
FAMILIES: dict[str, tuple[str, str]] = {
    "chload_rows_loaded": ("counter", "Rows committed into the table."),
    "chload_bytes_loaded": ("counter", "Bytes read of the units committed."),
    "chload_units_loaded": ("counter", "Units (files, ranges, Kafka batches) committed."),
    "chload_units_skipped": ("counter", "Units another run committed meanwhile."),
    "chload_units_failed": ("counter", "Units that failed (the report names each)."),
    "chload_rows_rejected": ("counter", "Bad rows kept in chload.rejects (--max-errors)."),
    "chload_unit_commit_seconds": ("histogram",
                                   "Seconds from a unit's start to its commit."),
    "chload_lag_seconds": ("gauge", "Age of the oldest unit planned and not yet loaded."),
    "chload_kafka_messages_behind": ("gauge", "Messages of a Kafka partition up to its "
                                              "high watermark not yet loaded."),
}


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    text = ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())
    number = repr(float(value)) if isinstance(value, float) else str(value)
    return f"{name}{{{text}}} {number}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(loads: Sequence[LoadMetrics]) -> str:
    """The OpenMetrics text of every load: one block per family, `# EOF` last."""
    parts = [load.exposition() for load in loads]
    lines = []
    for family, (kind, about) in FAMILIES.items():
        lines += [f"# TYPE {family} {kind}", f"# HELP {family} {about}"]
        for part in parts:
            lines += part[family]
    return "\n".join([*lines, "# EOF"]) + "\n"


class MetricsServer:
    """`/metrics` on HOST:port, on a daemon thread, for the loads registered with it."""

    def __init__(self, port: int) -> None:
        self.port, self.users = port, 0
        self._loads: dict[tuple[str, str], LoadMetrics] = {}
        self._guard = threading.Lock()
        try:
            self._server = ThreadingHTTPServer((HOST, port), _handler(self.text))
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            raise UsageError(f"--metrics-port {port}: {HOST}:{port} "
                             f"{'is in use' if taken else 'cannot be served'} "
                             f"({exc.strerror}); choose another port") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="chload_metrics", daemon=True)
        self._thread.start()

    def load(self, table: str, source: str) -> LoadMetrics:
        """The series of (table, source): one run after another adds to the same."""
        with self._guard:
            return self._loads.setdefault((table, source), LoadMetrics(table, source))

    def text(self) -> str:
        with self._guard:
            loads = list(self._loads.values())
        return exposition(loads)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(text: Callable[[], str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "chload serves /metrics")
                return
            body = text().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # nothing printed
            return

    return Handler


_servers: dict[int, MetricsServer] = {}
_servers_guard = threading.Lock()


@contextlib.contextmanager
def serving(port: int | None) -> Iterator[MetricsServer | None]:
    """The server of `port` while the block runs (None: no metrics), started by its
    first user in this process and stopped when its last is done."""
    if port is None:
        yield None
        return
    if not 0 < port < 65536:
        raise UsageError(f"--metrics-port {port}: a TCP port, 1 to 65535")
    with _servers_guard:
        server = _servers.get(port) or MetricsServer(port)
        _servers[port] = server
        server.users += 1
    try:
        yield server
    finally:
        with _servers_guard:
            server.users -= 1
            if not server.users:
                del _servers[port]
                server.close()


@contextlib.contextmanager
def observed(port: int | None, table: str, source: str,
             listener: Listener | None) -> Iterator[Listener | None]:
    """`listener` with the load's metrics fed first, while `port` serves them."""
    with serving(port) as server:
        if server is None:
            yield listener
            return
        counted = server.load(table, source)

        def both(event: Event) -> None:
            counted.on_event(event)
            if listener is not None:
                listener(event)

        yield both
