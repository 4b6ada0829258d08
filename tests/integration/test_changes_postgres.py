"""A PostgreSQL table followed (--follow): copied while a writer inserts, updates and
deletes, then its changes streamed, the loader killed -9 at random instants and run
again; at the end the current rows (FINAL, not deleted) equal the source, value for
value, and equal a plain copy of it (the stream and the copy print every type alike).
A column added at the source arrives; a dropped one stops the follow in one line. The
real `chload` against PostgreSQL 15, into embedded chDB and an 18.16 server.

CHLOAD_FULL_SIZE=1 runs the kill test at full size: a table of 200,000 rows copied while
the writer writes, then its changes for 60 s, the loader killed three times meanwhile
(docs/sources-changes.md).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import services
from conftest import run_chload
from test_databases import Source

pytestmark = pytest.mark.integration

FULL = os.environ.get("CHLOAD_FULL_SIZE") == "1"
BY_SQL = "CHLOAD_CHANGES_BY_SQL"  # =1: the follow reads by SQL, its fallback
ROWS = 200_000 if FULL else 20_000
WRITE_SECONDS = 60.0 if FULL else None  # the writer's time bound at full size (else a count)
SCHEMA = ("id Int64, amount Nullable(Decimal(14, 3)), at Nullable(String), u Nullable(UUID), "
          "doc Nullable(String), tags Array(Nullable(Int32)), raw Nullable(String), "
          "note Nullable(String), n Int32")
COLUMNS = "id, amount, at, u, doc, tags, hex(raw), note, n"  # (bytea: as hex)
CREATE = """CREATE TABLE {t} (id bigint PRIMARY KEY, amount numeric(14,3), at timestamptz,
    u uuid, doc jsonb, tags int[], raw bytea, note text, n int NOT NULL);
INSERT INTO {t} SELECT g, g * 1.125, timestamptz '2024-01-01 00:00:00.123456+02'
    + g * interval '1 second', md5(g::text)::uuid, jsonb_build_object('g', g, 's', 'a\tb'),
    CASE WHEN g % 3 = 0 THEN ARRAY[g, NULL, 2] ELSE '{{}}' END, decode(md5(g::text), 'hex'),
    CASE WHEN g % 5 = 0 THEN NULL ELSE E'tab\\there\\nline 😀 ' || g END, g % 7
    FROM generate_series(1, {rows}) g"""
# one transaction of the writer: an insert, an update, a delete, a key moved
WRITE = """BEGIN;
INSERT INTO {t} VALUES ({new}, {new} * 0.5, now(), gen_random_uuid(), '{{"w": [1, null]}}',
    ARRAY[NULL, {new}], '\\x00ff0a09', E'w\\t\\n😀 {new}', 1) ON CONFLICT DO NOTHING;
UPDATE {t} SET amount = amount + 1, note = E'upd\\t' || id, tags = ARRAY[NULL, 1], n = n + 1
    WHERE id % 997 = {k};
