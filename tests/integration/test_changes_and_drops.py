"""Exactly once when files change and tables go: on the embedded engine and on a real
18.16 server, the real `chload` command, results checked through SQL.

A file loaded before that has changed is refused (its rows would be there twice) until
`--force`; a file that changes while it is read fails whole; a table dropped, truncated
or re-created since the last load is loaded again; a table that still holds the rows
never is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import services
from conftest import run_chload

from chload.targets.registry import TargetSpec, open_target

pytestmark = pytest.mark.integration

# Runs the real command with one change: right after the engine has read `path` into
# the stage, before the read-time identity is checked, a line is appended to it (a log
# that grows while chload reads it), the first time only.
_GROWS_WHILE_READ = textwrap.dedent("""
    import sys
    from chload.sources import identity
    from chload.cli.main import main
    path, grown, check = sys.argv[1], [], identity.check_read
    def growing(job):
        if not grown and any(f.uri == path for f in job.files):
            grown.append(open(path, "a").write("9,grown\\n"))
        check(job)
    identity.check_read = growing
    sys.exit(main(sys.argv[2:]))
""")

# The same, a line appended at every check of a job holding `path`, each check's count of
# files told on stderr: a file that keeps changing
_GROWS_AT_EVERY_CHECK = textwrap.dedent("""
    import sys
    from chload.sources import identity
    from chload.cli.main import main
    path, check = sys.argv[1], identity.check_read
    def growing(job):
        if any(f.uri == path for f in job.files):
            open(path, "a").write("9,grown\\n")
            print(f"checked with {len(job.files)} files", file=sys.stderr)
        check(job)
    identity.check_read = growing
    sys.exit(main(sys.argv[2:]))
""")


class Target:
    """One target under test: how to load into it and ask it SQL."""

    def __init__(self, kind: str, where: str, table: str,
                 server: services.Service | None = None) -> None:
        self.kind, self.where, self.table, self.server = kind, where, table, server
        self.env = {"CLICKHOUSE_PASSWORD": server.credentials["password"]} if server else {}

    def load(self, *args: str, grows: str = "", always: bool = False,
             ) -> tuple[int, dict, str]:
        argv = ["load", *args, "--table", self.table, "--target", self.where, "--json"]
        if grows:
            script = _GROWS_AT_EVERY_CHECK if always else _GROWS_WHILE_READ
            out = subprocess.run([sys.executable, "-c", script, grows, *argv],
                                 capture_output=True, text=True, timeout=180,
                                 env={**os.environ, **self.env})
        else:
            out = run_chload(*argv, env=self.env, timeout=180)
        assert "Traceback" not in out.stderr, out.stderr
        return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr

    def sql(self, query: str) -> str:
        if self.server is not None:
            return services.clickhouse_query(self.server, query).strip()
        out = run_chload("sql", query, "--target", self.where, "--format", "TSV")
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def count(self, table: str = "") -> int:
        return int(self.sql(f"SELECT count() FROM {table or self.table}"))


@pytest.fixture(params=["embedded", "server"])
def target(request: pytest.FixtureRequest, tmp_path: Path, table_name: str) -> Iterator[Target]:
    if request.param == "embedded":
        yield Target("embedded", str(tmp_path / "target"), table_name)
        return
    server: services.Service = request.getfixturevalue("clickhouse")
    url = f"http://loader@127.0.0.1:{server.ports['http']}/default"
    yield Target("server", url, table_name, server)
    for name in (table_name, f"{table_name}_old"):
        services.clickhouse_query(server, f"DROP TABLE IF EXISTS default.{name}")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _errors(report: dict) -> list[str]:
    return [f["error"] for f in report["files"] if f["status"] == "failed"]


def _touch_later(path: Path) -> None:
    """A new mtime for sure, whatever the file system's clock tick."""
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))


