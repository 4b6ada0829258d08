"""Database columns into ClickHouse 18.16 and embedded chDB where their types differ:
booleans, dates and times beside bytea and array columns (converted in the loader's
engine), dates whose values fit 18.16's Date, several columns no type of the target
holds, and values no type holds found before any range loads. Real PostgreSQL 15 and
MariaDB 10.11, the real `chload` command; values checked through SQL. Small tables."""

from __future__ import annotations

import shlex

import pytest
import services
from conftest import run_chload
from test_databases import Source
from test_databases_untidy import _ch, _load, _refused, db, my, pg  # noqa: F401

# ruff: noqa: F811 (pg, my and db are test_databases_untidy's fixtures, taken by the tests)

pytestmark = pytest.mark.integration


@pytest.fixture
def server(clickhouse: services.Service) -> tuple[str, dict[str, str]]:
    return (f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default",
            {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]})


def _schema_in(line: str) -> str:
    """The whole --schema a message suggests, as the shell would pass it."""
    rest = line.split("--schema: ", 1)[1] if "--schema: " in line else (
        line.split("e.g. --schema ", 1)[1])
    return shlex.split(rest)[0]


def _count(target: str, table: str, env: dict[str, str] | None = None) -> int:
    return int(_ch(target, f"SELECT count() FROM {table}", env)[0])


def test_postgres_bool_date_and_times_beside_bytea_and_arrays_load_into_18_16(
        pg: Source, table_name: str, target_dir: str,
        server: tuple[str, dict[str, str]]) -> None:
    """The bytea and array columns are converted in the loader's engine, whose spool
    named chDB's types (Bool, Date32, DateTime64) to the server: every range failed
    with "Unknown data type family: Bool", with and without --schema."""
    target, env = server
    pg.sql(f"""CREATE TABLE {table_name} (id int PRIMARY KEY, b boolean NOT NULL, d date,
        t timestamp(0), tz timestamptz, raw bytea, a int[]);
        INSERT INTO {table_name} SELECT g, g % 2 = 0, date '2020-01-01' + g,
        timestamp '2020-01-01' + g * interval '1 s',
        timestamptz '2020-01-01 00:00:00.25+00' + g * interval '1 s',
        decode(lpad(to_hex(g), 4, '0'), 'hex'), ARRAY[g, NULL] FROM generate_series(1, 300) g""")
    line = _refused(pg, table_name, target, env=env)
    assert len(line.splitlines()) == 1, line
    assert "column tz has type DateTime64(6, 'UTC')" in line, line
    schema = _schema_in(line)
    assert schema == ("id Int32, b UInt8, d Nullable(Date), t Nullable(DateTime('UTC')), "
                      "tz Nullable(String), raw Nullable(String), a Array(Nullable(Int32))")
    for workers in ("1", "3"):
        into = f"{table_name}_{workers}"
        report = _load(pg, table_name, target, "--schema", schema, "--workers", workers,
                       env=env, into=into)
        assert report["rows_loaded"] == 300, report
        assert _ch(target, f"SELECT id, b, d, t, tz, hex(raw), a FROM {into} WHERE id IN "
                           "(1, 300) ORDER BY id", env) == [
            "1\t0\t2020-01-02\t2020-01-01 00:00:01\t2020-01-01 00:00:01.25\t0001\t[1,NULL]",
            "300\t1\t2020-10-27\t2020-01-01 00:05:00\t2020-01-01 00:05:00.25\t012C\t[300,NULL]"]
    pg.sql(f"ALTER TABLE {table_name} DROP COLUMN tz")  # the rest loads without --schema
    assert _load(pg, table_name, target, env=env, into=f"{table_name}_n")["rows_loaded"] == 300
    assert _ch(target, f"SELECT toTypeName(b), toTypeName(d), sum(b), hex(any(raw)) "
                       f"FROM {table_name}_n WHERE id = 2 GROUP BY b, d", env) == [
        "UInt8\tNullable(Date)\t1\t0002"]
    _load(pg, table_name, target_dir)  # the embedded target keeps chDB's own types
    assert _ch(target_dir, f"SELECT toTypeName(b), toTypeName(d), b, hex(raw), a FROM "
                           f"{table_name} WHERE id = 2") == [
        "Bool\tNullable(Date32)\ttrue\t0002\t[2,NULL]"]


