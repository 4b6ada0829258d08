"""Unit tests of the pure pieces: names, formats, braces, errors, schema, planning, retries."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chload.commit.known import KnownUnits
from chload.commit.ledger import FileEvent, TableState, own_history
from chload.core.plan import decide, parse_table
from chload.core.run import RetryPolicy, call_with_retries
from chload.errors import (
    DataError,
    SchemaError,
    SourceError,
    TransientError,
    UsageError,
    from_engine_message,
    one_line,
)
from chload.formats import FileFormat, detect, split_compression
from chload.schema import Column, default_order_by, match_columns, parse_structure
from chload.sources.base import SourceFile
from chload.sources.files.patterns import expand_braces


@pytest.mark.parametrize("name, fmt, method", [
    ("a/trips.csv.gz", "CSV", "gzip"), ("x.TSV", "TSV", "none"),
    ("e.jsonl.zst", "JSONEachRow", "zstd"), ("e.ndjson.xz", "JSONEachRow", "xz"),
    ("p.parquet", "Parquet", "none"), ("o.orc", "ORC", "none"), ("a.avro", "Avro", "none"),
    ("n.native.lz4", "Native", "lz4"), ("b.json.bz2", "JSONEachRow", "bz2"),
])
def test_detect(name: str, fmt: str, method: str) -> None:
    assert detect(name) == FileFormat(fmt, method)


def test_detect_overrides_and_unknown() -> None:
    assert detect("x.dat", "CSVWithNames", "gzip") == FileFormat("CSVWithNames", "gzip")
    assert detect("x.csv.gz", compression="none") == FileFormat("CSV", "none")
    with pytest.raises(UsageError, match="pass --format"):
        detect("x.dat")
    assert split_compression("a.csv") == ("a.csv", "none")


@pytest.mark.parametrize("pattern, expected", [
    ("a{1..3}", ["a1", "a2", "a3"]),
    ("p-{000..002}.pq", ["p-000.pq", "p-001.pq", "p-002.pq"]),
    ("{x,y}/{1..2}", ["x/1", "x/2", "y/1", "y/2"]),
    ("plain", ["plain"]),
    ("{solo}", ["{solo}"]),
    ("r{3..1}", ["r3", "r2", "r1"]),
])
def test_expand_braces(pattern: str, expected: list[str]) -> None:
    assert expand_braces(pattern) == expected


def test_brace_range_is_bounded() -> None:
    with pytest.raises(UsageError, match="more than 100,000"):
        expand_braces("{1..1000000}")


def test_engine_errors_become_one_typed_line() -> None:
    msg = ("Code: 27. DB::Exception: Cannot parse input: expected ',' before: 'abc': (at row 7)\n"
           ": \nRow 6:\nColumn 0, name: id ...\n: (in file/uri /d/x.csv): While executing File. "
           "(CANNOT_PARSE_INPUT_ASSERTION_FAILED)")
    err = from_engine_message(msg, "x.csv")
    assert isinstance(err, DataError)
    assert str(err) == "x.csv: Cannot parse input: expected ',' before: 'abc' (at row 7)"
    assert isinstance(from_engine_message("Code: 107. DB::Exception: File /x doesn't exist",
                                          "x"), SourceError)
    assert isinstance(from_engine_message("Code: 60. DB::Exception: Unknown table", "t"),
                      SchemaError)
    assert isinstance(from_engine_message("Code: 252. DB::Exception: Too many parts", "t"),
                      TransientError)
    assert "\n" not in one_line("a\nb\nc")


def test_parse_structure_respects_parentheses() -> None:
    cols = parse_structure("a UInt32, b Nullable(Decimal(10, 2)), `c` Map(String, UInt8)")
    assert [(c.name, c.type) for c in cols] == [
        ("a", "UInt32"), ("b", "Nullable(Decimal(10, 2))"), ("c", "Map(String, UInt8)")]
    with pytest.raises(UsageError, match="has no type"):
        parse_structure("a, b String")


def test_default_order_by_skips_nullable_and_float() -> None:
    cols = [Column("x", "Nullable(Int64)"), Column("f", "Float64"), Column("when", "DateTime")]
    assert default_order_by(cols) == "`when`"
    assert default_order_by([Column("n", "Nullable(String)")]) == "tuple()"


def test_match_columns_lists_every_mismatch() -> None:
    table = [Column("id", "UInt64"), Column("v", "String"), Column("d", "UInt8", "DEFAULT")]
    data = [Column("v", "Int64"), Column("id", "Int64")]
    assert match_columns("db.t", table, data, audit=False) == [table[1], table[0]]
    with pytest.raises(SchemaError) as err:
        match_columns("db.t", table, [Column("id", "Int64"), Column("w", "String")], False)
    assert "not in the table: w" in str(err.value) and "not in the data: v" in str(err.value)


def test_parse_table() -> None:
    assert parse_table("trips").display == "default.trips"
    assert parse_table("db.trips").sql == "`db`.`trips`"
    for bad in ["a.b.c", "1x", "x-y", ""]:
        with pytest.raises(UsageError):
            parse_table(bad)


def _file(uri: str, size: int = 10, mtime: int = 1, stream: bool = False) -> SourceFile:
    return SourceFile(uri, size, mtime, FileFormat("CSV", "none"), is_stream=stream)


def _loaded(uri: str, identity: str, rows: int = 2, uuid: str = "") -> FileEvent:
    return FileEvent("default.t", uri, identity, 10, 1, "loaded", rows, table_uuid=uuid)


def test_decide_skips_loaded_and_refuses_changed_unless_forced() -> None:
    files = [_file("a"), _file("b", size=11), _file("c"), _file("-", stream=True)]
    loaded = {u: _loaded(u, i) for u, i in [("a", "10:1"), ("b", "10:1"), ("-", "3:3")]}
    plan = decide(files, KnownUnits.of_events(loaded), force=False)
    assert [f.uri for f in plan.to_load] == ["c", "-"]
    assert plan.skipped == 1 and plan.changed == {"b"}
    assert list(plan.refused) == ["b"] and "b: changed since it was loaded (2 rows, " in (
        plan.refused["b"]) and "--force" in plan.refused["b"]
    forced = decide(files, KnownUnits.of_events(loaded), force=True)
    assert len(forced.to_load) == 4 and forced.changed == {"b"} and not forced.refused


def test_decide_takes_a_file_met_twice_once_and_releases_the_second() -> None:
    known = KnownUnits.of_events({"a": _loaded("a", "10:1")})
    first_a, first_c = _file("a"), _file("c")
    released: list[SourceFile] = []
    plan = decide(iter([first_a, first_c, _file("a"), _file("c")]), known, force=False,
                  release=released.extend)
    assert (plan.skipped, [f.uri for f in plan.to_load]) == (1, ["c"])
    assert plan.to_load[0] is first_c and [f.uri for f in released] == ["a", "c"]
    assert all(f is not first_a and f is not first_c for f in released)


def test_decide_finds_a_file_loaded_under_its_older_spelling(tmp_path: Path) -> None:
    """chload 0.1.0 recorded a path's abspath; a file reached through a symlinked
    directory is now its realpath: the ledger's older spelling must still skip it."""
    from chload.sources.files.local import list_local

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.csv").write_text("id\n1\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    [f] = list_local(str(tmp_path / "link" / "a.csv"), None, None)
    old = str(tmp_path / "link" / "a.csv")
    assert f.uri == str((tmp_path / "real" / "a.csv").resolve()) and f.aliases == (old,)
    plan = decide([f], KnownUnits.of_events({old: _loaded(old, f.identity)}), force=False)
    assert plan.skipped == 1 and not plan.to_load


