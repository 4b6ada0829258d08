"""A MariaDB table followed from its binlog: the copy taken while a writer inserts,
updates and deletes, then the changes, with the loader killed (SIGKILL) at random
instants and started again, ends with the table's current rows (`FINAL`, not deleted)
equal to the source's, column by column; a value copied and the same value streamed are
equal; a column added at the source arrives, one dropped stops the follow in one line;
a server without a ROW binlog is one line naming the setting. The real `chload` against
MariaDB 10.11, into embedded chDB and an 18.16 server.

CHLOAD_FULL_SIZE=1 runs the kill test at full size: a table of 200,000 rows copied while
the writer writes, then its changes for about 60 s, the loader killed three times
meanwhile (docs/sources-changes-mysql.md).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pymysql
import pytest
import services
from conftest import DATABASE_PASSWORD, run_chload

pytestmark = pytest.mark.integration

ENV = {"MYSQL_PWD": DATABASE_PASSWORD}
FULL = os.environ.get("CHLOAD_FULL_SIZE") == "1"
SEED_ROWS = 200_000 if FULL else 20_000  # the table when the first run copies it
WRITE_SECONDS = 60.0 if FULL else 25.0  # the writer's changes, through the copy and the kills
KILLS = 3


@pytest.fixture(params=["embedded", "server"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """Where the table goes: an embedded directory, or an 18.16 server (and its env)."""
    if request.param == "embedded":
        return str(tmp_path / "target"), {}
    server = request.getfixturevalue("clickhouse")
    return (f"http://loader@127.0.0.1:{server.ports['http']}/default",
            {"CLICKHOUSE_PASSWORD": server.credentials["password"]})


def _url(db: services.Service, table: str) -> str:
    return f"mysql://loader@{db.endpoint}/shop/{table}"


def _connect(db: services.Service) -> pymysql.connections.Connection:
    host, port = db.endpoint.split(":")
    return pymysql.connect(host=host, port=int(port), user="loader", password=DATABASE_PASSWORD,
                           database="shop", autocommit=True, charset="utf8mb4")


def _sql(db: services.Service, sql: str) -> list[tuple]:
    conn = _connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def _ch(target: tuple[str, dict[str, str]], sql: str) -> str:
    done = run_chload("sql", sql, "--target", target[0], "--format", "TSV", env=target[1])
    assert done.returncode == 0, done.stderr
    return done.stdout


def _follow(db: services.Service, table: str, target: tuple[str, dict[str, str]],
            *args: str) -> subprocess.Popen[str]:
    import os

    return subprocess.Popen([sys.executable, "-m", "chload", "load", _url(db, table), "--table",
                             table, "--target", target[0], "--follow", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV, **target[1]})


def _catch_up(db: services.Service, table: str, target: tuple[str, dict[str, str]]) -> str:
    """A run without --follow: the changes up to the binlog's position at its start."""
    done = run_chload("load", _url(db, table), "--table", table, "--target", target[0],
                      env={**ENV, **target[1]}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert DATABASE_PASSWORD not in done.stdout + done.stderr
    return done.stdout


def _stopped(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    return out


def _started(db: services.Service, table: str, target: tuple[str, dict[str, str]]) -> str:
    """The first run: --follow for a while (the copy, then changes), then SIGTERM."""
    proc = _follow(db, table, target)
    time.sleep(6)
    assert proc.poll() is None, proc.communicate()
    return _stopped(proc)


# --------------------------------------------------------------------------- current rows

SOURCE_ROWS = ("SELECT id, qty, CAST(price * 100 AS SIGNED), note, "
               "DATE_FORMAT(ts, '%Y-%m-%d %H:%i:%s.%f') FROM {t} ORDER BY id")
TARGET_ROWS = ("SELECT id, qty, toInt64(price * 100), note, toString(ts) FROM {t} FINAL "
               "WHERE NOT _is_deleted ORDER BY id FORMAT TSV")


def _source_rows(db: services.Service, table: str) -> list[tuple[str, ...]]:
    return [tuple(str(v) for v in r) for r in _sql(db, SOURCE_ROWS.format(t=table))]


def _target_rows(target: tuple[str, dict[str, str]], table: str) -> list[tuple[str, ...]]:
    text = _ch(target, TARGET_ROWS.format(t=table))
    return [tuple(_unescaped(f) for f in line.split("\t")) for line in text.splitlines()]


def _unescaped(field: str) -> str:
    """A TSV field as the value it escapes (a tab, a newline, a backslash)."""
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n"}.get(m.group(1), m.group(1)),
                  field)


def _orders(db: services.Service, table: str) -> None:
    _sql(db, f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, qty INT NOT NULL, "
             "price DECIMAL(12,2) NOT NULL, note VARCHAR(100) NOT NULL, ts DATETIME(6) NOT NULL)"
             " CHARSET utf8mb4")
    conn = _connect(db)
    try:
        with conn.cursor() as cur:
            for lo in range(0, SEED_ROWS, 5000):
                cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s)",
                                [(i, i % 97, f"{i % 1000}.{i % 100:02d}", f"n{i}",
                                  f"2024-01-01 00:00:00.{i % 1000000:06d}")
                                 for i in range(lo + 1, lo + 5001)])
    finally:
        conn.close()


