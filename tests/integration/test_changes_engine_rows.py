"""A streamed unit's rows made by the engine from wal2json's lines (engine_rows.py) and
through psql (CHLOAD_PG_CONVERT=psql): the same values as the copy's, every change
applied once through a kill, a TRUNCATE and an update that left a column out stopping
the follow in one line. The real `chload` against PostgreSQL 15, into embedded chDB;
the runs' time zone (PGTZ) is not UTC, so an instant printed in the replication
session's zone would show.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
import services
from test_changes_postgres import _ch, _follow_through, _run
from test_databases import Source

pytestmark = pytest.mark.integration

CONVERT = "CHLOAD_PG_CONVERT"
ZONE = {"PGTZ": "America/Los_Angeles"}
TYPES = """CREATE TABLE {t} (id int PRIMARY KEY, n5 numeric(5,0), n38 numeric(38,10),
    n76 numeric(76,20), r real, d double precision, b boolean, ts timestamp(3),
    tz timestamptz, day date, u uuid, raw bytea, t text, v varchar(12), c char(4),
    big bigint, small smallint)"""
VALUES = """INSERT INTO {t} VALUES ({id}, -99999, 1234567890123456789012345678.0123456789,
    -12345678901234567890123456789012345678901234567890123456.01234567890123456789,
    1.5e-7, 2.718281828459045, {b}, '1969-07-20 20:17:40.123', '2024-02-29 23:59:59.999999-08',
    '1900-01-01', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00010aff5c',
    E'tab\\there\\nnew\\\\line \\'q\\' "dq" \\\\N 😀', 'ünï', 'ab', 9223372036854775807,
    -32768), ({id} + 1, NULL, NULL, NULL, -0.0, 1e300, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL)"""
COLUMNS = "n5, n38, n76, r, d, b, ts, tz, day, u, hex(raw), t, v, c, big, small"
KEYED = """CREATE TABLE {t} (id bigint PRIMARY KEY, amount numeric(14,3), at timestamptz,
    note text, n int NOT NULL);
INSERT INTO {t} SELECT g, g * 1.125, timestamptz '2024-01-01 00:00:00.123456+02'
    + g * interval '1 second', CASE WHEN g % 5 = 0 THEN NULL ELSE E'tab\\t😀 ' || g END, g % 7
    FROM generate_series(1, {rows}) g"""
WRITE = """BEGIN;
INSERT INTO {t} VALUES ({new}, {new} * 0.5, now(), E'w\\t\\n😀 {new}', 1);
UPDATE {t} SET amount = amount + 1, note = E'upd\\t' || id, n = n + 1 WHERE id % 7 = {k};
DELETE FROM {t} WHERE id = {gone};
UPDATE {t} SET id = id + 1000000 WHERE id = {moved};
COMMIT;"""


@pytest.fixture
def pg(postgres: services.Service) -> Source:
    return Source("postgresql", postgres)


@pytest.fixture(autouse=True)
def _slots_dropped(pg: Source) -> Iterator[None]:
    """The replication slots this test's follows made, dropped after it: the server
    has 20 for every test of the session."""
    listed = "SELECT slot_name FROM pg_replication_slots"
    before = set(pg.sql(listed).split())
    yield
    for name in sorted(set(pg.sql(listed).split()) - before):
        pg.sql(f"SELECT pg_drop_replication_slot('{name}')")


@pytest.mark.parametrize("way", ["engine", "psql"])
def test_rows_the_engine_or_psql_makes_of_streamed_changes_equal_copied_ones(
        pg: Source, target_dir: str, table_name: str, way: str) -> None:
    """The same values inserted before the follow (copied) and after (streamed, made rows
    by the engine or through psql), NULLs too. (A NaN or infinite float is streamed as
    NULL: wal2json prints it so.)"""
    into = (target_dir, ZONE)
    env = {CONVERT: "psql"} if way == "psql" else {}
    pg.sql(TYPES.format(t=table_name))
    pg.sql(VALUES.format(t=table_name, id=1, b="true"))
    _follow_through(pg, table_name, into, "SELECT 1")
    pg.sql(VALUES.format(t=table_name, id=3, b="false"))
    pg.sql(f"UPDATE {table_name} SET b = true WHERE id = 3")
    done = _run(pg, table_name, table_name, into, env=env)
    assert done.returncode == 0, done.stderr
    rows = _ch(into, f"SELECT id, _version > 0, {COLUMNS} FROM {table_name} FINAL "
                     "WHERE NOT _is_deleted ORDER BY id").splitlines()
    assert [r.split("\t", 2)[:2] for r in rows] == [["1", "0"], ["2", "0"], ["3", "1"],
                                                   ["4", "1"]]
    assert rows[0].split("\t", 2)[2] == rows[2].split("\t", 2)[2]
    assert rows[1].split("\t", 2)[2] == rows[3].split("\t", 2)[2]
    assert "2024-03-01 07:59:59.999999" in rows[2] and "\\\\N" in rows[2]
    assert "\t1e300\t" in rows[3] and "1.5e-7" in rows[0]


@pytest.mark.parametrize("point", ["changes-round", "changes-committed"])
def test_a_kill_with_rows_made_by_the_engine_neither_loses_nor_doubles_a_change(
        pg: Source, target_dir: str, table_name: str, point: str) -> None:
    """Inserts, updates, deletes and keys moved, streamed and made rows by the engine,
    killed before the unit loads and after its commit: the next run applies every change
    once and the table equals the source."""
    into = (target_dir, ZONE)
    pg.sql(KEYED.format(t=table_name, rows=60))
    _follow_through(pg, table_name, into, f"UPDATE {table_name} SET n = 0")
    for i in range(3):
        pg.sql(WRITE.format(t=table_name, new=1000 + i, k=i + 1, gone=10 + i, moved=20 + i))
    crashed = _run(pg, table_name, table_name, into, env={"CHLOAD_CRASH_AT": point})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    done = _run(pg, table_name, table_name, into)
    assert done.returncode == 0, done.stderr
    ours = _ch(into, f"SELECT id, amount, at, note, n FROM {table_name} FINAL "
                     "WHERE NOT _is_deleted ORDER BY id")
    theirs = pg.sql("COPY (SELECT id, trim_scale(amount), (at AT TIME ZONE 'UTC')::"
                    f"timestamp(6), note, n FROM {table_name} ORDER BY id) TO STDOUT").strip()
    assert ours.replace("\\N", "").splitlines() == [
        _six(line) for line in theirs.replace("\\N", "").splitlines()]
    versions = _ch(into, f"SELECT count(), uniqExact(id, _version) FROM {table_name} "
                         "WHERE _version > 0").split("\t")
    assert int(versions[0]) > 9 and versions[0] == versions[1]  # no change applied twice


def _six(line: str) -> str:
    """A COPY line's timestamp with its 6 decimals, as DateTime64(6) prints it."""
    cells = line.split("\t")
    if "." not in cells[2]:
        cells[2] += ".000000"
    cells[2] = cells[2].ljust(26, "0")
    return "\t".join(cells)