def test_own_history_sets_aside_loads_of_a_table_that_is_gone() -> None:
    loaded = {"a": _loaded("a", "1:1", uuid="u1"), "b": _loaded("b", "1:1", uuid="")}
    assert own_history(TableState(True, "u1", 4), loaded) == (loaded, "")
    assert own_history(TableState(False), loaded)[0] == {}
    assert "dropped" in own_history(TableState(False), loaded)[1]
    assert own_history(TableState(True, "u2", 4), loaded) == ({"b": loaded["b"]}, "")
    only_a = {"a": loaded["a"]}
    assert own_history(TableState(True, "u2", 4), only_a)[0] == {}
    assert "re-created" in own_history(TableState(True, "u2", 4), only_a)[1]
    emptied = own_history(TableState(True, "u1", 0), loaded)
    assert emptied[0] == {} and "holds no rows" in emptied[1]
    no_rows = {"a": _loaded("a", "1:1", rows=0, uuid="u1")}
    assert own_history(TableState(True, "u1", 0), no_rows) == (no_rows, "")
    assert own_history(TableState(False), {}) == ({}, "")


def test_retries_transient_then_succeeds_and_terminal_fails_fast() -> None:
    calls, slept = [], []

    def flaky() -> tuple[int, int]:
        calls.append(1)
        if len(calls) < 3:
            raise TransientError("server: connection reset")
        return 5, 50

    policy = RetryPolicy(attempts=4, base_seconds=0.1)
    assert call_with_retries(flaky, policy, slept.append) == (5, 50)
    assert len(calls) == 3 and len(slept) == 2 and all(0 <= s <= 0.2 for s in slept)

    def bad() -> tuple[int, int]:
        calls.append(1)
        raise DataError("x.csv: cannot parse")

    calls.clear()
    with pytest.raises(DataError):
        call_with_retries(bad, policy, slept.append)
    assert len(calls) == 1

    def down() -> tuple[int, int]:
        raise TransientError("server down")

    with pytest.raises(TransientError):
        call_with_retries(down, RetryPolicy(attempts=3, base_seconds=0), lambda s: None)