def test_a_date_column_is_date_on_18_16_where_every_value_fits(
        db: Source, table_name: str, server: tuple[str, dict[str, str]]) -> None:
    """18.16 has no Date32: a date column whose values all fit its Date (1970 to 2105,
    one query of the source's) is Date; one holding 1960 is refused naming it."""
    target, env = server
    db.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, d date, e date NOT NULL); "
           f"INSERT INTO {table_name} VALUES (1, '2020-01-02', '1970-01-01'), "
           "(2, NULL, '2105-12-31')")
    assert _load(db, table_name, target, env=env)["rows_loaded"] == 2
    assert _ch(target, f"SELECT id, d, toUInt16(e), e, toTypeName(d), toTypeName(e) FROM "
                       f"{table_name} ORDER BY id", env) == [  # (18.16 shows day 0 as
        "1\t2020-01-02\t0\t0000-00-00\tNullable(Date)\tDate",  # 0000-00-00)
        "2\t\\N\t49672\t2105-12-31\tNullable(Date)\tDate"]
    db.sql(f"INSERT INTO {table_name} VALUES (3, '1960-01-01', '2020-01-01')")
    line = _refused(db, table_name, target, env=env, into=f"{table_name}_b")
    assert "column d has type Date32, which ClickHouse 18.16" in line, line
    assert _schema_in(line) == "id Int32, d Nullable(String), e Date"
    _load(db, table_name, target, "--schema", _schema_in(line), env=env,
          into=f"{table_name}_b")
    assert _ch(target, f"SELECT d FROM {table_name}_b WHERE id = 3", env) == ["1960-01-01"]


def test_every_column_18_16_cannot_store_is_named_in_one_line(
        db: Source, table_name: str, server: tuple[str, dict[str, str]]) -> None:
    """Three columns took three runs: each refusal named only the first."""
    target, env = server
    wide = "numeric(50,2)" if db.kind == "postgresql" else "decimal(50,2)"
    time6 = "timestamp(6)" if db.kind == "postgresql" else "datetime(6)"
    db.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, t {time6}, d date, n {wide}, "
           f"ok int); INSERT INTO {table_name} VALUES (1, '2020-01-02 03:04:05.5', "
           "'1960-01-01', 12345678901234567890123456789012345678901234567.89, 7)")
    line = _refused(db, table_name, target, env=env)
    assert len(line.splitlines()) == 1, line
    for refused in ("t (Nullable(DateTime64(6, 'UTC')))", "d (Nullable(Date32))",
                    "n (Nullable(Decimal(50, 2)))"):
        assert refused in line, line
    schema = _schema_in(line)
    assert schema == ("id Int32, t Nullable(String), d Nullable(String), n Nullable(String), "
                      "ok Nullable(Int32)")
    _load(db, table_name, target, "--schema", schema, env=env)
    fraction = ".5" if db.kind == "postgresql" else ".500000"  # as each prints it
    assert _ch(target, f"SELECT t, d, n, ok FROM {table_name}", env) == [
        f"2020-01-02 03:04:05{fraction}\t1960-01-01\t"
        "12345678901234567890123456789012345678901234567.89\t7"]


def test_a_value_no_type_holds_stops_the_run_before_any_range_loads(
        pg: Source, table_name: str, target_dir: str) -> None:
    """A date 'infinity' failed its range after other ranges were committed (exit 1),
    and the --schema it suggested conflicted with the table created as Date32. Now one
    query finds every such value first: one line names each column, the --schema that
    loads them all and the (empty) table this run created."""
    pg.sql(f"""CREATE TABLE {table_name} (id int PRIMARY KEY, d date, tz timestamptz,
        raw bytea); INSERT INTO {table_name} SELECT g, date '2020-01-01' + g,
        timestamptz '2020-01-01 00:00:00+00', '\\x01' FROM generate_series(1, 400) g;
        UPDATE {table_name} SET d = 'infinity' WHERE id = 390;
        UPDATE {table_name} SET tz = '-infinity' WHERE id = 5""")
    done = run_chload("load", pg.url(table_name), "--table", table_name, "--target",
                      target_dir, "--workers", "4", env=pg.env)
    line = done.stderr.strip()
    assert done.returncode == 2 and len(line.splitlines()) == 1, done.stderr
    assert "column d holds 'infinity', which Date32 cannot hold on chDB" in line, line
    assert "column tz holds '-infinity', which DateTime64(6, 'UTC') cannot hold" in line
    assert f"this run created default.{table_name} and loaded nothing into it: drop it " \
           f"first (chload sql 'DROP TABLE default.{table_name}'" in line, line
    assert _count(target_dir, table_name) == 0  # (was 300: the other ranges committed)
    schema = _schema_in(line)
    assert schema == "id Int32, d Nullable(String), tz Nullable(String), raw Nullable(String)"
    _ch(target_dir, f"DROP TABLE default.{table_name}")
    assert _load(pg, table_name, target_dir, "--schema", schema,
                 "--workers", "4")["rows_loaded"] == 400
    assert _ch(target_dir, f"SELECT d, tz FROM {table_name} WHERE id IN (5, 390) "
                           "ORDER BY id") == ["2020-01-06\t-infinity",
                                              "infinity\t2020-01-01 00:00:00"]


