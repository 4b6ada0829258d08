"""Kafka topics into a table exactly once, against a real broker.

Every test has its own topic and table; messages are JSON rows `{"id": n, ...}` with ids
unique across a topic, so `count() = uniqExact(id) = produced` is the exactly-once check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import services
from conftest import kill_when, run_chload, stage_holds_rows


def _topic(kafka: services.Service, partitions: int = 4) -> str:
    name = f"k_{uuid.uuid4().hex[:10]}"
    services.kafka_create_topic(kafka, name, partitions)
    return name


def _produce(kafka: services.Service, topic: str, ids: range, partitions: int = 4,
             bad: dict[int, bytes] | None = None) -> None:
    """Messages {"id": i} round-robin over partitions; `bad` replaces some values."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.extra["bootstrap"], "linger.ms": 20,
                         "compression.type": "zstd", "batch.size": 1 << 20})
    for i in ids:
        value = (bad or {}).get(i) or b'{"id":%d,"name":"u%d","v":%d.5}' % (i, i % 97, i)
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _uri(kafka: services.Service, topic: str) -> str:
    return f"kafka://{kafka.extra['bootstrap']}/{topic}"


def _load(target: str, uri: str, table: str, *args: str,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_chload("load", uri, "--table", table, "--target", target, "--json", *args,
                      env=env, timeout=300)


def _report(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _counts(target: str, table: str) -> tuple[int, int]:
    out = run_chload("sql", f"SELECT count(), uniqExact(id) FROM {table}", "--target", target,
                     "--format", "TSV")
    assert out.returncode == 0, out.stderr
    count, unique = out.stdout.split()
    return int(count), int(unique)


def test_load_then_rerun_loads_only_the_new_messages(kafka, target_dir, table_name):
    topic = _topic(kafka)
    _produce(kafka, topic, range(20_000))
    first = _report(_load(target_dir, _uri(kafka, topic), table_name, "--batch-rows", "3000"))
    assert first["rows_loaded"] == 20_000 and first["files_failed"] == 0
    again = _report(_load(target_dir, _uri(kafka, topic), table_name))
    assert again["rows_loaded"] == 0 and again["files_total"] == 0
    _produce(kafka, topic, range(20_000, 25_000))
    more = _report(_load(target_dir, _uri(kafka, topic), table_name))
    assert more["rows_loaded"] == 5_000
    assert {f["uri"].rsplit("/", 1)[1] for f in more["files"]} == {"5000-6249"}
    assert _counts(target_dir, table_name) == (25_000, 25_000)
    history = run_chload("history", "--table", table_name, "--target", target_dir, "--json")
    assert len(json.loads(history.stdout)) == 3  # one record per run, not per round


def test_the_python_reader_fallback_loads_the_same_and_says_so(kafka, target_dir, table_name):
    topic = _topic(kafka)
    _produce(kafka, topic, range(6_000))
    slow = _report(_load(target_dir, _uri(kafka, topic), table_name, "--batch-rows", "1000",
                         env={"CHLOAD_KAFKA_READER": "python"}))
    assert slow["rows_loaded"] == 6_000 and slow["files_failed"] == 0
    assert any("Python reader" in note for note in slow["notes"]), slow["notes"]
    _produce(kafka, topic, range(6_000, 7_000))
    native = _report(_load(target_dir, _uri(kafka, topic), table_name))
    assert native["rows_loaded"] == 1_000 and native["notes"] == []
    assert _counts(target_dir, table_name) == (7_000, 7_000)


# Units spooled (CHLOAD_KAFKA_PIPES=0), streamed through pipes with the columns inferred
# from a sample (or the table), and streamed with --schema: (arguments, environment).
MODES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "spooled": ((), {"CHLOAD_KAFKA_PIPES": "0"}),
    "streamed": ((), {}),
    "streamed-schema": (("--schema", "id UInt64, name String, v Float64"), {}),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_killed_three_times_mid_load_then_finished_is_exact(kafka, target_dir, table_name,
                                                            mode):
    topic = _topic(kafka)
    _produce(kafka, topic, range(200_000))
    uri = _uri(kafka, topic)
    args, env = MODES[mode]
    for point in ["after-attach", "before-attach", "after-attach:2"]:  # SIGKILL at the
        crash = _load(target_dir, uri, table_name, "--batch-rows", "5000",  # commit's
                      *args, env={**env, "CHLOAD_CRASH_AT": point})  # narrowest windows
        assert crash.returncode == -9, crash.stderr
    between = subprocess.Popen([sys.executable, "-m", "chload", "load", uri, "--table",
                                table_name, "--target", target_dir, "-q", "--batch-rows",
                                "10000", *args], env={**os.environ, **env})
    kill_when(between, lambda: stage_holds_rows(target_dir, between.pid),  # and once mid-
              "a stage holds rows")  # stage, away from the commit
    done = _load(target_dir, uri, table_name, "--batch-rows", "10000", *args, env=env)
    assert done.returncode == 0, done.stderr
    assert _counts(target_dir, table_name) == (200_000, 200_000)


def test_without_schema_units_stream_as_a_sample_or_the_table_says(kafka, target_dir,
                                                                    table_name):
    """No --schema: a new table's columns from a sample of the first messages, then the
    existing table's; both stream (a spooled load says why in its notes)."""
    topic = _topic(kafka)
    _produce(kafka, topic, range(4_000))
    first = _report(_load(target_dir, _uri(kafka, topic), table_name))
    assert (first["rows_loaded"], first["notes"]) == (4_000, [])
    _produce(kafka, topic, range(4_000, 6_000))
    again = _report(_load(target_dir, _uri(kafka, topic), table_name))
    assert (again["rows_loaded"], again["notes"]) == (2_000, [])
    assert _counts(target_dir, table_name) == (6_000, 6_000)
    alter = run_chload("sql", f"ALTER TABLE {table_name} ADD COLUMN w UInt8 DEFAULT 7",
                       "--target", target_dir)
    assert alter.returncode == 0, alter.stderr
    _produce(kafka, topic, range(6_000, 7_000))
    spooled = _report(_load(target_dir, _uri(kafka, topic), table_name))
    assert spooled["rows_loaded"] == 1_000
    assert any("DEFAULT" in n and "spooled" in n for n in spooled["notes"]), spooled["notes"]
    assert _counts(target_dir, table_name) == (7_000, 7_000)


def test_more_partitions_than_a_streamed_round_takes_load_each_once(kafka, target_dir,
                                                                     table_name):
    topic = _topic(kafka, partitions=11)  # 8 units per streamed round at most
    _produce(kafka, topic, range(22_000), partitions=11)
    report = _report(_load(target_dir, _uri(kafka, topic), table_name, "--batch-rows", "800",
                           *MODES["streamed-schema"][0]))
    assert report["rows_loaded"] == 22_000 and report["files_failed"] == 0
    assert report["files_loaded"] == 11 * 3  # 2,000 messages a partition: 800+800+400
    assert _counts(target_dir, table_name) == (22_000, 22_000)


@pytest.mark.parametrize("mode", list(MODES))
def test_two_loaders_at_once_into_a_server_are_exact(kafka, clickhouse, table_name, mode):
    topic = _topic(kafka)
    _produce(kafka, topic, range(100_000))
    target = clickhouse.url
    argv = [sys.executable, "-m", "chload", "load", _uri(kafka, topic), "--table", table_name,
            "--target", target, "--json", *MODES[mode][0], "--batch-rows"]
    # units cut differently (5000 and 7000): only the committed-end check keeps them apart
    both = [subprocess.Popen([*argv, rows], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, **MODES[mode][1]})
            for rows in ("5000", "7000")]
    outs = [p.communicate(timeout=300) for p in both]
    assert [p.returncode for p in both] == [0, 0], [o[1] for o in outs]
    loaded = sum(json.loads(o[0].splitlines()[-1])["rows_loaded"] for o in outs)
    assert loaded == 100_000
    assert _counts(target, table_name) == (100_000, 100_000)
    _produce(kafka, topic, range(100_000, 110_000))
    assert _report(_load(target, _uri(kafka, topic), table_name))["rows_loaded"] == 10_000
    assert _counts(target, table_name) == (110_000, 110_000)


def _report_of(stdout: str) -> dict:
    return json.loads(stdout.splitlines()[-1]) if stdout.strip() else {}


def _group_partitions(report: dict) -> set[str]:
    """The partitions a process's report says it loaded, as a member of its group."""
    notes = [n for n in report["notes"] if "consumer group" in n]
    assert len(notes) == 1, report["notes"]
    return {p for p in notes[0].rpartition("partitions ")[2].split(", ") if p != "none"}


def test_two_loaders_in_a_group_split_the_partitions_exactly(kafka, clickhouse, table_name):
    topic = _topic(kafka)
    _produce(kafka, topic, range(200_000))
    argv = [sys.executable, "-m", "chload", "load", _uri(kafka, topic), "--table", table_name,
            "--target", clickhouse.url, "--json", "--batch-rows", "2000"]
    started = time.monotonic()
    both = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in both]
    assert [p.returncode for p in both] == [0, 0], [
        (o[1], [f.get("error") for f in _report_of(o[0]).get("files", [])
                if f["status"] == "failed"], _report_of(o[0]).get("error"))
        for o in outs]
    assert time.monotonic() - started < 240
    reports = [json.loads(o[0].splitlines()[-1]) for o in outs]
    assert sum(r["rows_loaded"] for r in reports) == 200_000
    assert _counts(clickhouse.url, table_name) == (200_000, 200_000)
    split = [_group_partitions(r) for r in reports]
    everything = {f"{topic}/{n}" for n in range(4)}
    assert split[0] | split[1] == everything, split
    # the group splits them: at most one (the first in, before the other joined) has all
    assert min(len(s) for s in split) < 4 and all(s for s in split), split


