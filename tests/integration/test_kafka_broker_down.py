"""A Kafka broker stopped in the middle of a load, against a real broker of this module's
own (the session's stays up for the other tests): the run, which committed units
before, ends with its report (those units, `rows_loaded`) and exit 1, the line naming
the broker, saying it cannot be reached and what to do, in the report's `errors`, and
no line of librdkafka's own on stderr (docs/cli.md "Exit codes"); what was committed
stays, and a rerun once the broker is back ends exact. A load while the broker is
still down commits nothing: the one line, exit 2. The same contract when the target
server is killed after the run's first commits."""

from __future__ import annotations

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
from conftest import run_chload, top_block
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


def _committed(target: str, clickhouse: services.Service, table: str,
               loader: subprocess.Popen) -> None:
    """Wait until the load has committed a unit: rows in the server's table, or (embedded,
    whose directory the load holds) a part attached into the table's data directory."""
    deadline = time.monotonic() + 60
    while True:
        assert loader.poll() is None, loader.communicate()
        assert time.monotonic() < deadline, "the load committed nothing in 60 s"
        if target == clickhouse.url:
            try:
                if int(services.clickhouse_query(clickhouse, f"SELECT count() FROM {table}")):
                    return
            except Exception:  # noqa: BLE001, S110 - not created yet
                pass
        elif top_block(target, table):
            return
        time.sleep(0.05)


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
def test_a_broker_stopped_after_commits_ends_with_the_report_and_the_line(
        own_kafka, clickhouse, tmp_path: Path, case: str) -> None:
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
        _committed(target, clickhouse, table, loader)
        own_kafka.stop()
        stopped = time.monotonic()
        out, err = loader.communicate(timeout=120)
        again = _load(target, uri, table)  # still down: nothing committed, one line, exit 2
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.communicate()
        own_kafka.start()
    assert loader.returncode == 1, (out[-2000:], err[-2000:])
    assert time.monotonic() - stopped < 90
    assert "%3|" not in err and "|FAIL|" not in err and "rdkafka#" not in err, err[-2000:]
    assert "Traceback" not in err, err
    report = json.loads(out.splitlines()[-1])
    assert report["rows_loaded"] > 0 and report["files_loaded"] > 0, report
    down = [e for e in report["errors"] if e.startswith(f"kafka://{bootstrap}: cannot reach "
                                                         "the broker")]
    assert len(down) == 1 and "run the same command again" in down[0], report["errors"]
    # stderr names it once too (--json or not: docs/cli.md "Exit codes")
    assert err.count("cannot reach") == 1 and "  error: kafka://" in err, err
    assert _counts(target, table)[0] == report["rows_loaded"]  # what it says it committed

    assert again.returncode == 2, again.stderr
    assert again.stderr.count("\n") == 1 and "cannot reach the broker" in again.stderr

    done = _load(target, uri, table)  # the broker back: the rest, exactly once
    assert done.returncode == 0, done.stderr
    assert _counts(target, table) == (ROWS, ROWS)


def test_the_server_killed_after_commits_ends_with_the_report(kafka, clickhouse) -> None:
    """Each commit waits 2 s after its attach (CHLOAD_PAUSE_AT); the server is killed
    once the first unit's rows are in the table: the units in flight fail, the run ends
    with its report of what it committed, the errors (the server gone, the run's last
    writes) in `errors`, exit 1, not 2 ("nothing was loaded"). A rerun ends exact."""
    table = f"t_{uuid.uuid4().hex[:10]}"
    topic = f"s_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, topic, 4)
    _produce(kafka, topic, range(20_000))
    uri = f"kafka://{kafka.extra['bootstrap']}/{topic}"
    loader = subprocess.Popen(
        [sys.executable, "-m", "chload", "load", uri, "--table", table, "--target",
         clickhouse.url, "--json", "--batch-rows", "1000"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "CHLOAD_PAUSE_AT": "after-attach:2"})
    try:
        _committed(clickhouse.url, clickhouse, table, loader)
        time.sleep(0.3)  # the ATTACH's answer on its way (the commit waits 2 s)
        clickhouse.kill()
        out, err = loader.communicate(timeout=180)
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.communicate()
        clickhouse.restart()
    assert loader.returncode == 1, (out[-2000:], err[-2000:])
    assert "Traceback" not in err, err
    report = json.loads(out.splitlines()[-1])
    assert report["files_loaded"] >= 1 and report["rows_loaded"] >= 1_000, report
    assert report["errors"], report
    assert _counts(clickhouse.url, table)[0] >= report["rows_loaded"]
    done = _load(clickhouse.url, uri, table)
    assert done.returncode == 0, done.stderr
    assert _counts(clickhouse.url, table) == (20_000, 20_000)
    history = run_chload("history", "--table", table, "--target", clickhouse.url, "--json")
    assert history.returncode == 0, history.stderr