def test_a_type_not_carried_suggests_a_schema_the_server_stores(
        pg: Source, table_name: str, server: tuple[str, dict[str, str]]) -> None:
    """An interval beside a bool, a timestamp holding 1960 and a bytea: the --schema the
    refusal gives is in 18.16's types (UInt8, String for 1960), and loads."""
    target, env = server
    pg.sql(f"""CREATE TABLE {table_name} (id int PRIMARY KEY, b boolean, t timestamp(0),
        span interval, raw bytea); INSERT INTO {table_name} VALUES
        (1, true, '1960-01-02 03:04:05', '1 day', '\\x0a'),
        (2, NULL, '2020-01-02 03:04:05', NULL, NULL)""")
    line = _refused(pg, table_name, target, env=env)
    assert "span (interval)" in line and "t holds '1960-01-02 03:04:05'" in line, line
    schema = _schema_in(line)
    assert schema == ("id Int32, b Nullable(UInt8), t Nullable(String), "
                      "span Nullable(String), raw Nullable(String)")
    assert _load(pg, table_name, target, "--schema", schema, env=env)["rows_loaded"] == 2
    assert _ch(target, f"SELECT id, b, t, span, hex(raw) FROM {table_name} ORDER BY id",
               env) == ["1\t1\t1960-01-02 03:04:05\t1 day\t0A",
                        "2\t\\N\t2020-01-02 03:04:05\t\\N\t\\N"]


def test_an_error_budget_keeps_rows_beside_a_bytea_column_in_rejects(
        pg: Source, table_name: str, target_dir: str,
        server: tuple[str, dict[str, str]]) -> None:
    """With --max-errors, a value out of range beside a bytea column failed the whole
    range in the loader's conversion ("Cannot parse date here: out of ran"): the
    conversion now passes such a value on as text, for the target to reject its row."""
    pg.sql(f"""CREATE TABLE {table_name} (id int PRIMARY KEY, d date, ok boolean,
        raw bytea); INSERT INTO {table_name} SELECT g, date '2020-01-01' + g, true,
        '\\x41' FROM generate_series(1, 100) g;
        UPDATE {table_name} SET d = 'infinity' WHERE id = 50""")
    server_target, env = server
    for target, target_env, schema in (
            (target_dir, None, ()),
            (server_target, env, ("--schema", "id Int32, d Nullable(Date), ok Nullable(UInt8), "
                                  "raw Nullable(String)"))):
        report = _load(pg, table_name, target, "--max-errors", "5", "--workers", "2",
                       *schema, env=target_env)
        assert (report["rows_loaded"], report["rows_rejected"]) == (99, 1), report
        assert _ch(target, f"SELECT count(), sum(ok), any(raw) FROM {table_name}",
                   target_env) == ["99\t99\tA"]
        assert _ch(target, "SELECT raw FROM chload.rejects WHERE target_table = "
                           f"'default.{table_name}'", target_env) == [
            "50\\tout of range: infinity\\t1\\tA"]


def test_a_mariadb_zero_date_and_a_time_out_of_range_stop_the_run_before_any_range(
        my: Source, table_name: str, server: tuple[str, dict[str, str]]) -> None:
    """A zero date in the last range failed it after the others were committed; now one
    query finds it, and one line names it with the time 18.16 cannot hold."""
    target, env = server
    my.sql(f"SET SESSION sql_mode = ''; CREATE TABLE {table_name} (id int PRIMARY KEY, "
           "d date NOT NULL, t datetime, raw blob); "
           f"INSERT INTO {table_name} SELECT seq, DATE '2020-01-01' + INTERVAL seq DAY, "
           f"NULL, x'00ff' FROM seq_1_to_300; UPDATE {table_name} SET d = '0000-00-00' "
           f"WHERE id = 290; UPDATE {table_name} SET t = '1960-01-01 00:00:00' WHERE id = 3")
    line = _refused(my, table_name, target, "--workers", "3", env=env)
    assert len(line.splitlines()) == 1, line
    assert "column t holds '1960-01-01 00:00:00', which DateTime('UTC') cannot hold" in line
    assert "column d holds the zero date '0000-00-00'" in line, line
    assert _count(target, table_name, env) == 0  # (was 200: the other ranges committed)
    schema = _schema_in(line)
    assert schema == "id Int32, d Nullable(Date), t Nullable(String), raw Nullable(String)"
    _ch(target, f"DROP TABLE default.{table_name}", env)
    report = _load(my, table_name, target, "--schema", schema, "--workers", "3", env=env)
    assert report["rows_loaded"] == 300
    assert _ch(target, f"SELECT id, d, t, hex(raw) FROM {table_name} WHERE id IN (3, 290) "
                       "ORDER BY id", env) == ["3\t2020-01-04\t1960-01-01 00:00:00\t00FF",
                                               "290\t\\N\t\\N\t00FF"]
