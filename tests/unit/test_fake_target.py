"""The runner and api.load against an in-memory target (fake_target.py): retries,
--on-error abort, batches falling back to file by file, files committed elsewhere,
report counts. No engine: these run in milliseconds."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from fake_target import FakeTarget

from chload import api, dispatch
from chload.commit.ledger import FAILED, LOADED
from chload.commit.rejects import ErrorBudget
from chload.core import run as runner
from chload.core.run import Event, RetryPolicy
from chload.errors import TransientError
from chload.formats import FileFormat
from chload.schema import Column
from chload.sources.base import SourceFile
from chload.targets.base import LoadJob, Target

FAST = RetryPolicy(attempts=3, base_seconds=0.0)
TABLE = "`default`.`t`"


def _files(tmp_path: Path, *lines: int) -> list[SourceFile]:
    made = []
    for i, n in enumerate(lines):
        path = tmp_path / f"f{i}.jsonl"
        path.write_text("".join(f'{{"id": {k}}}\n' for k in range(n)))
        made.append(SourceFile(str(path), path.stat().st_size, 1,
                               FileFormat("JSONEachRow", "none"), local_path=str(path)))
    return made


def _jobs(target: FakeTarget, files: list[SourceFile]) -> list[LoadJob]:
    columns = [Column("id", "UInt64")]
    return [LoadJob(group[0], TABLE, "default.t", columns, columns, False, (), "run1",
                    batch=group if len(group) > 1 else ())
            for group in target.plan_batches(files, ErrorBudget(), 2)]


def _run(target: FakeTarget, files: list[SourceFile], **kw: object,
         ) -> tuple[dict[str, runner.FileResult], list[Event]]:
    events: list[Event] = []
    results = runner.run(target, _jobs(target, files), 2, events.append, policy=FAST,
                         **kw)  # type: ignore[arg-type]
    return {r.uri: r for r in results}, events


def _progress(events: list[Event]) -> dict[str, int]:
    rows: dict[str, int] = defaultdict(int)
    for e in events:
        if e.kind == "progress":
            rows[e.uri] += e.rows
    return dict(rows)


def test_the_fake_is_a_whole_target() -> None:
    """Every member of the Target protocol, on the fake and on both real targets (mypy
    checks the real ones: targets._conforms)."""
    from chload.targets.embedded.target import EmbeddedTarget
    from chload.targets.server.target import ServerTarget

    members = [n for n in vars(Target) if not n.startswith("_")]
    assert {"create_table", "load_batch", "plan_batches", "open_streams", "workdir",
            "database"} <= set(members)
    fake = FakeTarget(".")
    assert all(hasattr(fake, n) for n in members)
    for cls in (EmbeddedTarget, ServerTarget):  # less what __init__ sets
        missing = [n for n in members if not hasattr(cls, n)]
        assert set(missing) <= {"display", "ledger", "database"}, (cls, missing)


def test_transient_failures_are_retried_and_their_progress_taken_back(tmp_path: Path) -> None:
    a, b = _files(tmp_path, 3, 4)
    target = FakeTarget(str(tmp_path), transient={a.uri: 2, b.uri: 5})
    results, events = _run(target, [a, b])
    assert (results[a.uri].status, results[a.uri].rows) == ("loaded", 3)
    assert results[b.uri].status == "failed" and "unreachable" in results[b.uri].error
    assert target.calls.count(("load_file", a.uri)) == 3  # two failures, then loaded
    assert target.calls.count(("load_file", b.uri)) == FAST.attempts
    assert _progress(events) == {a.uri: 3, b.uri: 0}
    assert target.attached == {TABLE: [a.uri]}


def test_on_error_abort_starts_nothing_after_a_failure(tmp_path: Path) -> None:
    files = _files(tmp_path, 1, 1, 1, 1)
    target = FakeTarget(str(tmp_path), terminal={files[0].uri: "Cannot parse input"})
    jobs = _jobs(target, files)
    results = runner.run(target, jobs, 1, lambda e: None, abort_on_error=True, policy=FAST)
    assert [r.status for r in results] == ["failed", "not-started", "not-started",
                                           "not-started"]
    assert results[0].error.endswith("Cannot parse input")
    assert target.calls == [("load_file", files[0].uri)]  # terminal: no retry


def test_a_failed_batch_is_halved_until_the_bad_file_fails_alone(tmp_path: Path) -> None:
    files = _files(tmp_path, 1, 2, 3, 4, 5, 6, 7, 8)
    target = FakeTarget(str(tmp_path), terminal={files[5].uri: "bad row"}, batch_size=8)
    results, events = _run(target, files)
    assert [results[f.uri].status for f in files] == ["loaded"] * 5 + ["failed"] + ["loaded"] * 2
    assert "bad row" in results[files[5].uri].error
    uris = [f.uri for f in files]
    assert target.calls == [("load_batch", tuple(uris)),  # fails: halves, the bad one halved
                            ("load_batch", tuple(uris[:4])), ("load_batch", tuple(uris[4:])),
                            ("load_batch", tuple(uris[4:6])), ("load_file", uris[4]),
                            ("load_file", uris[5]), ("load_batch", tuple(uris[6:]))]
    assert sorted(target.attached[TABLE]) == sorted(uris[:5] + uris[6:])
    assert sum(_progress(events).values()) == 36 - 6  # the failed tries' taken back


def test_a_batch_committed_in_part_elsewhere_skips_that_file(tmp_path: Path) -> None:
    files = _files(tmp_path, 2, 3)
    target = FakeTarget(str(tmp_path), elsewhere=[files[0].uri], batch_size=2)
    results, events = _run(target, files)
    assert results[files[0].uri].status == "skipped"
    assert results[files[0].uri].note == runner.LOADED_ELSEWHERE
    assert (results[files[1].uri].status, results[files[1].uri].rows) == ("loaded", 3)
    assert [e.kind for e in events if e.uri == files[0].uri][-1] == "skip"
    assert _progress(events)[files[0].uri] == 0


def test_a_batch_loads_with_one_commit(tmp_path: Path) -> None:
    files = _files(tmp_path, 1, 2, 3)
    target = FakeTarget(str(tmp_path), batch_size=2)
    results, _ = _run(target, files)
    assert [results[f.uri].rows for f in files] == [1, 2, 3]
    assert sorted(target.calls, key=str) == [("load_batch", (files[0].uri, files[1].uri)),
                                             ("load_file", files[2].uri)]


def _spec(tmp_path: Path, **kw: object) -> api.LoadSpec:
    return api.LoadSpec(sources=(str(tmp_path / "*.jsonl"),), table="t", schema="id UInt64",
                        **kw)  # type: ignore[arg-type]


def test_load_reports_what_the_target_did(tmp_path: Path) -> None:
    files = _files(tmp_path, 2, 3, 4, 5)
    target = FakeTarget(str(tmp_path), transient={files[0].uri: 1},
                        terminal={files[1].uri: "bad row"}, elsewhere=[files[2].uri])
    report = dispatch.load_into(_spec(tmp_path), target)
    assert (report.files_total, report.files_loaded, report.files_failed,
            report.files_skipped) == (4, 2, 1, 1)
    assert report.rows_loaded == 2 + 5 and report.created_table and not report.ok
    assert report.target == "fake target" and report.table == "default.t"
    assert target.tables == {TABLE: [Column("id", "UInt64")]}
    assert target.streams == 2 and target.flushed and not target.closed  # caller closes
    assert [r.status for r in target.ledger.run_records] == ["partial"]
    assert {e.uri: e.state for e in target.ledger.events} == {
        files[0].uri: LOADED, files[1].uri: FAILED, files[3].uri: LOADED}

    again = dispatch.load_into(_spec(tmp_path), target)  # the ledger says what is loaded
    assert (again.files_loaded, again.files_skipped, again.files_failed) == (0, 3, 1)
    assert not again.created_table and again.rows_loaded == 0


class _GoneAtTheEnd(FakeTarget):
    """The server dies once the units are done: the run's last writes fail."""

    def flush(self) -> None:
        raise TransientError("server 127.0.0.1:1 unreachable: Connection refused")


