"""A Kafka topic deleted and created again under the same name (offsets from 0, another
topic id), against a real broker, into the embedded engine and into 18.16 (whose loads
join a consumer group): refused until --force, then followed like any topic, its
offsets compared only with its own units, never with the old topic's."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import services
from test_kafka import _counts, _load, _produce, _report, _topic, _uri


def _re_create(kafka: services.Service, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.extra["bootstrap"]})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=5).topics:  # the broker forgets it in a moment
        assert time.monotonic() < deadline, f"{topic} not deleted in 30 s"
        time.sleep(0.1)
    services.kafka_create_topic(kafka, topic, partitions)


def _refused(done) -> list[str]:  # noqa: ANN001 - a CompletedProcess
    return [f["uri"] for f in _report(done)["files"] if f["status"] == "failed"
            and "re-created" in f["error"]]


# (target, partitions before, partitions after, --batch-rows): the same count, more
# and fewer partitions; several units a partition, so the new topic's unit names
# (`<partition>/<first>-<last>`) are the old topic's too.
CASES = {
    "embedded-1-1": ("embedded", 1, 1, "500"),
    "embedded-2-3": ("embedded", 2, 3, "300"),
    "server-1-1": ("server", 1, 1, "500"),
    "server-3-2": ("server", 3, 2, "300"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_re_created_topic_once_forced_is_followed_exactly(kafka, clickhouse, target_dir,
                                                            table_name, case):
    where, before, after, rows = CASES[case]
    target = target_dir if where == "embedded" else clickhouse.url
    topic = _topic(kafka, partitions=before)
    uri = _uri(kafka, topic)
    batch = ("--batch-rows", rows)
    _produce(kafka, topic, range(1_100), partitions=before)
    assert _report(_load(target, uri, table_name, *batch))["rows_loaded"] == 1_100

    _re_create(kafka, topic, after)
    _produce(kafka, topic, range(10_000, 10_600), partitions=after)
    done = _load(target, uri, table_name, *batch)
    assert done.returncode == 1, done.stderr
    common = min(before, after)  # partitions of both topics: refused; others load
    assert sorted(_refused(done)) == [f"{uri}/{n}" for n in range(common)]
    new_rows = sum(1 for i in range(600) if i % after >= common)
    assert _report(done)["rows_loaded"] == new_rows
    assert _counts(target, table_name) == (1_100 + new_rows, 1_100 + new_rows)

    forced = _report(_load(target, uri, table_name, *batch, "--force"))
    assert forced["rows_loaded"] == 600 - new_rows, forced
    assert forced["files_skipped"] == 0, forced  # nothing "loaded by another run"
    assert _counts(target, table_name) == (1_700, 1_700)

    # accepted: the ledger follows the new topic; a rerun loads what is new, and only that
    again = _load(target, uri, table_name, *batch)
    assert again.returncode == 0 and _report(again)["rows_loaded"] == 0, again.stdout
    _produce(kafka, topic, range(20_000, 20_500), partitions=after)
    again = _load(target, uri, table_name, *batch)
    assert again.returncode == 0, again.stdout
    assert _report(again)["rows_loaded"] == 500
    forced = _report(_load(target, uri, table_name, *batch, "--force"))
    assert forced["rows_loaded"] == 0, forced  # --force does not reload it from offset 0
    assert _counts(target, table_name) == (2_200, 2_200)


def test_two_loaders_in_a_group_take_a_re_created_topic_once(kafka, clickhouse, table_name):
    """Into 18.16, two processes started together with --force split the new topic's
    partitions (a consumer group) and each follows the other's units of it, not the old
    topic's end."""
    topic = _topic(kafka, partitions=4)
    uri = _uri(kafka, topic)
    _produce(kafka, topic, range(4_000))
    assert _report(_load(clickhouse.url, uri, table_name))["rows_loaded"] == 4_000
    _re_create(kafka, topic, 4)
    _produce(kafka, topic, range(10_000, 30_000))
    argv = [sys.executable, "-m", "chload", "load", uri, "--table", table_name, "--target",
            clickhouse.url, "--json", "--batch-rows", "1000", "--force"]
    both = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in both]
    assert [p.returncode for p in both] == [0, 0], [o[1][-2000:] for o in outs]
    assert sum(json.loads(o[0].splitlines()[-1])["rows_loaded"] for o in outs) == 20_000
    assert _counts(clickhouse.url, table_name) == (24_000, 24_000)
    again = _load(clickhouse.url, uri, table_name)
    assert again.returncode == 0 and _report(again)["rows_loaded"] == 0, again.stdout


@pytest.mark.parametrize("where", ["embedded", "server"])
def test_a_partition_empty_when_forced_loads_later_without_asking(kafka, target_dir,
                                                                  table_name, request, where):
    """The topic re-created with 3 partitions where it had 2: partition 1 (loaded from
    the old topic) is empty when --force takes the new one, so its ledger has no unit of
    the new topic; once messages come, a plain run loads it, as the other partitions of
    the accepted topic. Partition 2 (new) loading without --force accepts nothing."""
    target = target_dir if where == "embedded" else request.getfixturevalue("clickhouse").url
    topic = _topic(kafka, partitions=2)
    uri = _uri(kafka, topic)
    _produce(kafka, topic, range(1_000), partitions=2)
    assert _report(_load(target, uri, table_name))["rows_loaded"] == 1_000
    _re_create(kafka, topic, 3)
    _produce(kafka, topic, range(10_002, 10_600, 3), partitions=3)  # partition 0
    _produce(kafka, topic, range(10_001, 10_600, 3), partitions=3)  # partition 2
    for _ in range(2):  # partition 2's units are no --force of the topic
        done = _load(target, uri, table_name)
        assert done.returncode == 1
        assert sorted(_refused(done)) == [f"{uri}/0", f"{uri}/1"]
    assert _counts(target, table_name) == (1_200, 1_200)
    forced = _report(_load(target, uri, table_name, "--force"))
    assert forced["rows_loaded"] == 200 and forced["files_failed"] == 0, forced
    _produce(kafka, topic, range(10_000, 10_600, 3), partitions=3)  # partition 1
    again = _load(target, uri, table_name)
    assert again.returncode == 0, again.stdout
    assert _report(again)["rows_loaded"] == 200
    assert _counts(target, table_name) == (1_600, 1_600)
