"""The native binlog reader (mysql_binlog.c) and the Python one (mysql_rows.py) write the
same lines for the same binlog of a real MariaDB 10.11: every type the C reader reads,
NULLs, text to escape, latin1 text (the database's default here) turned into UTF-8,
values it leaves to Python (29 February, a zero date), an update
that moves the key, deletes, transactions cut into units; a table with a DOUBLE, an ENUM
and a latin1 column (its rows read by Python under the native reader, its text turned
into UTF-8) too.
"""

from __future__ import annotations

import os

import pymysql
import pytest
import services
from conftest import DATABASE_PASSWORD

from chload.sources.changes.mysql_binlog import BinlogReader, Layout
from chload.sources.changes.mysql_binlog_native import library

pytestmark = pytest.mark.integration

TYPES = ("id BIGINT PRIMARY KEY, t TINYINT, su SMALLINT UNSIGNED, m MEDIUMINT, "
         "mu MEDIUMINT UNSIGNED, iu INT UNSIGNED, bu BIGINT UNSIGNED, "
         "d DECIMAL(30,10), d0 DECIMAL(5,0), d2 DECIMAL(12,2), dt DATETIME(6), dt0 DATETIME, "
         "dt3 DATETIME(3), ts TIMESTAMP(2) NULL, day DATE, y YEAR, "
         "v VARCHAR(300) CHARACTER SET utf8mb4, "
         "c CHAR(10), tx TEXT, b BLOB")
ROWS = [
    "(1, -128, 65535, -8388608, 16777215, 4294967295, 18446744073709551615, "
    "-12345678901234567890.0123456789, -99999, 0.05, '2024-02-28 23:59:59.999999', "
    "'1000-01-01 00:00:00', '2026-11-29 18:30:01.5', '2038-01-19 03:14:07.99', "
    "'0999-12-31', 2155, 'tab\\there\\nnew\\\\line 😀', 'ç', 'text\\rcr €', X'00FF090A5C')",
    "(2, 0, 0, 0, 0, 0, 0, 0, 0, -0.01, '2024-02-29 12:00:00.000001', "
    "'2024-02-29 00:00:00', '2000-01-01 00:00:00', '1970-01-01 00:00:01', "
    "'0000-00-00', 0, '', '', '', '')",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL)",
]


def _sql(db: services.Service, *statements: str) -> None:
    host, port = db.endpoint.split(":")
    conn = pymysql.connect(host=host, port=int(port), user="loader",
                           password=DATABASE_PASSWORD, database="shop", autocommit=True,
                           charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")  # (a zero date)
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def _master(db: services.Service) -> tuple[str, int]:
    host, port = db.endpoint.split(":")
    conn = pymysql.connect(host=host, port=int(port), user="loader",
                           password=DATABASE_PASSWORD, database="shop")
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            log = cur.fetchone()
    finally:
        conn.close()
    return str(log[0]), int(log[1])


def _read(db: services.Service, at: tuple[str, int], table: str, names: list[str],
          native: bool) -> tuple[list[bytes], bool]:
    """The lines of every unit (units of 5 rows) from `at`, and whether C read rows."""
    host, port = db.endpoint.split(":")
    reader = BinlogReader({"host": host, "port": int(port), "user": "loader",
                           "passwd": DATABASE_PASSWORD}, at[0], at[1], "shop", table, False)
    if not native:  # nothing read yet: the socket is Python's again
        assert reader.native is not None
        reader.native.close()
        reader.native = None
    units: list[bytes] = []
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"native-{os.getpid()}.tsv")
    try:
        while True:
            with open(path, "wb") as out:
                cut = reader.unit(out, Layout(names, ["id"]), 5, 60.0, None, lambda: False)
            with open(path, "rb") as done:
                units.append(done.read())
            assert cut.rows == units[-1].count(b"\n")
            if cut.exhausted or cut.ddl:
                break
    finally:
        reader.close()
        os.remove(path)
    return units, reader._in_c


def test_the_native_reader_writes_the_python_readers_lines(
        mariadb: services.Service, table_name: str) -> None:
    if library()[0] is None:
        pytest.skip(f"no native binlog reader: {library()[1]}")
    other = f"{table_name}_other"
    _sql(mariadb, f"CREATE TABLE {table_name} ({TYPES})",
         f"CREATE TABLE {other} (id INT PRIMARY KEY, f DOUBLE, e ENUM('a', 'b'), "
         "l VARCHAR(20) CHARACTER SET latin1)")
    at = _master(mariadb)
    _sql(mariadb, f"INSERT INTO {table_name} VALUES {', '.join(ROWS)}",
         *[f"INSERT INTO {table_name} (id, v, d2, dt) VALUES ({i}, 'r{i}', {i}.25, "
           f"'2026-01-0{i % 9 + 1} 10:00:0{i % 10}.12345{i % 10}')" for i in range(10, 30)],
         "BEGIN", f"UPDATE {table_name} SET id = id + 100, v = 'moved' WHERE id < 3",
         f"UPDATE {table_name} SET tx = 'kept' WHERE id BETWEEN 10 AND 14",
         f"DELETE FROM {table_name} WHERE id BETWEEN 20 AND 24", "COMMIT",
         f"INSERT INTO {other} VALUES (1, 0.1, 'b', 'caf\u00e9'), (2, -1e300, NULL, '')",
         f"UPDATE {other} SET id = 3 WHERE id = 1")
    names = [c.split()[0] for c in TYPES.split(", ")]
    native, in_c = _read(mariadb, at, table_name, names, True)
    python, _ = _read(mariadb, at, table_name, names, False)
    assert in_c
    assert native == python, (native, python)
    lines = b"".join(native).splitlines()
    assert len(lines) == 3 + 20 + 2 * 2 + 5 + 5, lines  # a moved key: two lines
    assert b"-12345678901234567890.0123456789" in lines[0], lines[0]
    assert b"tab\\there\\nnew\\\\line \xf0\x9f\x98\x80" in lines[0], lines[0]
    assert b"2024-02-29 12:00:00.000001" in lines[1] and b"\t\\N\t" in lines[1], lines[1]
    assert lines[2].count(b"\\N") == len(names) - 1, lines[2]
    assert b"\t\xc3\xa7\ttext\\rcr \xe2\x82\xac\t" in lines[0], lines[0]  # latin1
    native, in_c = _read(mariadb, at, other, ["id", "f", "e", "l"], True)
    python, _ = _read(mariadb, at, other, ["id", "f", "e", "l"], False)
    assert not in_c and native == python, (native, python)
    assert b"1\t0.1\tb\tcaf\xc3\xa9\t" in b"".join(native), native
    assert len(b"".join(native).splitlines()) == 4, native