def test_budget_allows_count_and_ratio() -> None:
    from chload.commit.rejects import ErrorBudget

    assert ErrorBudget(10, None).allows(10, 1000) and not ErrorBudget(10, None).allows(11, 10**6)
    assert ErrorBudget(None, 0.01).allows(10, 1000) and not ErrorBudget(None, 0.01).allows(11, 1000)
    assert not ErrorBudget(100, 0.001).allows(5, 1000)  # both limits hold


def test_text_column_of_numbers_but_a_few_is_numeric_under_a_budget() -> None:
    from chload.core.reading.sample import numeric_type

    def stats(values: int, not_int: int, not_float: int) -> dict[str, int]:
        return {"values:m": values, "not_Int64:m": not_int, "not_Float64:m": not_float}

    never = lambda bad, values: False  # noqa: E731
    assert numeric_type(stats(1000, 7, 7), "m", never) == "Int64"  # 0.7% bad: rows, not type
    assert numeric_type(stats(1000, 1000, 7), "m", never) == "Float64"
    assert numeric_type(stats(1000, 30, 30), "m", never) is None  # 3%: text, unless...
    assert numeric_type(stats(1000, 30, 30), "m", lambda bad, values: bad <= 50) == "Int64"
    assert numeric_type(stats(1000, 600, 600), "m", lambda bad, values: True) is None
    assert numeric_type(stats(0, 0, 0), "m", lambda bad, values: True) is None  # all empty


def test_medium_files_share_stages_balanced_and_bounded() -> None:
    from chload.targets.embedded.groups import SHARED_FILES, share_stages

    def files(*sizes_mb: float, compression: str = "gzip") -> list[SourceFile]:
        return [SourceFile(f"/d/f{i:02d}.csv", int(mb * 2**20), 0, FileFormat("CSV", compression))
                for i, mb in enumerate(sizes_mb)]

    assert share_stages([], 2) == []
    two = share_stages(files(*[1.3] * 16), 2)  # 21 MB: one group per worker
    assert [len(g) for g in two] == [8, 8]
    assert all(list(g) == sorted(g, key=lambda f: f.uri) for g in two)  # file order kept
    many = share_stages(files(*[5.3] * 20), 1)  # 106 MB: ~32 MB a group
    assert len(many) == 4 and {len(g) for g in many} == {5}
    cap = share_stages(files(*[1.1] * 40), 1)
    assert max(len(g) for g in cap) <= SHARED_FILES and sum(len(g) for g in cap) == 40
    mixed = share_stages(files(12, 1, 1, 1, 1, 12), 2)
    assert sorted(sum(f.size for f in g) >> 20 for g in mixed) == [14, 14]
    rounds = share_stages(files(*[4.5] * 16), 2)  # 72 MB: 3 groups by bytes, so 4
    assert [len(g) for g in rounds] == [4, 4, 4, 4]
    plain = share_stages(files(*[4.5] * 16, compression="none"), 2)  # parses 3x as fast
    assert [len(g) for g in plain] == [8, 8]


def test_small_files_batched_in_even_runs() -> None:
    from chload.targets.embedded.groups import batch_small

    def files(count: int, kb: int) -> list[SourceFile]:
        return [SourceFile(f"/d/f{i:03d}.json", kb << 10, 0, FileFormat("JSONEachRow", "gzip"))
                for i in range(count)]

    assert [len(g) for g in batch_small(files(3, 300), 2)] == [3]  # < 1 MB: one batch
    assert [len(g) for g in batch_small(files(8, 300), 2)] == [4, 4]  # a batch a core
    runs = batch_small(files(200, 133), 2)  # 26 MB: over one batch's 16 MB, so 2 even runs
    assert [len(g) for g in runs] == [100, 100]
    assert [f for g in runs for f in g] == files(200, 133)  # in order: runs of neighbours
    assert [len(g) for g in batch_small(files(300, 40), 3)] == [100, 100, 100]


