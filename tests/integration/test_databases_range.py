"""Dates and times a target's column type cannot hold, from real PostgreSQL 15 and
MariaDB 10.11, into an 18.16 server and embedded chDB (chload/sources/db_range.py).

Each was changed silently before: 18.16 stored a DateTime of 1960 as 1970-01-01
07:08:09 and a Date of 2120 as 0000-00-00; chDB read a DateTime of 1960 as 1970-01-01
and a MariaDB datetime of year 0000 as the current year; a nullable MariaDB zero date
was NULL without --schema saying so; PostgreSQL's infinity failed with the engine's
"Cannot read DateTime: unexpected word", naming no column. Now the run stops with one
line naming the table, the column, the value, the type's range on that target and the
--schema that loads it (which then loads every value exactly), and with --max-errors
such a row goes to chload.rejects. Small tables: the file runs in about a minute."""

from __future__ import annotations

import pytest
import services
from conftest import DATABASE_PASSWORD, run_chload
from test_databases import Source
from test_databases_untidy import _ch, _load, _refused, _suggested, my, pg  # noqa: F401

# ruff: noqa: F811 (pg and my are test_databases_untidy's fixtures, taken by the tests)

pytestmark = pytest.mark.integration


@pytest.fixture
def server(clickhouse: services.Service) -> tuple[str, dict[str, str]]:
    return (f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default",
            {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]})


def _count(target: str, table: str, env: dict[str, str] | None = None) -> int:
    found = _ch(target, f"SELECT count() FROM {table}", env)
    return int(found[0])


def test_postgres_times_18_16_cannot_hold_stop_the_run_naming_the_value(
        pg: Source, table_name: str, server: tuple[str, dict[str, str]]) -> None:
    """timestamp(0) maps to the server's DateTime, a date to the Date --schema names:
    both hold 1970 to 2105 only on 18.16. Both columns' values are named in one line,
    before any range loads."""
    target, env = server
    pg.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, t timestamp(0), d date); "
           f"INSERT INTO {table_name} VALUES (1, '2020-01-02 03:04:05', '2020-01-02'), "
           "(2, '1960-05-06 07:08:09', '2020-01-02'), (3, NULL, '2120-05-06')")
    schema = "id Int32, t Nullable(DateTime('UTC')), d Nullable(Date)"
    line = _refused(pg, table_name, target, "--workers", "1", "--schema", schema, env=env)
    assert len(line.splitlines()) == 1, line
    assert f"public.{table_name}: column t holds '1960-05-06 07:08:09', which " \
           "DateTime('UTC') cannot hold on ClickHouse 18.16" in line, line
    assert "(it holds 1970-01-01 00:00:00 to 2105-12-31 23:59:59)" in line
    assert _count(target, table_name, env) == 0  # (was 3: 1960 as 1970-01-01 07:08:09)
    assert "column d holds '2120-05-06', which Date cannot hold on ClickHouse 18.16" in line
    assert "(it holds 1970-01-01 to 2105-12-31)" in line, line  # (one line names both)
    assert _suggested(line) == "id Int32, t Nullable(String), d Nullable(String)"
    _load(pg, table_name, target, "--schema", _suggested(line), env=env,
          into=f"{table_name}_t")
    assert _ch(target, f"SELECT id, t, d FROM {table_name}_t ORDER BY id", env) == [
        "1\t2020-01-02 03:04:05\t2020-01-02", "2\t1960-05-06 07:08:09\t2020-01-02",
        "3\t\\N\t2120-05-06"]


@pytest.mark.parametrize("reader", ["native", "client"])
def test_mariadb_datetimes_18_16_cannot_hold_are_refused_or_rejected(
        my: Source, table_name: str, server: tuple[str, dict[str, str]], reader: str
        ) -> None:
    """A datetime maps to the server's DateTime; with --max-errors the row is kept in
    chload.rejects, its value readable there."""
    target, env = server
    env = {**env, "CHLOAD_MYSQL_READER": reader if reader == "client" else ""}
    my.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, t datetime NOT NULL); "
           f"INSERT INTO {table_name} VALUES (1, '2020-01-02 03:04:05'), "
           "(2, '1960-05-06 07:08:09'), (3, '2222-01-01 00:00:00')")
    line = _refused(my, table_name, target, "--workers", "1", env=env)
    assert f"/{table_name}: column t holds '1960-05-06 07:08:09', which DateTime('UTC') " \
           "cannot hold on ClickHouse 18.16" in line, line  # (found before any range)
    assert _suggested(line) == "id Int32, t String"
    assert _count(target, table_name, env) == 0
    report = _load(my, table_name, target, "--max-errors", "5", env=env,
                   into=f"{table_name}_b")
    assert (report["rows_loaded"], report["rows_rejected"]) == (1, 2)
    assert _ch(target, f"SELECT id, t FROM {table_name}_b", env) == ["1\t2020-01-02 03:04:05"]
    raw = _ch(target, "SELECT raw FROM chload.rejects WHERE target_table = "
                      f"'default.{table_name}_b' ORDER BY raw", env)
    assert raw == ["2\\tout of range: 1960-05-06 07:08:09",
                   "3\\tout of range: 2222-01-01 00:00:00"], raw


