"""The check of a database's rows to load (values no column type holds) runs beside the
ranges, and the first commit waits for it. Real PostgreSQL 15 and ClickHouse 18.16, the
real `chload` command: the check's query is held back by an advisory lock that only it
waits on (a view's function locks when the statement is the check's), so the test sees
the ranges read while the check has not answered, nothing committed meanwhile, and the
run's end once it answers."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import services
from conftest import DATABASE_PASSWORD
from streams import PG_BIN
from test_databases import Source
from test_databases_untidy import _ch, pg  # noqa: F401

# ruff: noqa: F811 (pg is test_databases_untidy's fixture, taken by the tests)

pytestmark = pytest.mark.integration

LOCK = 4242  # the advisory lock the check's statement waits on


@pytest.fixture
def server(clickhouse: services.Service) -> tuple[str, dict[str, str]]:
    return (f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default",
            {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]})


@pytest.fixture
def held(pg: Source) -> Iterator[subprocess.Popen[bytes]]:
    """A session holding the advisory lock LOCK until the test closes its stdin."""
    with _holding(pg) as proc:
        yield proc


@contextlib.contextmanager
def _holding(pg: Source) -> Iterator[subprocess.Popen[bytes]]:
    argv = [str(PG_BIN / "psql"), "-X", "-q", "-A", "-t", "-h", "127.0.0.1",
            "-p", pg.server.endpoint.rsplit(":", 1)[1], "-U", "loader", "-d", "shop"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PGPASSWORD": DATABASE_PASSWORD})
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"SELECT pg_advisory_lock({LOCK});\n\\echo locked\n".encode())
    proc.stdin.flush()
    while proc.stdout.readline().strip() != b"locked":
        pass
    try:
        yield proc
    finally:
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()
        proc.wait(timeout=30)


def _gated_view(pg: Source, table: str, rows: str, dated: bool = False) -> str:
    """A view of `table` whose rows, read by the check's statement (min and max of a
    column in a CASE), wait for LOCK; a range's read passes."""
    date = ", d date" if dated else ""
    pg.sql(f"""CREATE TABLE {table} (id int PRIMARY KEY, t timestamp(0), u timestamp(0){date});
        INSERT INTO {table} {rows};
        CREATE FUNCTION {table}_gate() RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN
          IF current_query() LIKE '%CASE WHEN min(%' THEN
            PERFORM pg_advisory_xact_lock_shared({LOCK}); END IF;
          RETURN true; END $$;
        CREATE VIEW {table}_v AS SELECT * FROM {table} WHERE {table}_gate()""")
    return f"{table}_v"


def _scans(pg: Source, table: str) -> int:
    return int(pg.sql(f"SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM "
                      f"pg_stat_user_tables WHERE relname = '{table}'").strip() or 0)


def _check_waiting(pg: Source) -> bool:
    return pg.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                  "AND query LIKE '%CASE WHEN min(%' AND query NOT LIKE '%pg_stat_activity%'"
                  ).strip() == "1"


def _start(pg: Source, view: str, target: str, env: dict[str, str], *args: str
           ) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "chload", "load", pg.url(view), "--table",
                             view, "--target", target, "--json", *args],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **pg.env, **env})


def _read_while_checking(pg: Source, table: str, before: int) -> None:
    """Within 60 s: the check waits on the lock, and the range has read `table` (its
    scan counted once its transaction ended) meanwhile."""
    deadline = time.monotonic() + 60
    while not (_check_waiting(pg) and _scans(pg, table) > before):
        assert time.monotonic() < deadline, "the range was not read while the check waited"
        time.sleep(0.2)


def test_the_ranges_are_read_while_the_check_runs_and_commit_after_it(
        pg: Source, table_name: str, server: tuple[str, dict[str, str]],
        held: subprocess.Popen[bytes]) -> None:
    """The check ran before any range was read: its whole scan was on the run's path."""
    target, env = server
    view = _gated_view(pg, table_name, "SELECT g, timestamp '2020-01-01' + g * interval "
                                       "'1 s', NULL FROM generate_series(1, 500) g")
    before = _scans(pg, table_name)
    run = _start(pg, view, target, env)
    try:
        _read_while_checking(pg, table_name, before)
        assert _ch(target, f"SELECT count() FROM {view}", env) == ["0"]  # none committed
        assert held.stdin is not None
        held.stdin.close()  # the check answers: nothing out of range
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 0, err
    assert _ch(target, f"SELECT count(), max(t) FROM {view}", env) == [
        "500\t2020-01-01 00:08:20"]


def test_a_range_failing_before_the_check_answers_gives_way_to_its_one_line(
        pg: Source, table_name: str, server: tuple[str, dict[str, str]],
        held: subprocess.Popen[bytes]) -> None:
    """The range meets 1960 (which 18.16's DateTime cannot hold) and fails while the
    check waits; the run ends in the check's one line, naming both columns, exit 2."""
    target, env = server
    view = _gated_view(pg, table_name, "SELECT g, timestamp '2020-01-01' + g * interval "
                                       "'1 s', timestamp '2020-01-01' FROM "
                                       "generate_series(1, 500) g")
    pg.sql(f"UPDATE {table_name} SET t = '1960-01-01' WHERE id = 3; "
           f"UPDATE {table_name} SET u = '1950-01-01' WHERE id = 400")
    before = _scans(pg, table_name)
    run = _start(pg, view, target, env)
    try:
        _read_while_checking(pg, table_name, before)
        assert held.stdin is not None
        held.stdin.close()
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    line = err.strip()
    assert run.returncode == 2 and len(line.splitlines()) == 1, err
    assert "column t holds '1960-01-01 00:00:00'" in line, line
    assert "column u holds '1950-01-01 00:00:00'" in line, line
    assert "loaded nothing into it" in line, line
    assert _ch(target, f"SELECT count() FROM {view}", env) == ["0"]
    assert "Traceback" not in err and DATABASE_PASSWORD not in err


def test_a_rerun_into_a_table_on_18_16_asks_nothing_before_its_ranges(
        pg: Source, table_name: str, server: tuple[str, dict[str, str]]) -> None:
    """A date column made the run ask, before any range, whether its values fit 18.16's
    Date (the table's type), also on a rerun into the table made by the first run."""
    target, env = server
    view = _gated_view(pg, table_name, "SELECT g, timestamp '2020-01-01', NULL, "
                                       "date '2020-01-01' + g FROM generate_series(1, 300) g",
                       dated=True)
    first = _start(pg, view, target, env, "--incremental-by", "id")
    assert first.communicate(timeout=120) and first.returncode == 0
    pg.sql(f"INSERT INTO {table_name} SELECT g, timestamp '2021-01-01', NULL, "
           "date '2021-01-01' + g FROM generate_series(301, 400) g")
    with _holding(pg) as locker:
        before = _scans(pg, table_name)
        run = _start(pg, view, target, env, "--incremental-by", "id")
        try:
            _read_while_checking(pg, table_name, before)
            assert _ch(target, f"SELECT count() FROM {view}", env) == ["300"]
            assert locker.stdin is not None
            locker.stdin.close()
            out, err = run.communicate(timeout=120)
        finally:
            run.kill()
    assert run.returncode == 0, err
    assert _ch(target, f"SELECT count(), max(d), toTypeName(any(d)) FROM {view}", env) == [
        "400\t2022-02-05\tNullable(Date)"]
