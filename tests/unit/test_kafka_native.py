"""The native Kafka reader's build and fallback, and the read-ahead's bookkeeping
(which spools read ahead a round may use), without a broker."""

from __future__ import annotations

import shutil
from concurrent.futures import Future

import pytest

from chload.errors import SourceError
from chload.formats import FileFormat
from chload.sources.base import SourceFile, StreamPosition
from chload.sources.kafka import native as kafka_native, source as K, units as U
from chload.sources.kafka.read import AUDIT_CSV, AUDIT_TSV, Unit, audited, audited_line


def test_no_compiler_or_python_forced_falls_back_with_a_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("CHLOAD_CACHE", str(tmp_path))
    monkeypatch.setenv("CHLOAD_KAFKA_READER", "python")
    assert kafka_native._build() == (None, "CHLOAD_KAFKA_READER=python")
    monkeypatch.delenv("CHLOAD_KAFKA_READER")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    lib, why = kafka_native._build()
    assert lib is None
    assert "no C compiler" in why or "no librdkafka" in why


@pytest.mark.skipif(not shutil.which("cc") or not kafka_native.librdkafka(),
                    reason="needs cc and librdkafka")
def test_builds_once_into_the_cache_and_checks_its_struct(monkeypatch, tmp_path):
    monkeypatch.setenv("CHLOAD_CACHE", str(tmp_path))
    monkeypatch.delenv("CHLOAD_KAFKA_READER", raising=False)
    lib, why = kafka_native._build()
    assert lib is not None, why
    built = list((tmp_path / "native").glob("chload_kafka_*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert kafka_native._build()[0] is not None
    assert built[0].stat().st_mtime_ns == stamp  # not rebuilt
    with pytest.raises(SourceError, match="no.such.setting"):
        kafka_native.NativeReader(lib, {"bootstrap.servers": "127.0.0.1:1",
                                        "no.such.setting": "1"})


def _part(next_: int, end: int) -> K.Partition:
    return K.Partition("t", 0, "kafka://b:1/t/0", "id", next_, next_, end)


def _spool(part: K.Partition, first: int, last: int, after: int) -> U.Spool:
    f = SourceFile(f"{part.stream}/{first}-{last}", 1, 0, FileFormat("JSONEachRow", "none"),
                   local_path=None, position=StreamPosition(part.stream, after, 0, 0))
    return U.Spool(part, Unit("t", 0, first, last), after, f)


def test_the_round_after_follows_each_unit_up_to_the_partition_end():
    part = _part(0, 250)
    following = U.following([_spool(part, 0, 99, 0)], 100)
    assert [(u.first, u.last, after) for _, u, after in following] == [(100, 199, 100)]
    assert U.following([_spool(part, 200, 249, 200)], 100) == []  # nothing after it
    tail = U.following([_spool(part, 100, 199, 100)], 100)
    assert [(u.first, u.last) for _, u, _ in tail] == [(200, 249)]


def test_a_spool_read_ahead_is_used_only_where_its_partition_ended_as_planned():
    loaded, refused = _part(100, 300), _part(0, 300)  # the first round: loaded; refused
    ahead: Future[list[U.Spool]] = Future()
    ahead.set_result([_spool(loaded, 100, 199, 100), _spool(refused, 100, 199, 100)])
    kept = U.taken(ahead, [loaded, refused], 100)
    assert [s.part for s in kept] == [loaded]


def test_lag_is_reported_per_partition_and_summed_in_the_progress_view():
    from chload.cli.render import ProgressView
    from chload.core.run import Event

    behind, done, stopped = _part(100, 250), _part(250, 250), _part(0, 90)
    stopped.stopped = True
    events: list[Event] = []
    K._lag(events.append, [behind, done, stopped])
    assert [(e.kind, e.rows) for e in events] == [("lag", 150), ("lag", 0), ("lag", 0)]
    view = ProgressView()
    view.on_event(Event("lag", "kafka://b:1/t/0", rows=150))
    view.on_event(Event("lag", "kafka://b:1/t/1", rows=7))
    view.on_event(Event("lag", "kafka://b:1/t/0", rows=40))  # the partition's latest counts
    rate = view._progress.tasks[0].fields["rate"]
    assert rate.endswith("lag 47"), rate


def test_audited_values_keep_the_object_and_escape_the_key():
    assert audited(b' { } ', "t", 1, 2, 3_004, None) == (
        b' {"_topic":"t","_partition":1,"_offset":2,"_timestamp":"1970-01-01 00:00:03.004",'
        b'"_key":""}')
    assert audited(b'{"a":1}\n', "t", 0, 9, -1, b'a"\\\n') == (
        b'{"a":1,"_topic":"t","_partition":0,"_offset":9,"_timestamp":'
        b'"1970-01-01 00:00:00.000","_key":"a\\"\\\\\\u000a"}')
    assert audited(b"not json", "t", 0, 0, 0, b"k") == b"not json"


class _Handle:
    """A native reader that writes part of a unit, then fails or finishes."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def read(self, units):
        import os
        import types

        os.write(units[0][4], b'{"id":1}\n')
        if self.fail:
            raise SourceError("kafka t/0: no message at offset 1 for 30 s")
        return [types.SimpleNamespace(messages=1, bytes=9, contiguous=1, first_offset=0)]


@pytest.mark.parametrize("fail", [False, True])
def test_a_streamed_unit_commits_only_if_its_reader_finished_it(fail):
    from chload.sources import pipes as db_pipes
    from chload.sources.kafka.read import PipeReading

    read_end, write_end = db_pipes.make()
    reading = PipeReading(_Handle(fail), Unit("t", 0, 0, 1), write_end, False)
    path = db_pipes.register(read_end, reading)
    source = K.KafkaStreamSource()
    unit = SourceFile("kafka://b:1/t/0/0-1", 0, 0, FileFormat("JSONEachRow", "none"),
                      kind="kafka", local_path=path)
    try:
        source.current(unit)  # as_read: nothing yet
        with open(path, "rb") as pipe:  # the engine reads to the end of the pipe
            assert pipe.read() == b'{"id":1}\n'
        if fail:
            with pytest.raises(SourceError, match="no message at offset 1"):
                source.current(unit)  # check_read: the reader did not finish the unit
        else:
            source.current(unit)
            assert reading.done.messages == 1
        with pytest.raises(SourceError, match="read by an earlier attempt"):
            source.current(unit)  # a retried load cannot read the pipe again
    finally:
        source.release([unit])
    assert not db_pipes.is_pipe(path)


def test_audited_lines_quote_csv_and_escape_tsv():
    assert audited_line(b'1,"a,b"\r\n', "t", 2, 7, 3_004, b'k"1', AUDIT_CSV) == (
        b'1,"a,b","t",2,7,"1970-01-01 00:00:03.004","k""1"')
    assert audited_line(b"1\tx\n", "t", 0, 9, 0, b"a\tb\\\n\x00", AUDIT_TSV) == (
        b"1\tx\tt\t0\t9\t1970-01-01 00:00:00.000\ta\\tb\\\\\\n\\0")
    assert audited_line(b"1", "t", 0, 1, 0, None, AUDIT_TSV).endswith(b"00.000\t")