def test_postgres_infinity_names_the_column_and_the_value(pg: Source, table_name: str,
                                                          target_dir: str) -> None:
    """chDB's DateTime64 and Date32 hold 0001 to 9999: infinity (and BC, and 10000) failed
    with "Cannot read DateTime: unexpected word (at row 1)"."""
    pg.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, t timestamptz, d date); "
           f"INSERT INTO {table_name} VALUES (1, '2020-01-02 03:04:05+02', '1960-01-02'), "
           "(2, 'infinity', '2020-01-02'), (3, '2020-01-02', '-infinity'), "
           "(4, '2020-01-02', '0044-03-15 BC')")
    line = _refused(pg, table_name, target_dir, "--workers", "1")
    assert "column t holds 'infinity', which DateTime64(6, 'UTC') cannot hold on chDB (it " \
           "holds 0001-01-01 00:00:00.000000 to 9999-12-31 23:59:59.999999)" in line, line
    report = _load(pg, table_name, target_dir, "--max-errors", "5")
    assert (report["rows_loaded"], report["rows_rejected"]) == (1, 3)
    assert _ch(target_dir, f"SELECT id, t, d FROM {table_name}") == [
        "1\t2020-01-02 01:04:05.000000\t1960-01-02"]
    raw = _ch(target_dir, "SELECT raw FROM chload.rejects ORDER BY raw")
    assert [r.split("\\t")[1:] for r in raw] == [
        ["out of range: infinity", "2020-01-02"],
        ["2020-01-02 00:00:00", "out of range: -infinity"],
        ["2020-01-02 00:00:00", "out of range: 0044-03-15 BC"]], raw


def test_a_narrower_schema_on_embedded_is_refused_then_the_wider_loads(
        db_kind: str, request: pytest.FixtureRequest, table_name: str, target_dir: str
        ) -> None:
    """--schema DateTime on chDB: 1960 was read as 1970-01-01 00:00:00, silently."""
    db = Source(db_kind, request.getfixturevalue(
        "postgres" if db_kind == "postgresql" else "mariadb"))
    typ = "timestamp(0)" if db_kind == "postgresql" else "datetime"
    db.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, t {typ} NOT NULL); "
           f"INSERT INTO {table_name} VALUES (1, '1960-05-06 07:08:09'), "
           "(2, '2020-01-02 03:04:05')")
    line = _refused(db, table_name, target_dir, "--schema", "id Int32, t DateTime('UTC')")
    assert "column t holds '1960-05-06 07:08:09', which DateTime('UTC') cannot hold on " \
           "chDB (it holds 1970-01-01 00:00:00 to 2106-02-07 06:28:15)" in line, line
    schema = _suggested(line)
    assert schema == "id Int32, t DateTime64(0, 'UTC')"
    _load(db, table_name, f"{target_dir}-wide", "--schema", schema)
    assert _ch(f"{target_dir}-wide", f"SELECT toString(t) FROM {table_name} ORDER BY id") == [
        "1960-05-06 07:08:09", "2020-01-02 03:04:05"]