def test_a_member_killed_mid_load_hands_its_partitions_over(kafka, clickhouse, table_name):
    topic = _topic(kafka)
    _produce(kafka, topic, range(200_000))
    argv = [sys.executable, "-m", "chload", "load", _uri(kafka, topic), "--table", table_name,
            "--target", clickhouse.url, "--json", "--batch-rows", "2000"]
    both = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    try:
        _wait_for_rows(clickhouse, table_name, 20_000, both[0])
    finally:
        both[0].send_signal(signal.SIGKILL)
    killed = both[0].communicate(timeout=30)[1]
    at_kill = _committed_ends(clickhouse, table_name)
    out, err = both[1].communicate(timeout=240)  # after session.timeout.ms (10 s)
    said = (f"\nsurvivor's stderr:\n{err}\nkilled member's stderr:\n{killed}\n"
            f"ends at the kill: {at_kill}")
    assert both[1].returncode == 0, said
    report = json.loads(out.splitlines()[-1])
    at_end = _committed_ends(clickhouse, table_name)
    assert (_counts(clickhouse.url, table_name), report["files_failed"]) == (
        (200_000, 200_000), 0), f"{said}\nends now: {at_end}\nreport: {out}"
    # its own, then each of the killed member's that was not at its end when killed (on
    # a quick machine the killed member may have finished one of its own already)
    unfinished = {f"{topic}/{p}" for p, end in at_end.items() if at_kill.get(p) != end}
    loaded = _group_partitions(report)
    assert loaded >= unfinished and loaded, (loaded, at_kill, at_end, said)


