"""A Kafka broker stopped in the middle of a load, against a real broker of this module's
own (the session's stays up for the other tests): the run ends with one line naming the
broker, saying it cannot be reached and what to do, and no line of librdkafka's own on
stderr; what was committed stays, and a rerun once the broker is back ends exact."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import services
from test_kafka import _counts, _load, _produce

pytestmark = pytest.mark.integration

ROWS = 200_000


@pytest.fixture(scope="module")
def own_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[services.Service]:
    if not services.is_installed("kafka"):
        pytest.fail("kafka is not installed: run python3 scripts/services/services.py "
                    "install kafka (scripts/test does it)")
    broker = services.start_kafka(tmp_path_factory.mktemp("kafka-down"), "kafka-down")
    yield broker
    broker.stop()


def _started(target: str, clickhouse: services.Service, table: str,
             loader: subprocess.Popen) -> None:
    """Wait until the load is under way: its spool directory made (embedded: after
    planning), or rows in the server's table."""
    deadline = time.monotonic() + 60
    while True:
        assert loader.poll() is None, loader.communicate()
        assert time.monotonic() < deadline, "the load did not start in 60 s"
        if target == clickhouse.url:
            try:
                if int(services.clickhouse_query(clickhouse, f"SELECT count() FROM {table}")):
                    return
            except Exception:  # noqa: BLE001, S110 - not created yet
                pass
        elif glob.glob(os.path.join(target, "tmp", "chload-kafka-*")):
            time.sleep(0.5)  # and a round or so read
            return
        time.sleep(0.1)


# (target, arguments, environment): streamed units, spooled ones (the next round read
# ahead), --follow, the Python reader, and a server (a consumer group's member).
CASES = {
    "embedded-streamed": ("embedded", ("--batch-rows", "1000"), {}),
    "embedded-spooled": ("embedded", ("--batch-rows", "1000"), {"CHLOAD_KAFKA_PIPES": "0"}),
    "embedded-follow": ("embedded", ("--follow", "--batch-rows", "1000"), {}),
    "embedded-python-reader": ("embedded", ("--batch-rows", "1000"),
                               {"CHLOAD_KAFKA_READER": "python"}),
    "server": ("server", ("--batch-rows", "1000"), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broker_stopped_mid_load_is_one_line_naming_it(own_kafka, clickhouse,
                                                         tmp_path: Path, case: str) -> None:
    where, args, env = CASES[case]
    target = str(tmp_path / "target") if where == "embedded" else clickhouse.url
    table = f"t_{uuid.uuid4().hex[:10]}"
    topic = f"d_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(own_kafka, topic, 4)
    _produce(own_kafka, topic, range(ROWS))
    bootstrap = own_kafka.extra["bootstrap"]
    uri = f"kafka://{bootstrap}/{topic}"
    loader = subprocess.Popen(
        [sys.executable, "-m", "chload", "load", uri, "--table", table, "--target", target,
         "--json", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env})
    try:
        _started(target, clickhouse, table, loader)
        own_kafka.stop()
        stopped = time.monotonic()
        out, err = loader.communicate(timeout=120)
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.communicate()
        own_kafka.start()
    assert loader.returncode == 2, (out[-2000:], err[-2000:])
    assert time.monotonic() - stopped < 90
    assert "%3|" not in err and "|FAIL|" not in err and "rdkafka#" not in err, err[-2000:]
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"kafka://{bootstrap}: cannot reach the broker" in err, err
    assert "run the same command again" in err, err
    assert json.loads(out.splitlines()[-1])["error"] == err.strip()[len("chload: "):]

    done = _load(target, uri, table)  # the broker back: the rest, exactly once
    assert done.returncode == 0, done.stderr
    assert _counts(target, table) == (ROWS, ROWS)