@pytest.mark.parametrize("way", ["engine", "psql"])
def test_a_truncate_or_a_column_left_out_stops_in_one_line_with_nothing_applied(
        pg: Source, target_dir: str, table_name: str, way: str) -> None:
    """An update whose unchanged TOASTed value wal2json left out, and a TRUNCATE (of
    another table): each stops the run in one line naming what to do, nothing applied."""
    into = (target_dir, ZONE)
    env = {CONVERT: "psql"} if way == "psql" else {}
    pg.sql(KEYED.format(t=table_name, rows=5))
    pg.sql(f"UPDATE {table_name} SET note = (SELECT string_agg(md5(g::text), '') "
           "FROM generate_series(1, 400) g) WHERE id = 1")
    _copied(pg, table_name, into)
    pg.sql(f"UPDATE {table_name} SET n = 42 WHERE id = 1")
    stopped = _run(pg, table_name, table_name, into, env=env)
    assert stopped.returncode != 0
    assert "an update left a column out" in stopped.stderr, stopped.stderr
    assert "REPLICA IDENTITY FULL" in stopped.stderr.strip().splitlines()[-1]
    assert _ch(into, f"SELECT n FROM {table_name} FINAL WHERE id = 1") == "1"
    other = f"{table_name}_x"
    pg.sql(KEYED.format(t=other, rows=5))
    _copied(pg, other, into)
    pg.sql(f"TRUNCATE {other}")
    stopped = _run(pg, other, other, into, env=env)
    assert stopped.returncode != 0
    assert "was truncated at the source" in stopped.stderr.strip().splitlines()[-1], (
        stopped.stderr)
    assert _ch(into, f"SELECT count() FROM {other} FINAL WHERE NOT _is_deleted") == "5"


def _copied(pg: Source, table: str, into: tuple[str, dict[str, str]]) -> None:
    """`table` followed and copied whole (a copy the follow's SIGTERM cut short is
    finished by the next run)."""
    _follow_through(pg, table, into, "SELECT 1")
    done = _run(pg, table, table, into)
    assert done.returncode == 0, done.stderr
    assert _ch(into, f"SELECT count() FROM {table} FINAL WHERE NOT _is_deleted") == "5"