def test_local_files_read_as_one_list() -> None:
    from chload.sources.registry import table_function_many

    def local(*paths: str) -> list[SourceFile]:
        return [SourceFile(p, 1, 0, FileFormat("JSONEachRow", "gzip"), local_path=p)
                for p in paths]

    sql, uri = table_function_many(local("/d/a.jsonl.gz", "/d/b.jsonl.gz"), "JSONEachRow",
                                   None) or ("", "")
    assert sql.startswith("file('/d/{a.jsonl.gz,b.jsonl.gz}', 'JSONEachRow'")
    assert uri == "concat('/d/', _file)"
    sql, uri = table_function_many(local("/d/a.gz", "/d/e/b.gz"), "CSV", None) or ("", "")
    assert sql.startswith("file('/d/{a.gz,e/b.gz}', 'CSV'")  # 2 directories: each row's
    assert uri == "_path"  # own path names its file
    assert table_function_many(local("/d/a,1.gz", "/d/b.gz"), "CSV", None) is None  # a comma


def test_progress_of_a_failed_attempt_is_taken_back() -> None:
    from chload.core.run import Event, _Progress

    events: list[Event] = []
    progress = _Progress(events.append, "f")

    def fails() -> None:
        progress(10, 100)
        raise TransientError("dropped")

    with pytest.raises(TransientError):
        progress.attempt(fails)
    assert progress.attempt(lambda: progress(10, 100) or 7) == 7
    assert [(e.rows, e.bytes) for e in events] == [(10, 100), (-10, -100), (10, 100)]
    assert sum(e.bytes for e in events) == 100


def test_on_threads_runs_each_item_once_at_most_n_at_a_time() -> None:
    import threading

    from chload.core.run import on_threads

    running, peak, guard = [0], [0], threading.Lock()

    def work(n: int) -> int:
        with guard:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.005)
        with guard:
            running[0] -= 1
        return n * n

    assert sorted(on_threads(work, list(range(40)), 3)) == [n * n for n in range(40)]
    assert peak[0] == 3


def test_on_threads_raises_a_bug_and_starts_nothing_after_it() -> None:
    from chload.core.run import on_threads

    started: list[int] = []

    def work(n: int) -> int:
        started.append(n)
        if n == 2:
            raise ValueError("bug")
        return n

    with pytest.raises(ValueError, match="bug"):
        on_threads(work, list(range(100)), 1)
    assert started == [0, 1, 2]


def test_a_unit_failing_gives_way_to_a_sources_check_that_stops_the_run() -> None:
    """A unit that fails on its own error while a source's check of every unit is still
    to answer waits for it; the check's ValuesRefused is raised by the run (no unit's
    `fail`), and a unit reaching its commit meets it there (LoadJob.settle)."""
    import contextlib
    import threading
    from collections.abc import Iterator
    from typing import Any, cast

    from chload.core.run import Event, run
    from chload.errors import DataError, ValuesRefused
    from chload.sources.run import RunSources
    from chload.targets.base import LoadJob, Target

    answered = threading.Event()

    class Sources:
        @contextlib.contextmanager
        def fetched(self, files: Any, columns: Any, attempt: Any) -> Iterator[Any]:
            yield files

        def settle(self) -> None:
            answered.wait(5)
            raise ValuesRefused("pg://db/t: column t holds 'infinity'")

    class Gated:
        def load_file(self, job: LoadJob, progress: Any) -> Any:
            if job.file.uri == "a":
                raise DataError("a: the range's own refusal")
            assert job.settle is not None
            job.settle()  # (identity.check_read, before the commit)
            raise AssertionError("committed before the check answered")

    sources = Sources()
    jobs = [LoadJob(SourceFile(u, 0, 0, FileFormat("TSV", "none")), "t", "t", [], [], False,
                    (), "r", settle=sources.settle) for u in ("a", "b", "c")]
    events: list[Event] = []
    threading.Timer(0.2, answered.set).start()
    with pytest.raises(ValuesRefused, match="holds 'infinity'"):
        run(cast(Target, Gated()), jobs, 3, events.append,
            sources=cast(RunSources, sources))
    assert not [e for e in events if e.kind == "fail"], events