def test_a_changed_file_fails_naming_the_way_forward_and_force_loads_it(
        target: Target, tmp_path: Path) -> None:
    log = _write(tmp_path / "app.csv", "id,v\n1,a\n2,b\n")
    assert target.load(str(log))[0] == 0
    with log.open("a") as grow:  # a log that grows after it was loaded
        grow.write("3,c\n")
    _touch_later(log)

    for _ in range(2):  # refused, and refused again: nothing was recorded for it
        code, report, _ = target.load(str(log))
        assert (code, report["files_loaded"], report["files_failed"],
                report["files_changed"]) == (1, 0, 1, 1)
        [error] = _errors(report)
        assert error.startswith(f"{log}: changed since it was loaded (2 rows, ")
        assert "--force" in error
        assert target.count() == 2

    code, report, _ = target.load(str(log), "--force")
    assert (code, report["files_loaded"], report["rows_loaded"], report["files_changed"]) == (
        0, 1, 3, 1)
    assert target.count() == 5  # what --force says: the whole file again
    code, report, _ = target.load(str(log))
    assert (code, report["files_skipped"]) == (0, 1)


def test_a_file_that_changes_while_read_fails_whole_then_loads_once(
        target: Target, tmp_path: Path) -> None:
    log = _write(tmp_path / "app.csv", "id,v\n1,a\n2,b\n")
    code, report, _ = target.load(str(log), grows=str(log))
    assert (code, report["files_failed"], report["files_loaded"]) == (1, 1, 0)
    assert _errors(report) == [f"{log}: changed while being read (13 bytes, now 21); nothing "
                               "of it was loaded: run again once it is stable"]
    assert target.count() == 0

    code, report, _ = target.load(str(log))
    assert (code, report["files_loaded"], report["rows_loaded"]) == (0, 1, 3)
    code, report, _ = target.load(str(log))  # the identity recorded is the one read
    assert (code, report["files_skipped"], report["files_changed"]) == (0, 1, 0)
    assert target.count() == 3


def test_a_forced_reload_that_fails_leaves_the_file_loaded(target: Target,
                                                           tmp_path: Path) -> None:
    log = _write(tmp_path / "app.csv", "id,v\n1,a\n2,b\n")
    assert target.load(str(log))[0] == 0
    with log.open("a") as grow:
        grow.write("3,c\n")
    _touch_later(log)
    code, report, _ = target.load(str(log), "--force", grows=str(log))
    assert (code, report["files_failed"]) == (1, 1) and target.count() == 2
    # its rows of the first load are still there: changed, so refused (not loaded whole)
    code, report, _ = target.load(str(log))
    assert (code, report["files_loaded"], report["files_changed"]) == (1, 0, 1)
    assert target.count() == 2


def test_a_file_that_grows_while_its_batch_is_read_is_loaded_once_as_read(
        target: Target, tmp_path: Path) -> None:
    a = _write(tmp_path / "a.csv", "id,v\n1,a\n2,b\n")
    _write(tmp_path / "b.csv", "id,v\n5,x\n6,y\n")
    code, report, _ = target.load(str(tmp_path / "*.csv"), "--workers", "1", grows=str(a))
    # one batch (one stage, one commit) fails before its commit; then each file loads
    # alone, `a` as it is now
    assert (code, report["files_loaded"], report["rows_loaded"]) == (0, 2, 5)
    assert target.count() == 5
    code, report, _ = target.load(str(tmp_path / "*.csv"))
    assert (code, report["files_skipped"]) == (0, 2)


def test_a_file_that_keeps_changing_in_a_batch_fails_alone_the_others_load_once(
        target: Target, tmp_path: Path) -> None:
    files = [_write(tmp_path / f"f{i}.csv", f"id,v\n{i},a\n{i},b\n") for i in range(6)]
    pattern = str(tmp_path / "*.csv")
    code, report, err = target.load(pattern, "--workers", "1", grows=str(files[2]),
                                    always=True)
    # every batch holding f2 fails before its commit (halved until f2 is alone), the
    # files after it in a batch not asked: f2 is the one told, alone, as a file is
    batches = [int(line.split()[2]) for line in err.splitlines()
               if line.startswith("checked with ")]
    assert batches[0] == 6 and batches[-1] == 1 and len(batches) >= 3, err
    grown = len(batches) - 1  # (lines appended before the read that failed alone)
    assert (code, report["files_loaded"], report["rows_loaded"]) == (1, 5, 10)
    assert _errors(report) == [
        f"{files[2]}: changed while being read ({13 + 8 * grown} bytes, now "
        f"{13 + 8 * (grown + 1)}); nothing of it was loaded: run again once it is stable"]
    assert target.count() == 10

    code, report, _ = target.load(pattern)  # stable now: f2 alone, whole, once
    assert (code, report["files_loaded"], report["files_skipped"], report["rows_loaded"]) == (
        0, 1, 5, 2 + len(batches))
    assert target.count() == 12 + len(batches)