def test_units_another_loader_committed_after_a_round_took_its_positions_are_skipped(
        kafka, clickhouse, table_name):
    """A round's units that another loader committed after the round took its
    partitions' positions (here a loader killed just after its first attach, whose
    commits the round's planning settles and finds loaded): skipped, and the run goes
    on from the ledger's end, never leaving those partitions short of their rows."""
    topic = _topic(kafka)
    _produce(kafka, topic, range(16_000))
    argv = [sys.executable, "-m", "chload", "load", _uri(kafka, topic), "--table", table_name,
            "--target", clickhouse.url, "--json", "--batch-rows", "2000"]

    def loader(group: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*argv, "--kafka-option", f"group.id={group}-{table_name}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **env})

    # `late` takes its positions at once, then waits before loading its round; `first`
    # waits before its commit (so after `late` took them), then dies after one attach
    late = loader("late", CHLOAD_PAUSE_AT="kafka-round:15")
    first = loader("first", CHLOAD_PAUSE_AT="before-lock:6", CHLOAD_CRASH_AT="after-attach")
    try:
        killed = first.communicate(timeout=120)[1]
        out, err = late.communicate(timeout=240)
    finally:
        for p in (first, late):
            if p.poll() is None:
                p.kill()
    assert first.returncode == -signal.SIGKILL, killed
    assert late.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    assert _counts(clickhouse.url, table_name) == (16_000, 16_000), (out, err)
    skipped = {f["uri"] for f in report["files"] if f["status"] == "skipped"}
    assert skipped and report["files_failed"] == 0, out


def test_a_commit_a_killed_loader_left_is_settled_before_the_run_ends(kafka, clickhouse,
                                                                     table_name):
    """`first` dies between its unit's `committing` and its attach; `late` took its
    position before, then finds the partition at its end in the ledger (which counts
    `committing` units as loaded) without a round of its own: it settles it (attaches
    its stage) before it ends, so its exit 0 means the rows are in the table."""
    topic = _topic(kafka, partitions=1)
    _produce(kafka, topic, range(2_000), partitions=1)
    argv = [sys.executable, "-m", "chload", "load", _uri(kafka, topic), "--table", table_name,
            "--target", clickhouse.url, "--json"]
    # rows in the table first: an empty one with `committing` rows is taken for truncated
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
    _produce(kafka, topic, range(2_000, 4_000), partitions=1)
    late = subprocess.Popen([*argv, "--kafka-option", f"group.id=late-{table_name}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CHLOAD_PAUSE_AT": "kafka-rounds:20"})
    first = subprocess.Popen([*argv, "--kafka-option", f"group.id=first-{table_name}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "CHLOAD_CRASH_AT": "before-attach"})
    try:
        killed = first.communicate(timeout=120)[1]
        assert first.returncode == -signal.SIGKILL, killed
        assert late.poll() is None, "late ended before first was killed: nothing shown"
        out, err = late.communicate(timeout=120)
    finally:
        for p in (first, late):
            if p.poll() is None:
                p.kill()
    assert late.returncode == 0, err
    assert _counts(clickhouse.url, table_name) == (4_000, 4_000), (out, err)
    assert json.loads(out.splitlines()[-1])["recovered"] == 1, out


def _committed_ends(clickhouse: services.Service, table: str) -> dict[int, int]:
    """Each partition's committed end in the server's ledger for `table` now."""
    rows = services.clickhouse_query(
        clickhouse, "SELECT uri FROM chload.files WHERE target_table = "
        f"'default.{table}' AND state = 'loaded'").split()
    ends: dict[int, int] = {}
    for uri in rows:
        head, _, span = uri.rpartition("/")
        partition = int(head.rpartition("/")[2])
        ends[partition] = max(ends.get(partition, 0), int(span.rpartition("-")[2]) + 1)
    return ends


def test_one_loader_in_a_group_loads_every_partition(kafka, clickhouse, table_name):
    topic = _topic(kafka)
    _produce(kafka, topic, range(20_000))
    report = _report(_load(clickhouse.url, _uri(kafka, topic), table_name,
                           "--kafka-option", f"group.id=g-{table_name}"))
    assert report["rows_loaded"] == 20_000
    assert any(f"consumer group g-{table_name}:" in n for n in report["notes"])
    assert _group_partitions(report) == {f"{topic}/{n}" for n in range(4)}
    assert _counts(clickhouse.url, table_name) == (20_000, 20_000)


def _server_count(clickhouse: services.Service, table: str) -> int:
    try:
        return int(services.clickhouse_query(clickhouse, f"SELECT count() FROM {table}"))
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def _wait_for_rows(clickhouse: services.Service, table: str, rows: int, loader: subprocess.Popen,
                   timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _server_count(clickhouse, table) < rows:
        assert loader.poll() is None, loader.communicate()[1]
        assert time.monotonic() < deadline, f"{rows} rows not loaded in {timeout} s"
        time.sleep(0.2)


@pytest.mark.parametrize("mode", list(MODES))
def test_follow_loads_what_arrives_and_sigterm_ends_it_cleanly(kafka, clickhouse, table_name,
                                                               mode):
    topic = _topic(kafka)
    _produce(kafka, topic, range(5_000))
    loader = subprocess.Popen(
        [sys.executable, "-m", "chload", "load", _uri(kafka, topic), "--table", table_name,
         "--target", clickhouse.url, "--json", "--follow", "--batch-seconds", "0.5",
         "--batch-rows", "2000", *MODES[mode][0]], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, **MODES[mode][1]})
    try:
        _wait_for_rows(clickhouse, table_name, 5_000, loader)
        _produce(kafka, topic, range(5_000, 8_000))
        _wait_for_rows(clickhouse, table_name, 8_000, loader)
        loader.send_signal(signal.SIGTERM)
        out, err = loader.communicate(timeout=60)
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.communicate()
    assert loader.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["rows_loaded"] == 8_000 and report["files_failed"] == 0
    assert _counts(clickhouse.url, table_name) == (8_000, 8_000)
    again = _report(_load(clickhouse.url, _uri(kafka, topic), table_name))
    assert again["rows_loaded"] == 0 and again["files_total"] == 0


def test_malformed_messages_within_budget_go_to_rejects_with_offsets(kafka, target_dir,
                                                                     table_name):
    topic = _topic(kafka, partitions=1)
    bad_ids = [7, 100, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 9999]
    bad = {i: (b'not json %d' if i % 2 else b'{"id":%d,"name":"x","v":"NaN?"}') % i
           for i in bad_ids}
    _produce(kafka, topic, range(10_000), partitions=1, bad=bad)
    report = _report(_load(target_dir, _uri(kafka, topic), table_name, "--schema",
                           "id UInt64, name String, v Float64", "--max-errors", "20"))
    assert (report["rows_loaded"], report["rows_rejected"]) == (9_990, 10)
    assert any("error budget" in n for n in report["notes"])  # so spooled, said why
    errors = json.loads(run_chload("errors", "--table", table_name, "--target", target_dir,
                                   "--json").stdout)
    assert sorted(e["line"] for e in errors) == bad_ids  # offsets: message i is offset i
    assert all(e["file"].startswith(_uri(kafka, topic) + "/0/") for e in errors)
    assert {e["line"]: e["raw"] for e in errors} == {i: v.decode() for i, v in bad.items()}


def test_a_bad_message_without_budget_names_its_offset_and_commits_nothing(
        kafka, target_dir, table_name):
    topic = _topic(kafka, partitions=1)
    _produce(kafka, topic, range(1_000), partitions=1, bad={500: b'{"id":500,"name":'})
    done = _load(target_dir, _uri(kafka, topic), table_name, "--schema",
                 "id UInt64, name String, v Float64")
    assert done.returncode == 1
    failed = [f for f in _report(done)["files"] if f["status"] == "failed"]
    assert len(failed) == 1 and "offset 500" in failed[0]["error"], failed
    assert _counts(target_dir, table_name) == (0, 0)


def test_a_re_created_topic_is_reported_not_skipped(kafka, target_dir, table_name):
    from confluent_kafka.admin import AdminClient

    topic = _topic(kafka, partitions=1)
    _produce(kafka, topic, range(3_000), partitions=1)
    assert _report(_load(target_dir, _uri(kafka, topic), table_name))["rows_loaded"] == 3_000
    admin = AdminClient({"bootstrap.servers": kafka.extra["bootstrap"]})
    admin.delete_topics([topic])[topic].result(30)
    for _ in range(100):  # the broker forgets it in a moment
        if topic not in admin.list_topics(timeout=5).topics:
            break
        time.sleep(0.1)
    services.kafka_create_topic(kafka, topic, 1)
    _produce(kafka, topic, range(10_000, 15_000), partitions=1)  # more than before, too
    done = _load(target_dir, _uri(kafka, topic), table_name)
    assert done.returncode == 1
    failed = [f for f in _report(done)["files"] if f["status"] == "failed"]
    assert "re-created" in failed[0]["error"], failed
    assert _counts(target_dir, table_name) == (3_000, 3_000)
    forced = _report(_load(target_dir, _uri(kafka, topic), table_name, "--force"))
    assert forced["rows_loaded"] == 5_000
    assert _counts(target_dir, table_name) == (8_000, 8_000)


def test_messages_deleted_before_loading_are_reported(kafka, target_dir, table_name):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = _topic(kafka, partitions=1)
    _produce(kafka, topic, range(1_000), partitions=1)
    assert _report(_load(target_dir, _uri(kafka, topic), table_name))["rows_loaded"] == 1_000
    _produce(kafka, topic, range(1_000, 2_000), partitions=1)
    admin = AdminClient({"bootstrap.servers": kafka.extra["bootstrap"]})
    for future in admin.delete_records([TopicPartition(topic, 0, 1_500)]).values():
        future.result(30)  # as retention would: offsets 1000..1499 never loaded
    done = _load(target_dir, _uri(kafka, topic), table_name)
    assert done.returncode == 1
    failed = [f for f in _report(done)["files"] if f["status"] == "failed"]
    assert "1000..1499 were deleted" in failed[0]["error"], failed
    assert _report(_load(target_dir, _uri(kafka, topic), table_name,
                         "--force"))["rows_loaded"] == 500


def test_kafka_options_reject_credentials_in_the_uri_and_unset_variables(kafka, target_dir):
    done = run_chload("load", "kafka://user:secret@127.0.0.1:1/t", "--table", "t",
                      "--target", target_dir)
    assert done.returncode == 2 and "secret" not in done.stderr + done.stdout
    topic = _topic(kafka, partitions=1)
    done = run_chload("load", _uri(kafka, topic), "--table", "t", "--target", target_dir,
                      "--kafka-option", "sasl.password=${CHLOAD_TEST_UNSET_VAR}")
    assert done.returncode == 2 and "${CHLOAD_TEST_UNSET_VAR} is not set" in done.stderr