DELETE FROM {t} WHERE id = {gone};
UPDATE {t} SET id = id + 1000000 WHERE id = {moved};
COMMIT;"""


@pytest.fixture
def pg(postgres: services.Service) -> Source:
    return Source("postgresql", postgres)


@pytest.fixture(params=["embedded", "server"])
def into(request: pytest.FixtureRequest, target_dir: str) -> tuple[str, dict[str, str]]:
    if request.param == "embedded":
        return target_dir, {}
    server = request.getfixturevalue("clickhouse")  # (--schema: 18.16 has no DateTime64)
    return (f"http://loader@127.0.0.1:{server.ports['http']}/default",
            {"CLICKHOUSE_PASSWORD": server.credentials["password"]})


def _argv(pg: Source, source: str, table: str, into: tuple[str, dict[str, str]],
          *args: str, server_schema: str = "") -> list[str]:
    schema = ["--schema", server_schema or SCHEMA] if "://" in into[0] else []
    return [sys.executable, "-m", "chload", "load", pg.url(source), "--table", table,
            "--target", into[0], *schema, *args]


def _run(pg: Source, source: str, table: str, into: tuple[str, dict[str, str]],
         *args: str, server_schema: str = "", env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(pg, source, table, into, *args, server_schema=server_schema),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **pg.env, **into[1], **(env or {})})


def _follow_through(pg: Source, table: str, into: tuple[str, dict[str, str]], sql: str,
                    settle: float = 6, server_schema: str = "") -> None:
    """Follow `table`, run `sql` at the source once the follow is up, give it 3 s to
    stream, then stop it with SIGTERM: it must exit 0."""
    proc = subprocess.Popen(_argv(pg, table, table, into, "--follow",
                                  server_schema=server_schema),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **pg.env, **into[1]})
    time.sleep(settle)
    pg.sql(sql)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def _ch(into: tuple[str, dict[str, str]], sql: str) -> str:
    done = run_chload("sql", sql, "--target", into[0], "--format", "TSV", env=into[1],
                      timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _current(into: tuple[str, dict[str, str]], table: str) -> str:
    return _ch(into, f"SELECT {COLUMNS} FROM {table} FINAL WHERE NOT _is_deleted ORDER BY id")


class Writer:
    """Transactions at the source on a thread, a bounded number, until stopped."""

    def __init__(self, pg: Source, table: str, count: int,
                 seconds: float | None = None) -> None:
        self.pg, self.table, self.count, self.done = pg, table, count, 0
        self.deadline = time.monotonic() + seconds if seconds else None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rng = random.Random(7)
        for i in range(self.count):
            if self.stop.is_set() or (self.deadline and time.monotonic() > self.deadline):
                return
            self.pg.sql(WRITE.format(t=self.table, new=ROWS + 1 + i, k=rng.randrange(997),
                                     gone=rng.randrange(1, ROWS), moved=rng.randrange(1, ROWS)))
            self.done += 1

    def join(self) -> None:
        self.stop.set()
        self.thread.join(timeout=120)

    def finish(self) -> None:
        """Wait for the writer to end by itself (its count or its seconds)."""
        self.thread.join(timeout=(WRITE_SECONDS or 0) + 120)


def test_a_followed_table_killed_three_times_equals_the_source(
        pg: Source, into: tuple[str, dict[str, str]], table_name: str) -> None:
    pg.sql(CREATE.format(t=table_name, rows=ROWS))
    writer = Writer(pg, table_name, 10**7 if FULL else 400, WRITE_SECONDS)
    env = {**os.environ, **pg.env, **into[1]}
    rng = random.Random()
    try:
        for _ in range(3):  # killed -9 at a random instant: copying, streaming, committing
            proc = subprocess.Popen(_argv(pg, table_name, table_name, into, "--follow"),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            time.sleep(rng.uniform(5.0, 18.0) if FULL else rng.uniform(2.0, 8.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        if FULL:
            writer.finish()
    finally:
        writer.join()
    assert writer.done > 0
    done = _run(pg, table_name, table_name, into)  # without --follow: up to now, then exit
    assert done.returncode == 0, done.stderr
    copy = f"{table_name}_copy"
    done = _run(pg, table_name, copy, into)  # a plain copy of the source as it is now
    assert done.returncode == 0, done.stderr
    source = pg.sql(f"SELECT count(*), sum(id), sum(n) FROM {table_name}").strip()
    followed = _ch(into, f"SELECT count(), sum(id), sum(n) FROM {table_name} FINAL "
                         "WHERE NOT _is_deleted")
    assert followed == source
    assert _current(into, table_name) == _ch(into, f"SELECT {COLUMNS} FROM {copy} ORDER BY id")


def test_a_follow_without_follow_applies_changes_and_exits(
        pg: Source, target_dir: str, table_name: str) -> None:
    into = (target_dir, {})
    pg.sql(CREATE.format(t=table_name, rows=100))
    _follow_through(pg, table_name, into, WRITE.format(t=table_name, new=500, k=1, gone=5, moved=6))
    pg.sql(f"UPDATE {table_name} SET n = 100 WHERE id = 7; DELETE FROM {table_name} "
           "WHERE id = 8")
    done = _run(pg, table_name, table_name, into)
    assert done.returncode == 0, done.stderr
    assert _ch(into, f"SELECT n FROM {table_name} FINAL WHERE id = 7") == "100"
    assert _ch(into, f"SELECT count() FROM {table_name} FINAL WHERE id IN (5, 6, 8) AND "
                     "NOT _is_deleted") == "0"
    # a column added at the source arrives; a dropped one stops the follow in one line
    pg.sql(f"ALTER TABLE {table_name} ADD COLUMN extra text; UPDATE {table_name} "
           "SET extra = 'x' || id WHERE id = 9")
    done = _run(pg, table_name, table_name, into, "--on-new-column", "add")
    assert done.returncode == 0, done.stderr
    assert _ch(into, f"SELECT extra FROM {table_name} FINAL WHERE id = 9") == "x9"
    pg.sql(f"ALTER TABLE {table_name} DROP COLUMN note; UPDATE {table_name} SET n = 1")
    done = _run(pg, table_name, table_name, into, "--on-new-column", "add")
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1, done.stderr
    assert "column note was dropped or renamed at the source" in done.stderr


def test_following_a_table_without_a_primary_key_is_refused_in_one_line(
        pg: Source, target_dir: str, table_name: str) -> None:
    pg.sql(f"CREATE TABLE {table_name} (a int, b text)")
    done = _run(pg, table_name, table_name, (target_dir, {}), "--follow")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "--follow needs a primary key" in done.stderr


def test_sources_lists_a_follow_warns_above_the_limit_and_drops_its_slot(
        pg: Source, target_dir: str, table_name: str) -> None:
    into = (target_dir, {})
    pg.sql(CREATE.format(t=table_name, rows=10))
    _follow_through(pg, table_name, into, f"UPDATE {table_name} SET n = 5 WHERE id = 1", settle=5)
    pg.sql(f"UPDATE {table_name} SET n = 6 WHERE id = 2")
    done = _run(pg, table_name, table_name, into)  # (a unit of changes in the ledger)
    assert done.returncode == 0, done.stderr
    slots = "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'chload_%'"
    before = int(services.postgres_sql(pg.server, slots, admin=True).strip())
    listed = run_chload("sources", "--target", target_dir, env=pg.env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert f"default.{table_name}  postgresql://loader@" in listed.stdout
    assert "WAL retained" in listed.stdout and "warning" not in listed.stderr
    warned = run_chload("sources", "--target", target_dir, "--max-retained", "0.000000001",
                        env=pg.env, timeout=60)
    assert "warning: slot chload_" in warned.stderr and "bytes of WAL" in warned.stderr
    dropped = run_chload("sources", "--target", target_dir, "--drop", table_name,
                         env=pg.env, timeout=60)
    assert dropped.returncode == 0, dropped.stderr
    assert "dropped" in dropped.stdout
    assert int(services.postgres_sql(pg.server, slots, admin=True).strip()) == before - 1


TYPES = """CREATE TYPE {t}_mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE {t} (id int PRIMARY KEY, n5 numeric(5,0), n38 numeric(38,10), n76 numeric(76,20),
    r real, d double precision, b boolean, ts timestamp(3), tz timestamptz, day date,
    u uuid, j jsonb, ints int[], texts text[], raw bytea, t text, mood {t}_mood,
    big bigint)"""
VALUES = """INSERT INTO {t} VALUES ({id}, -99999, 1234567890123456789012345678.0123456789,
    -12345678901234567890123456789012345678901234567890123456.01234567890123456789,
    1.5, 2.718281828459045, true, '1969-07-20 20:17:40.123', '2024-02-29 23:59:59.999999-08',
    '1900-01-01', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{"k": [1, null, "t\\tn\\n😀"]}}',
    ARRAY[1, NULL, -3], ARRAY['a\tb', NULL, 'c\nd', '😀', ''], '\\x00010aff5c',
    E'tab\\there\\nnew\\\\line \\'q\\' 😀', 'happy', 9223372036854775807)"""

# what 18.16 stores them as: no Decimal past 38 digits, no Date before 1970, no DateTime64
TYPES_18 = ("id Int32, n5 Nullable(Decimal(5, 0)), n38 Nullable(Decimal(38, 10)), "
            "n76 Nullable(String), r Nullable(Float32), d Nullable(Float64), b Nullable(UInt8), "
            "ts Nullable(String), tz Nullable(String), day Nullable(String), u Nullable(UUID), "
            "j Nullable(String), ints Array(Nullable(Int32)), texts Array(Nullable(String)), "
            "raw Nullable(String), t Nullable(String), mood Nullable(String), "
            "big Nullable(Int64)")


def test_a_copied_row_and_a_streamed_row_hold_the_same_values(
        pg: Source, into: tuple[str, dict[str, str]], table_name: str) -> None:
    """The same values inserted before the follow (copied) and after (streamed)."""
    pg.sql(TYPES.format(t=table_name))
    pg.sql(VALUES.format(t=table_name, id=1))
    _follow_through(pg, table_name, into, VALUES.format(t=table_name, id=2), server_schema=TYPES_18)
    done = _run(pg, table_name, table_name, into, server_schema=TYPES_18)
    assert done.returncode == 0, done.stderr
    columns = ("n5, n38, n76, r, d, b, ts, tz, day, u, j, ints, texts, hex(raw), t, mood, big")
    rows = _ch(into, f"SELECT id, _version > 0, {columns} FROM {table_name} FINAL "
                     "ORDER BY id").splitlines()
    assert len(rows) == 2, rows
    copied, streamed = (r.split("\t", 2) for r in rows)
    assert copied[:2] == ["1", "0"] and streamed[:2] == ["2", "1"]
    assert copied[2] == streamed[2]
    assert "1234567890123456789012345678.0123456789" in copied[2]
    assert "😀" in copied[2] and "00010AFF5C" in copied[2]


@pytest.mark.parametrize("point, by", [
    ("changes-round", "stream"), ("before-attach", "stream"), ("after-attach", "stream"),
    ("changes-committed", "stream"), ("changes-round", "sql"), ("changes-committed", "sql")])
def test_a_kill_at_each_step_of_a_unit_neither_loses_nor_doubles_a_change(
        pg: Source, target_dir: str, table_name: str, point: str, by: str) -> None:
    """Killed before the unit loads, after its commit but before the slot moved, and
    inside the commit: the next run applies every change once (the changes streamed
    over a replication connection, or read by SQL, the fallback)."""
    into = (target_dir, {})
    env = {BY_SQL: "1"} if by == "sql" else {}
    pg.sql(CREATE.format(t=table_name, rows=50))
    _follow_through(pg, table_name, into, f"UPDATE {table_name} SET n = 0")
    for i in range(3):
        pg.sql(WRITE.format(t=table_name, new=1000 + i, k=i + 1, gone=10 + i, moved=20 + i))
    crashed = _run(pg, table_name, table_name, into, env={"CHLOAD_CRASH_AT": point, **env})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    done = _run(pg, table_name, table_name, into, env=env)
    assert done.returncode == 0, done.stderr
    source = pg.sql(f"SELECT count(*), sum(id), sum(n) FROM {table_name}").strip()
    assert _ch(into, f"SELECT count(), sum(id), sum(n) FROM {table_name} FINAL "
                     "WHERE NOT _is_deleted") == source
    versions = _ch(into, f"SELECT count(), uniqExact(id, _version) FROM {table_name} "
                         "WHERE _version > 0").split("\t")
    assert versions[0] == versions[1]  # no change applied twice


@pytest.mark.parametrize("by", ["stream", "sql"])
def test_units_read_ahead_of_overlapping_transactions_apply_each_change_once(
        pg: Source, target_dir: str, table_name: str, by: str) -> None:
    """Two writers whose transactions overlap (a change's position comes before another
    transaction's commit) while the follow streams the next unit as one loads (or, by
    SQL, reads it ahead): every change is applied once, none lost, none twice. Streamed,
    the follow holds a replication connection (pg_stat_replication shows it); by SQL,
    none."""
    into = (target_dir, {})
    env = {BY_SQL: "1"} if by == "sql" else {}
    pg.sql(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, n int NOT NULL); INSERT INTO "
           f"{table_name} SELECT g, 0 FROM generate_series(1, 200) g")
    proc = subprocess.Popen(_argv(pg, table_name, table_name, into, "--follow",
                                  server_schema="id Int64, n Int32"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **pg.env, **env})

    def write(first: int) -> None:
        for i in range(40):
            a, b = first + i % 50, first + (i * 7 + 3) % 50
            pg.sql(f"BEGIN; UPDATE {table_name} SET n = n + 1 WHERE id = {a}; SELECT "
                   f"pg_sleep(0.03); UPDATE {table_name} SET n = n + 1 WHERE id = {b}; "
                   f"INSERT INTO {table_name} VALUES ({1000 * first + i}, {i}); COMMIT")

    time.sleep(5)  # the copy
    senders = services.postgres_sql(pg.server, "SELECT count(*) FROM pg_stat_replication "
                                               "WHERE application_name = 'chload'", admin=True)
    assert int(senders.strip()) == (0 if env else 1)
    writers = [threading.Thread(target=write, args=(first,)) for first in (1, 101)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=120)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    done = _run(pg, table_name, table_name, into, env=env)  # the rest, up to now
    assert done.returncode == 0, done.stderr
    source = pg.sql(f"SELECT count(*), sum(id), sum(n) FROM {table_name}").strip()
    assert _ch(into, f"SELECT count(), sum(id), sum(n) FROM {table_name} FINAL "
                     "WHERE NOT _is_deleted") == source
    # the rows of the loaded units: each change once (a merge may have collapsed the
    # versions of a key in the table by now, so its rows are not counted there)
    units = _ch(into, "SELECT count(), sum(rows) FROM chload.files WHERE state = 'loaded' "
                      f"AND uri LIKE 'pgchanges://%.{table_name}/%'").split("\t")
    assert int(units[0]) >= 3 and units[1] == str(40 * 2 * 3)