def _load_two(target: Target, tmp_path: Path) -> str:
    _write(tmp_path / "a.csv", "id,v\n1,a\n2,b\n")
    _write(tmp_path / "b.csv", "id,v\n3,c\n")
    pattern = str(tmp_path / "*.csv")
    assert target.load(pattern)[0] == 0 and target.count() == 3
    return pattern


def test_a_dropped_table_is_loaded_again(target: Target, tmp_path: Path) -> None:
    pattern = _load_two(target, tmp_path)
    target.sql(f"DROP TABLE {target.table}")
    code, report, _ = target.load(pattern)
    assert (code, report["files_loaded"], report["rows_loaded"]) == (0, 2, 3)
    assert report["table_reset"] == ("table was dropped since the last load: loading all "
                                     "files again")
    assert target.count() == 3
    code, report, _ = target.load(pattern)
    assert (code, report["files_skipped"], report["table_reset"]) == (0, 2, "")


def test_a_truncated_table_is_loaded_again_one_still_holding_rows_never(
        target: Target, tmp_path: Path) -> None:
    pattern = _load_two(target, tmp_path)
    target.sql(f"ALTER TABLE {target.table} ADD COLUMN note String DEFAULT ''")
    code, report, _ = target.load(pattern)  # altered, rows still there: nothing to do
    assert (code, report["files_skipped"], report["table_reset"]) == (0, 2, "")
    target.sql(f"TRUNCATE TABLE {target.table}")
    code, report, _ = target.load(pattern)
    assert (code, report["files_loaded"], report["rows_loaded"]) == (0, 2, 3)
    assert "holds no rows" in report["table_reset"]
    assert target.count() == 3


def test_a_table_renamed_away_and_created_again_is_loaded_again(
        target: Target, tmp_path: Path) -> None:
    pattern = _load_two(target, tmp_path)
    old = f"{target.table}_old"
    target.sql(f"RENAME TABLE {target.table} TO {old}")
    target.sql(f"CREATE TABLE {target.table} AS {old}")
    if target.kind == "embedded":  # with its own rows: told apart by its uuid
        target.sql(f"INSERT INTO {target.table} VALUES (100, 'other')")
    code, report, _ = target.load(pattern)
    assert (code, report["files_loaded"], report["rows_loaded"]) == (0, 2, 3)
    assert report["table_reset"]
    assert (target.count(), target.count(old)) == (3 + (target.kind == "embedded"), 3)
    code, report, _ = target.load(pattern)
    assert (code, report["files_skipped"]) == (0, 2)


def _in_one_process(target: Target, *statements: str) -> None:
    if target.server is not None:
        for statement in statements:
            target.sql(statement)
        return
    t = open_target(TargetSpec.resolve(target.where, {}))
    try:
        for statement in statements:
            t.command(statement)
    finally:
        t.close()


def test_a_ledger_from_before_table_uuids_gets_the_column(target: Target,
                                                         tmp_path: Path) -> None:
    pattern = _load_two(target, tmp_path)
    # (nor the summary's view, which reads it: both in one process, as a process that
    # opens the target makes what its ledger lacks)
    _in_one_process(target, "DROP TABLE chload.units_feed",
                    "ALTER TABLE chload.files DROP COLUMN table_uuid")
    code, report, _ = target.load(pattern)
    assert (code, report["files_skipped"]) == (0, 2)
    assert target.sql("SELECT count() FROM system.columns WHERE database = 'chload' AND "
                      "table = 'files' AND name = 'table_uuid'") == "1"