def _writer(db: services.Service, table: str, stop: threading.Event, seed: int) -> int:
    """Insert, update (some keys moved) and delete at random until stopped; changes made."""
    rnd = random.Random(seed)
    conn = _connect(db)
    done, top = 0, SEED_ROWS
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                pick = rnd.random()
                key = rnd.randint(1, top)
                cur.execute("BEGIN")
                if pick < 0.4:
                    top += 1
                    cur.execute(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, "
                                "NOW(6))", (top, rnd.randint(0, 9), "1.25", f"new\t{top}\n😀"))
                elif pick < 0.75:
                    cur.execute(f"UPDATE {table} SET qty = qty + 1, note = CONCAT(note, 'u') "
                                "WHERE id BETWEEN %s AND %s", (key, key + 3))
                elif pick < 0.8:
                    top += 1
                    cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (top, key))
                else:
                    cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                cur.execute("COMMIT")
                done += 1
                time.sleep(0.002)
    finally:
        conn.close()
    return done


def test_copy_changes_and_kills_end_with_the_source_rows(
        mariadb: services.Service, target: tuple[str, dict[str, str]], table_name: str) -> None:
    _orders(mariadb, table_name)
    stop = threading.Event()
    made: list[int] = []
    writer = threading.Thread(target=lambda: made.append(
        _writer(mariadb, table_name, stop, 7)))
    writer.start()
    rnd = random.Random(11)
    try:
        time.sleep(0.5)  # the copy is taken while the writer writes
        for _ in range(KILLS):
            proc = _follow(mariadb, table_name, target, "--batch-rows", "500")
            time.sleep(rnd.uniform(5.0, 15.0) if FULL else rnd.uniform(2.0, 7.0))
            assert proc.poll() is None, proc.communicate()
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=60) == -signal.SIGKILL
        proc = _follow(mariadb, table_name, target, "--batch-rows", "500")
        time.sleep(WRITE_SECONDS / 3)
        assert proc.poll() is None, proc.communicate()
    finally:
        stop.set()
        writer.join(timeout=60)
    _stopped(proc)
    assert made and made[0] > 100, made
    _catch_up(mariadb, table_name, target)
    source = _source_rows(mariadb, table_name)
    assert len(source) > SEED_ROWS // 2
    assert _target_rows(target, table_name) == source
    versions = _ch(target, f"SELECT count(), countIf(_version > 0), countIf(_is_deleted) "
                           f"FROM {table_name} FORMAT TSV").split()
    assert int(versions[1]) > 0 and int(versions[2]) > 0, versions  # changes, deletes applied