@pytest.fixture(params=["postgresql", "mysql"])
def db_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_mariadb_year_0000_is_refused_as_datetime_and_kept_as_date(
        my: Source, table_name: str, target_dir: str) -> None:
    """MariaDB keeps datetimes of year 0000 (month and day not zero): chDB's DateTime64
    read '0000-01-01 00:00:00' as the current year's January 1st, silently. Its Date32
    holds 0000-01-01 as it is."""
    my.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, t datetime NULL, d date NULL); "
           f"INSERT INTO {table_name} VALUES (1, '0000-01-01 00:00:00', '0000-01-01'), "
           "(2, '0001-01-01 00:00:00', '9999-12-31')")
    line = _refused(my, table_name, target_dir)
    assert "column t holds '0000-01-01 00:00:00', which DateTime64(0, 'UTC') cannot hold " \
           "on chDB (it holds 0001-01-01 00:00:00 to 9999-12-31 23:59:59)" in line, line
    again = _refused(my, table_name, target_dir, "--schema", _suggested(line))
    assert "column t holds '0000-01-01 00:00:00'" in again  # the table keeps its type
    text = f"{target_dir}-text"
    _load(my, table_name, text, "--schema", _suggested(line))
    assert _ch(text, f"SELECT t, toString(d) FROM {table_name} ORDER BY id") == [
        "0000-01-01 00:00:00\t0000-01-01", "0001-01-01 00:00:00\t9999-12-31"]


def test_a_nullable_mariadb_zero_date_stops_the_run_without_a_schema(
        my: Source, table_name: str, target_dir: str) -> None:
    """A nullable column's zero dates were loaded as NULL unless --schema said
    otherwise: now only a --schema typing it Nullable makes them NULL."""
    my.sql(f"SET SESSION sql_mode = ''; CREATE TABLE {table_name} (id int PRIMARY KEY, "
           f"dt datetime NULL); INSERT INTO {table_name} VALUES (1, '0000-00-00 00:00:00'), "
           "(2, NULL)")
    line = _refused(my, table_name, target_dir)
    assert "column dt holds the zero date '0000-00-00 00:00:00'" in line, line
    _load(my, table_name, f"{target_dir}-null", "--schema", _suggested(line))
    assert _ch(f"{target_dir}-null", f"SELECT id, dt FROM {table_name} ORDER BY id") == [
        "1\t\\N", "2\t\\N"]
    assert DATABASE_PASSWORD not in line


def test_times_the_target_holds_are_not_touched(pg: Source, my: Source, table_name: str,
                                                 server: tuple[str, dict[str, str]]) -> None:
    """The edges of 18.16's range load as they are (1970-01-01 00:00:00 is its 0)."""
    target, env = server
    for db, typ in ((pg, "timestamp(0)"), (my, "datetime")):
        table = f"{table_name}_{db.kind[:2]}"
        db.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, t {typ} NOT NULL); "
               f"INSERT INTO {table} VALUES (1, '1970-01-01 00:00:00'), "
               "(2, '2105-12-31 23:59:59'), (3, '2020-02-29 12:00:00')")
        done = run_chload("load", db.url(table), "--table", table, "--target", target,
                          env={**db.env, **env})
        assert done.returncode == 0, done.stderr
        assert _ch(target, f"SELECT id, toUInt32(t) FROM {table} ORDER BY id", env) == [
            "1\t0", "2\t4291747199", "3\t1582977600"]


def test_postgres_numeric_scales_clickhouse_lacks_and_wide_decimals_into_18_16(
        pg: Source, table_name: str, target_dir: str, server: tuple[str, dict[str, str]]
        ) -> None:
    """numeric(2,5) and numeric(3,-2) (PostgreSQL 15) made a Decimal ClickHouse refused
    at the CREATE, or were refused; numeric(50,2) into 18.16 (Decimal: 38 digits) was
    the server's bare "Wrong precision"."""
    pg.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, small numeric(2,5), "
           f"round numeric(3,-2)); INSERT INTO {table_name} VALUES (1, 0.00012, 12345), "
           "(2, -0.00099, -99900)")
    _load(pg, table_name, target_dir)
    assert _ch(target_dir, f"SELECT small, round, toTypeName(small), toTypeName(round) "
                           f"FROM {table_name} ORDER BY id") == [
        "0.00012\t12300\tNullable(Decimal(5, 5))\tNullable(Decimal(5, 0))",
        "-0.00099\t-99900\tNullable(Decimal(5, 5))\tNullable(Decimal(5, 0))"]
    wide = f"{table_name}_w"
    pg.sql(f"CREATE TABLE {wide} (id int PRIMARY KEY, n numeric(50,2)); "
           f"INSERT INTO {wide} VALUES (1, 123456789012345678901234567890123456789012.5)")
    target, env = server
    line = _refused(pg, wide, target, env=env)
    assert "column n has type Decimal(50, 2), which ClickHouse 18.16" in line, line
    assert "its Decimal holds 38 digits" in line and "--schema" in line