def test_the_last_writes_failing_after_commits_are_the_reports(tmp_path: Path) -> None:
    _files(tmp_path, 2, 3)
    target = _GoneAtTheEnd(str(tmp_path))
    report = dispatch.load_into(_spec(tmp_path), target)  # committed: not raised
    assert (report.files_loaded, report.rows_loaded, report.ok) == (2, 5, False)
    assert len(report.errors) == 1 and "the next run settles" in report.errors[0]
    assert report.errors[0].startswith("server 127.0.0.1:1 unreachable")


def test_the_last_writes_failing_with_nothing_committed_stop_the_run(tmp_path: Path) -> None:
    files = _files(tmp_path, 2)
    target = _GoneAtTheEnd(str(tmp_path), terminal={files[0].uri: "bad row"})
    with pytest.raises(TransientError, match="unreachable"):  # exit 2: nothing was loaded
        dispatch.load_into(_spec(tmp_path), target)


def test_load_with_on_error_abort_stops_at_the_first_failure(tmp_path: Path) -> None:
    files = _files(tmp_path, 1, 1, 1)
    target = FakeTarget(str(tmp_path), terminal={files[0].uri: "bad row"}, workers=1)
    report = dispatch.load_into(_spec(tmp_path, on_error="abort"), target)
    assert report.files_failed == 1 and report.files_loaded == 0
    assert [f.status for f in report.files] == ["failed", "not-started", "not-started"]
    assert [r.status for r in target.ledger.run_records] == ["failed"]


def test_load_batches_where_the_target_plans_them(tmp_path: Path) -> None:
    files = _files(tmp_path, 1, 2, 3, 4)
    target = FakeTarget(str(tmp_path), batch_size=4, terminal={files[3].uri: "bad row"})
    report = dispatch.load_into(_spec(tmp_path), target)
    assert (report.files_loaded, report.files_failed, report.rows_loaded) == (3, 1, 6)
    assert target.calls[0] == ("load_batch", tuple(f.uri for f in files))


@pytest.mark.parametrize("value, where, server", [
    (None, "./chload-data", False), ("/d", "/d", False),
    ("http://u@h:1/db", "http://u@h:1/db", True),
])
def test_target_spec_reads_the_environment_given_once(value: str | None, where: str,
                                                      server: bool) -> None:
    from chload.targets.registry import TargetSpec

    env = {"CLICKHOUSE_PASSWORD": "pw"}
    spec = TargetSpec.resolve(value, env)
    assert spec.where == where and (spec.url is not None) == server
    if spec.url is not None:
        assert spec.url.password == "pw" and "pw" not in repr(spec) + spec.display
    assert TargetSpec.resolve(None, {"CHLOAD_TARGET": "/x"}).where == "/x"