@pytest.mark.parametrize("point", ["mysql-changes-copied", "before-attach", "after-attach"])
def test_a_kill_at_a_commits_edge_neither_loses_nor_doubles(
        mariadb: services.Service, tmp_path: Path, table_name: str, point: str) -> None:
    """Killed between the copy and the unit that ends it (the copy is taken again, the
    table truncated first), or inside a change unit's commit (the next run settles it)."""
    target = (str(tmp_path / "target"), {})
    _orders(mariadb, table_name)
    env = {**ENV, "CHLOAD_CRASH_AT": point}
    if point == "mysql-changes-copied":
        killed = run_chload("load", _url(mariadb, table_name), "--table", table_name,
                            "--target", target[0], "--follow", env=env)
    else:
        _started(mariadb, table_name, target)
    _sql(mariadb, f"DELETE FROM {table_name} WHERE id <= 100")
    _sql(mariadb, f"UPDATE {table_name} SET qty = qty + 1000 WHERE id BETWEEN 101 AND 300")
    _sql(mariadb, f"INSERT INTO {table_name} VALUES (99999, 1, 1.5, 'late', NOW(6))")
    if point == "mysql-changes-copied":
        _started(mariadb, table_name, target)
    else:
        killed = run_chload("load", _url(mariadb, table_name), "--table", table_name,
                            "--target", target[0], env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    _catch_up(mariadb, table_name, target)
    assert _target_rows(target, table_name) == _source_rows(mariadb, table_name)
    rows = _ch(target, f"SELECT count() FROM {table_name} FINAL WHERE NOT _is_deleted "
                       "FORMAT TSV")
    assert int(rows) == SEED_ROWS - 100 + 1, rows


def test_a_binlog_connection_cut_by_the_server_is_taken_again(
        mariadb: services.Service, tmp_path: Path, table_name: str) -> None:
    """The follow's binlog connection killed at the server (twice): it connects again from
    its last whole transaction and goes on, no change lost or doubled."""
    target = (str(tmp_path / "target"), {})
    _orders(mariadb, table_name)
    _started(mariadb, table_name, target)
    proc = _follow(mariadb, table_name, target, "--batch-seconds", "0.2")
    try:
        time.sleep(5)
        for cut in range(2):
            _sql(mariadb, f"UPDATE {table_name} SET qty = qty + 1 WHERE id <= 500")
            dumps: list[tuple] = []
            for _ in range(300):  # the follow's binlog connection (again), within 30 s
                dumps = _sql(mariadb, "SELECT ID FROM information_schema.PROCESSLIST WHERE "
                                      "COMMAND LIKE 'Binlog Dump%'")
                if dumps:
                    break
                time.sleep(0.1)
            assert dumps, _sql(mariadb, "SELECT ID, USER, COMMAND FROM "
                                        "information_schema.PROCESSLIST")
            for (thread,) in dumps:
                _sql(mariadb, f"KILL {thread}")
            _sql(mariadb, f"DELETE FROM {table_name} WHERE id BETWEEN {1000 + 10 * cut} AND "
                          f"{1009 + 10 * cut}")
            time.sleep(3)
        assert proc.poll() is None, proc.communicate()
    finally:
        _stopped(proc)
    _catch_up(mariadb, table_name, target)
    assert _target_rows(target, table_name) == _source_rows(mariadb, table_name)
    rows = _ch(target, f"SELECT count(), sum(qty) FROM {table_name} FINAL WHERE NOT "
                       "_is_deleted FORMAT TSV").split()
    assert int(rows[0]) == SEED_ROWS - 20, rows


TYPES = ("CREATE TABLE {t} (id INT PRIMARY KEY, d DECIMAL(30,10), ts DATETIME(6), "
         "u BIGINT UNSIGNED, j JSON, b BLOB, e ENUM('small','large'), s TEXT, n INT NULL) "
         "CHARSET utf8mb4")
VALUES = ("INSERT INTO {t} VALUES "
          "(1, 12345678901234567890.0123456789, '2024-02-29 23:59:59.999999', "
          "18446744073709551615, '{{\"a\": [1, 2.5, null], \"b\": \"\\\\u00e9\"}}', "
          "x'00FF090A5C', 'large', 'tab\\there\\nnewline 😀 \\\\ end', NULL), "
          "(2, -0.0000000001, '1970-01-01 00:00:00.000000', 0, '[]', '', 'small', '', 7), "
          "(3, 0, '2038-01-19 03:14:08.5', 9223372036854775808, '{{}}', NULL, NULL, NULL, NULL)")


def test_a_value_copied_and_streamed_is_the_same(
        mariadb: services.Service, target: tuple[str, dict[str, str]], table_name: str) -> None:
    _sql(mariadb, TYPES.format(t=table_name))
    _sql(mariadb, VALUES.format(t=table_name))
    _started(mariadb, table_name, target)  # rows 1-3 copied
    _sql(mariadb, f"INSERT INTO {table_name} SELECT id + 100, d, ts, u, j, b, e, s, n "
                  f"FROM {table_name}")
    _sql(mariadb, f"UPDATE {table_name} SET n = 1 WHERE id = 2")
    _sql(mariadb, f"UPDATE {table_name} SET n = 1 WHERE id = 102")
    _catch_up(mariadb, table_name, target)  # rows 101-103 streamed
    cols = "d, ts, u, j, hex(b), e, s, n"
    copied = _ch(target, f"SELECT {cols} FROM {table_name} FINAL WHERE id < 100 AND NOT "
                         "_is_deleted ORDER BY id FORMAT TSV")
    streamed = _ch(target, f"SELECT {cols} FROM {table_name} FINAL WHERE id > 100 AND NOT "
                           "_is_deleted ORDER BY id FORMAT TSV")
    assert copied == streamed and copied.count("\n") == 3, (copied, streamed)
    assert "18446744073709551615" in streamed and "😀" in streamed, streamed
    assert "12345678901234567890.0123456789" in streamed, streamed
    assert "2024-02-29 23:59:59.999999" in streamed, streamed
    hexed = _ch(target, f"SELECT hex(b) FROM {table_name} FINAL WHERE id = 101 FORMAT TSV")
    assert hexed.strip() == "00FF090A5C", hexed


def test_a_column_added_arrives_and_one_dropped_stops(
        mariadb: services.Service, tmp_path: Path, table_name: str) -> None:
    target = (str(tmp_path / "target"), {})
    _sql(mariadb, f"CREATE TABLE {table_name} (id INT PRIMARY KEY, a TEXT)")
    _sql(mariadb, f"INSERT INTO {table_name} VALUES (1, 'one')")
    _started(mariadb, table_name, target)
    _sql(mariadb, f"INSERT INTO {table_name} VALUES (2, 'two')")
    _sql(mariadb, f"ALTER TABLE {table_name} ADD COLUMN extra DECIMAL(8,2) NULL")
    _sql(mariadb, f"INSERT INTO {table_name} VALUES (3, 'three', 3.5)")
    _sql(mariadb, f"UPDATE {table_name} SET extra = 1.25 WHERE id = 1")
    _catch_up(mariadb, table_name, target)
    rows = _ch(target, f"SELECT id, a, extra FROM {table_name} FINAL WHERE NOT _is_deleted "
                       "ORDER BY id FORMAT TSV")
    assert rows.splitlines() == ["1\tone\t1.25", "2\ttwo\t\\N", "3\tthree\t3.5"], rows
    _sql(mariadb, f"INSERT INTO {table_name} VALUES (4, 'four', NULL)")
    _sql(mariadb, f"ALTER TABLE {table_name} DROP COLUMN a")
    _sql(mariadb, f"INSERT INTO {table_name} VALUES (5, NULL)")
    done = run_chload("load", _url(mariadb, table_name), "--table", table_name,
                      "--target", target[0], env=ENV)
    assert done.returncode != 0, done.stdout
    said = [line for line in (done.stdout + done.stderr).splitlines() if "DROP COLUMN" in line]
    assert len(said) == 1 and "new --table" in said[0], done.stdout + done.stderr
    rows = _ch(target, f"SELECT id FROM {table_name} FINAL WHERE NOT _is_deleted "
                       "ORDER BY id FORMAT TSV")
    assert rows.split() == ["1", "2", "3", "4"], rows  # up to the DROP, not past it


def test_a_server_without_a_row_binlog_is_one_line(services_dir: Path, tmp_path: Path,
                                                   table_name: str) -> None:
    server = services.start_mariadb(services_dir, password=DATABASE_PASSWORD,
                                    name="mariadb-statement", binlog_format="STATEMENT")
    try:
        _sql(server, f"CREATE TABLE {table_name} (id INT PRIMARY KEY)")
        done = run_chload("load", _url(server, table_name), "--table", table_name,
                          "--target", str(tmp_path / "t"), "--follow", env=ENV)
    finally:
        server.stop()
    assert done.returncode != 0
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "binlog_format=STATEMENT" in lines[0], lines
    assert "binlog_format=ROW" in lines[0], lines


def test_a_table_without_a_primary_key_is_refused_in_one_line(
        mariadb: services.Service, tmp_path: Path, table_name: str) -> None:
    _sql(mariadb, f"CREATE TABLE {table_name} (id INT, note TEXT)")
    done = run_chload("load", _url(mariadb, table_name), "--table", table_name,
                      "--target", str(tmp_path / "t"), "--follow", env=ENV)
    assert done.returncode != 0
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "no primary key" in lines[0], lines


def test_a_reader_that_cannot_be_built_is_a_note_and_the_changes_arrive(
        mariadb: services.Service, tmp_path: Path, table_name: str) -> None:
    target = (str(tmp_path / "t"), {})
    _sql(mariadb, f"CREATE TABLE {table_name} (id INT PRIMARY KEY, note TEXT)")
    _sql(mariadb, f"INSERT INTO {table_name} VALUES (1, 'a')")
    _started(mariadb, table_name, target)  # the copy
    _sql(mariadb, f"INSERT INTO {table_name} VALUES (2, 'b')")
    _sql(mariadb, f"UPDATE {table_name} SET note = 'c' WHERE id = 1")
    blocked = tmp_path / "cache-is-a-file"
    blocked.write_text("")  # (no compiled reader can be kept, nor found, under it)
    done = run_chload("load", _url(mariadb, table_name), "--table", table_name,
                      "--target", target[0], env={**ENV, "CHLOAD_CACHE": str(blocked)},
                      timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    notes = [line for line in done.stdout.splitlines() if "binlog read by the Python" in line]
    assert len(notes) == 1 and "native binlog reader" in notes[0], done.stdout
    rows = _ch(target, f"SELECT id, note FROM {table_name} FINAL WHERE NOT _is_deleted "
                       "ORDER BY id FORMAT TSV")
    assert rows == "1\tc\n2\tb\n", rows
