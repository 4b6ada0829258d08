"""PostgreSQL and MariaDB sources: whole tables in ranges of one snapshot,
exactly once across kill -9, incrementally; types carried unchanged; the password
nowhere. The real `chload` command against real PostgreSQL 15 and MariaDB 10.11, into
embedded chDB and an 18.16 server; results checked through SQL against the source's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import services
from conftest import DATABASE_PASSWORD, run_chload

pytestmark = pytest.mark.integration

ROWS = 200_000
ORDERS_PG = """CREATE TABLE {t} (id bigint PRIMARY KEY, qty int NOT NULL,
    price numeric(10,2) NOT NULL, created timestamp NOT NULL, note text, status text NOT NULL);
INSERT INTO {t} SELECT g, g % 1000, (g % 100000) / 100.0,
    timestamp '2020-01-01' + g * interval '1 second',
    CASE WHEN g % 7 = 0 THEN NULL ELSE 'note ' || g END,
    (ARRAY['new', 'paid', 'shipped'])[g % 3 + 1] FROM generate_series({lo}, {hi}) g"""
ORDERS_MY = """CREATE TABLE {t} (id bigint PRIMARY KEY, qty int NOT NULL,
    price decimal(10,2) NOT NULL, created datetime NOT NULL, note text NULL,
    status varchar(20) NOT NULL) ENGINE=InnoDB"""
INSERT_MY = """INSERT INTO {t} SELECT seq, seq % 1000, (seq % 100000) / 100.0,
    TIMESTAMP '2020-01-01 00:00:00' + INTERVAL seq SECOND,
    IF(seq % 7 = 0, NULL, CONCAT('note ', seq)), ELT(seq % 3 + 1, 'new', 'paid', 'shipped')
    FROM seq_{lo}_to_{hi}"""  # MariaDB's Sequence engine: a table of the integers lo..hi
# count, exact sum of the decimals, NULLs, min and max timestamp: the same on both sides
CHECK_CH = ("SELECT count(), toString(sum(price)), countIf(note IS NULL), "
            "toString(toDateTime(min(created))), toString(toDateTime(max(created))), sum(id) "
            "FROM {t}")
CHECK_SRC = "SELECT count(*), sum(price), count(*) - count(note), min(created), max(created), " \
            "sum(id) FROM {t}"


class Source:
    """One database under test: its URL for chload, SQL on it, a table of orders."""

    def __init__(self, kind: str, server: services.Service) -> None:
        self.kind, self.server = kind, server

    def url(self, table: str) -> str:
        if self.kind == "postgresql":
            return f"postgresql://loader@{self.server.endpoint}/shop/public.{table}"
        return f"mysql://loader@{self.server.endpoint}/shop/{table}"

    @property
    def env(self) -> dict[str, str]:
        name = "PGPASSWORD" if self.kind == "postgresql" else "MYSQL_PWD"
        return {name: DATABASE_PASSWORD}

    def sql(self, sql: str) -> str:
        if self.kind == "postgresql":
            return services.postgres_sql(self.server, sql).replace("|", "\t")
        return services.mariadb_sql(self.server, sql)

    def orders(self, table: str, lo: int = 1, hi: int = ROWS) -> None:
        if self.kind == "postgresql":
            self.sql(ORDERS_PG.format(t=table, lo=lo, hi=hi))
        else:
            self.sql(ORDERS_MY.format(t=table))
            self.add(table, lo, hi)

    def add(self, table: str, lo: int, hi: int) -> None:
        if self.kind == "postgresql":
            self.sql(ORDERS_PG.split(";", 1)[1].format(t=table, lo=lo, hi=hi))
        else:
            self.sql(INSERT_MY.format(t=table, lo=lo, hi=hi))

    def check(self, table: str) -> list[str]:
        fields = self.sql(CHECK_SRC.format(t=table)).strip().split("\t")
        fields[1] = fields[1].rstrip("0").rstrip(".") if "." in fields[1] else fields[1]
        return [f.split(".")[0] if i in (3, 4) else f for i, f in enumerate(fields)]


@pytest.fixture(params=["postgresql", "mysql"])
def source(request: pytest.FixtureRequest) -> Source:
    name = "postgres" if request.param == "postgresql" else "mariadb"
    return Source(request.param, request.getfixturevalue(name))


def _load(source: Source, table: str, target: str, *args: str,
          env: dict[str, str] | None = None) -> dict:
    done = run_chload("load", source.url(table), "--table", table, "--target", target,
                      "--json", *args, env={**source.env, **(env or {})})
    assert done.returncode == 0, done.stderr
    _no_password(done.stdout + done.stderr)
    return json.loads(done.stdout)


def _ch(target: str, sql: str) -> list[str]:
    done = run_chload("sql", sql, "--target", target, "--format", "TSV")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split("\t")


def _no_password(text: str) -> None:
    assert DATABASE_PASSWORD not in text


def _no_password_in(directory: str) -> None:
    """Not in any file of the target (data, metadata, ledger, the engine's logs)."""
    needle = DATABASE_PASSWORD.encode()
    for root, _dirs, names in os.walk(directory):
        for name in names:
            path = Path(root) / name
            if path.is_file():
                assert needle not in path.read_bytes(), path


def test_full_copy_equals_the_source_and_a_rerun_loads_nothing(
        source: Source, table_name: str, target_dir: str) -> None:
    source.orders(table_name)
    report = _load(source, table_name, target_dir, "--workers", "2")
    assert report["rows_loaded"] == ROWS and report["files_loaded"] >= 2
    assert _ch(target_dir, CHECK_CH.format(t=table_name)) == source.check(table_name)
    again = _load(source, table_name, target_dir)
    assert again["rows_loaded"] == 0 and again["files_total"] == 0
    order = _ch(target_dir, f"SELECT sorting_key FROM system.tables WHERE name = "
                            f"'{table_name}'")
    assert order == ["id"]
    for command in (("history", "--json"), ("files", "-t", table_name, "--json")):
        done = run_chload(*command, "--target", target_dir)
        assert done.returncode == 0 and table_name in done.stdout
        _no_password(done.stdout + done.stderr)
    _no_password_in(target_dir)


@pytest.mark.slow
def test_two_million_rows_from_each_database_are_exact(source: Source, table_name: str,
                                                       target_dir: str) -> None:
    """The orders table at two million rows: count, exact decimal sum, NULLs, min/max time."""
    source.orders(table_name, 1, 2_000_000)
    report = _load(source, table_name, target_dir, "--workers", "4")
    assert report["rows_loaded"] == 2_000_000
    assert _ch(target_dir, CHECK_CH.format(t=table_name)) == source.check(table_name)


def test_password_in_the_url_is_masked_everywhere(postgres: services.Service,
                                                   table_name: str, target_dir: str) -> None:
    source = Source("postgresql", postgres)
    source.orders(table_name, 1, 1000)
    url = source.url(table_name).replace("loader@", f"loader:{DATABASE_PASSWORD}@")
    done = run_chload("load", url, "--table", table_name, "--target", target_dir, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows_loaded"] == 1000
    bad = run_chload("load", url.replace(table_name, "nosuch"), "--table", "x",
                     "--target", target_dir)
    assert bad.returncode == 2 and "no such table" in bad.stderr
    for text in (done.stdout, done.stderr, bad.stderr,
                 run_chload("history", "--json", "--target", target_dir).stdout):
        _no_password(text)
    _no_password_in(target_dir)


def test_a_wrong_mariadb_password_is_one_line_and_not_retried(mariadb: services.Service,
                                                              table_name: str,
                                                              target_dir: str) -> None:
    """Access denied (1045) is the user's to fix: one line naming the source, a
    SourceError (a connection refused is a TransientError, worth a retry), the
    attempted password nowhere."""
    source = Source("mysql", mariadb)
    wrong = DATABASE_PASSWORD + "-wrong"
    done = run_chload("load", source.url(table_name), "--table", table_name, "--target",
                      target_dir, "--json", env={"MYSQL_PWD": wrong})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Access denied" in lines[0] and "shop" in lines[0], lines
    assert json.loads(done.stdout)["kind"] == "SourceError"
    assert wrong not in done.stdout + done.stderr


def test_kill_9_twice_then_finish_is_exact(source: Source, table_name: str,
                                           target_dir: str) -> None:
    source.orders(table_name)
    args = [sys.executable, "-m", "chload", "load", source.url(table_name), "--table",
            table_name, "--target", target_dir, "--workers", "6", "-q"]  # 6 ranges
    for point in ("after-attach:2", "before-attach:2"):
        crashed = subprocess.run(args, env={**os.environ, **source.env,
                                            "CHLOAD_CRASH_AT": point},
                                 capture_output=True, timeout=300)
        assert crashed.returncode == -9, crashed.stderr
    report = _load(source, table_name, target_dir, "--workers", "3")
    assert 0 < report["rows_loaded"] < ROWS  # only the ranges still missing
    assert _ch(target_dir, CHECK_CH.format(t=table_name)) == source.check(table_name)
    assert _load(source, table_name, target_dir)["rows_loaded"] == 0


def test_incremental_by_id_loads_exactly_the_new_rows(source: Source, table_name: str,
                                                      target_dir: str) -> None:
    source.orders(table_name, 1, 50_000)
    assert _load(source, table_name, target_dir)["rows_loaded"] == 50_000
    source.add(table_name, 50_001, 150_000)  # 100k new rows
    report = _load(source, table_name, target_dir, "--incremental-by", "id")
    assert report["rows_loaded"] == 100_000
    assert _ch(target_dir, CHECK_CH.format(t=table_name)) == source.check(table_name)
    assert _load(source, table_name, target_dir, "--incremental-by", "id")["rows_loaded"] == 0


def test_writes_during_the_load_do_not_leak_into_the_snapshot(
        source: Source, table_name: str, target_dir: str) -> None:
    """Even ids in the source; once chload holds its snapshot, one transaction adds odd
    ids and deletes every tenth even one: the load has none of that."""
    source.orders(table_name, 1, ROWS)
    source.sql(f"DELETE FROM {table_name} WHERE id % 2 = 1")
    before = source.check(table_name)
    proc = subprocess.Popen([sys.executable, "-m", "chload", "load", source.url(table_name),
                             "--table", table_name, "--target", target_dir, "--workers", "1",
                             "-q"], env={**os.environ, **source.env})
    _wait_for_snapshot(source)
    writer = (f"INSERT INTO {table_name} SELECT id + 1, qty, price, created, note, status "
              f"FROM {table_name} WHERE id % 2 = 0; DELETE FROM {table_name} "
              f"WHERE id % 20 = 0")
    source.sql(writer if source.kind == "mysql" else f"BEGIN; {writer}; COMMIT")
    assert proc.wait(timeout=300) == 0
    assert _ch(target_dir, CHECK_CH.format(t=table_name)) == before
    assert source.check(table_name) != before  # the writes did happen


def _wait_for_snapshot(source: Source) -> None:
    """Until chload's readers hold the snapshot (its lock, for MariaDB, released or not:
    a write waiting on it commits after the snapshot)."""
    query = ("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'chload' AND "
             "state LIKE 'idle in transaction%'" if source.kind == "postgresql" else
             "SELECT count(*) FROM information_schema.PROCESSLIST WHERE USER = 'loader' "
             "AND COMMAND = 'Sleep'")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if int(source.sql(query).strip() or 0) >= (1 if source.kind == "postgresql" else 2):
            return
        time.sleep(0.02)
    raise AssertionError("chload never took its snapshot")


def test_types_are_carried_unchanged_postgres(postgres: services.Service, table_name: str,
                                              target_dir: str) -> None:
    source = Source("postgresql", postgres)
    source.sql(f"""DROP TYPE IF EXISTS mood_{table_name}; CREATE TYPE mood_{table_name} AS
        ENUM ('sad', 'happy');
        CREATE TABLE {table_name} (id int PRIMARY KEY, s smallint, n numeric(20,6), r real,
        d double precision, b boolean, t text, v varchar(10), bin bytea, day date,
        ts timestamp(3), tz timestamptz, u uuid, j jsonb, e mood_{table_name},
        ints int[], texts text[]);
        INSERT INTO {table_name} VALUES (1, -32768, 12345678901234.123456, 1.5, 0.1, true,
        E'tab\\there\\nnew\\\\line', '', '\\x00095c0a0dff', '1969-07-20',
        '2021-03-04 05:06:07.891', '2021-03-04 05:06:07+02', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
        '{{"k": [1, 2]}}', 'happy', '{{1,NULL,3}}', '{{"a b",c}}'),
        (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         NULL, NULL)""")
    _load(source, table_name, target_dir)
    got = _ch(target_dir, f"SELECT s, toString(n), r, d, b, t, v, hex(bin), day, ts, tz, u, j, "
                          f"e, ints, texts, isNull(t), isNull(v) FROM {table_name} WHERE id = 1")
    assert got == ["-32768", "12345678901234.123456", "1.5", "0.1", "true",
                   "tab\\there\\nnew\\\\line", "", "00095C0A0DFF", "1969-07-20",
                   "2021-03-04 05:06:07.891", "2021-03-04 03:06:07.000000",
                   "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", '{"k": [1, 2]}', "happy",
                   "[1,NULL,3]", "['a b','c']", "0", "0"]
    nulls = _ch(target_dir, f"SELECT countIf(isNull(s)) + countIf(isNull(n)) + "
                            f"countIf(isNull(t)) + countIf(isNull(bin)) + countIf(isNull(tz)) "
                            f"+ countIf(isNull(e)) FROM {table_name} WHERE id = 2")
    assert nulls == ["6"]


@pytest.mark.parametrize("reader", ["native", "client"])
def test_types_are_carried_unchanged_mariadb(mariadb: services.Service, table_name: str,
                                             target_dir: str, reader: str) -> None:
    """Both readers: the native one (libmariadb, escaping in C) and the `mariadb`
    client (the server escapes), which is used where the native one cannot build."""
    source = Source("mysql", mariadb)
    source.sql(f"""CREATE TABLE {table_name} (id int PRIMARY KEY, u tinyint unsigned,
        big bigint unsigned, n decimal(20,6), d double, t text, v varchar(10), bin blob,
        day date, dt datetime(3), ts timestamp(0) NULL, j json, e enum('sad', 'happy'));
        SET time_zone = '+02:00';
        INSERT INTO {table_name} VALUES (1, 255, 18446744073709551615, 12345678901234.123456,
        0.1, 'tab\\there\\nnew\\\\line', '', X'00095C0A0DFF', '1969-07-20',
        '2021-03-04 05:06:07.891', '2021-03-04 05:06:07', '{{"k": [1, 2]}}', 'happy'),
        (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
        (3, 0, 0, 0, 0, 'NULL', '\\\\N', 'NULL', NULL, NULL, NULL, NULL, NULL)""")
    _load(source, table_name, target_dir,
          env={"CHLOAD_MYSQL_READER": reader if reader == "client" else ""})
    got = _ch(target_dir, f"SELECT u, big, toString(n), d, t, v, hex(bin), day, dt, ts, j, e "
                          f"FROM {table_name} WHERE id = 1")
    assert got == ["255", "18446744073709551615", "12345678901234.123456", "0.1",
                   "tab\\there\\nnew\\\\line", "", "00095C0A0DFF", "1969-07-20",
                   "2021-03-04 05:06:07.891", "2021-03-04 03:06:07", '{"k": [1, 2]}',
                   "happy"]
    nulls = _ch(target_dir, f"SELECT countIf(isNull(u)) + countIf(isNull(t)) + "
                            f"countIf(isNull(bin)) + countIf(isNull(ts)) FROM {table_name} "
                            "WHERE id = 2")
    assert nulls == ["4"]
    strings = _ch(target_dir, f"SELECT t, isNull(t), v, isNull(v), bin FROM {table_name} "
                              "WHERE id = 3")
    assert strings == ["NULL", "0", "\\\\N", "0", "NULL"]  # the strings, not NULL


def test_a_type_that_cannot_be_carried_names_the_column(postgres: services.Service,
                                                        table_name: str,
                                                        target_dir: str) -> None:
    source = Source("postgresql", postgres)
    source.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, span interval)")
    done = run_chload("load", source.url(table_name), "--table", table_name, "--target",
                      target_dir, env=source.env)
    assert done.returncode == 2
    assert "span (interval)" in done.stderr and "--schema" in done.stderr


def test_query_source(postgres: services.Service, table_name: str, target_dir: str) -> None:
    source = Source("postgresql", postgres)
    source.orders(table_name, 1, 1000)
    url = f"postgresql://loader@{postgres.endpoint}/shop"
    query = f"SELECT id, price FROM {table_name} WHERE status = 'paid'"
    args = ("load", url, "--query", query, "--table", table_name, "--target", target_dir,
            "--json")
    done = run_chload(*args, env=source.env)
    assert done.returncode == 0, done.stderr
    paid = source.sql(f"SELECT count(*) FROM {table_name} WHERE status = 'paid'").strip()
    assert json.loads(done.stdout)["rows_loaded"] == int(paid)
    assert json.loads(run_chload(*args, env=source.env).stdout)["rows_loaded"] == 0


def test_into_the_18_16_server(source: Source, clickhouse: services.Service,
                               table_name: str) -> None:
    """18.16 has no DateTime64: the timestamp column is given as DateTime by --schema."""
    source.orders(table_name, 1, 50_000)
    target = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    env = {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    schema = ("id Int64, qty Int32, price Decimal(10, 2), created DateTime, "
              "note Nullable(String), status String")
    given: tuple[str, ...] = ()
    if source.kind == "postgresql":  # timestamp: microseconds; MariaDB's datetime: seconds
        refused = run_chload("load", source.url(table_name), "--table", table_name,
                             "--target", target, env={**source.env, **env})
        assert refused.returncode == 2 and "--schema" in refused.stderr
        given = ("--schema", schema)
    report = _load(source, table_name, target, *given, env=env)
    assert report["rows_loaded"] == 50_000
    got = run_chload("sql", CHECK_CH.format(t=table_name).replace(
        "toDateTime(min(created))", "min(created)").replace(
        "toDateTime(max(created))", "max(created)"), "--target", target, "--format", "TSV",
        env=env)
    fields = got.stdout.strip().split("\t")
    fields[1] = fields[1].rstrip("0").rstrip(".") if "." in fields[1] else fields[1]
    want = source.check(table_name)
    assert fields[:3] + fields[5:] == want[:3] + want[5:]
    source.add(table_name, 50_001, 51_000)
    more = _load(source, table_name, target, *given, "--incremental-by", "id", env=env)
    assert more["rows_loaded"] == 1000


def test_a_range_lands_in_the_18_16_server_as_one_part_not_merged(
        postgres: services.Service, clickhouse: services.Service, table_name: str) -> None:
    """A range over the rows per part of a file (1,048,576 here) is still one part: the
    stage needs no merge after the stream (a merged part has level 1, an inserted one 0)."""
    source = Source("postgresql", postgres)
    rows = 1_100_000
    source.sql(ORDERS_PG.replace("timestamp NOT NULL", "timestamp(0) NOT NULL").format(
        t=table_name, lo=1, hi=rows))
    target = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    env = {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    report = _load(source, table_name, target, "--workers", "1", env=env)
    assert report["rows_loaded"] == rows and report["files_loaded"] == 1
    parts = run_chload("sql", f"SELECT level, rows FROM system.parts WHERE database = "
                       f"'default' AND table = '{table_name}' AND active", "--target", target,
                       "--format", "TSV", env=env)
    assert parts.stdout.split() == ["0", str(rows)], parts.stdout


def test_validate_fetches_and_parses_the_ranges_writing_nothing(
        postgres: services.Service, table_name: str, target_dir: str) -> None:
    source = Source("postgresql", postgres)
    source.orders(table_name, 1, 1000)
    done = run_chload("validate", source.url(table_name), "--table", table_name,
                      "--target", target_dir, "--json", env=source.env)
    assert done.returncode == 0, done.stderr
    checks = json.loads(done.stdout)
    assert sum(c["rows"] for c in checks) == 1000
    assert not any(c["errors"] or c["failure"] for c in checks)
    assert not os.path.exists(target_dir)  # a scratch engine, removed after
    _no_password(done.stdout + done.stderr)


def test_a_range_is_read_in_key_order_when_the_target_asks(
        postgres: services.Service, table_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """postgres.read_in_key_order against the real database: rows updated after the
    fill lie at the table's end (a sequential scan gives them last), yet the table is
    in key order by its statistics, so an asking target gets every range sorted."""
    from chload.sources.databases.postgres import PostgresSession
    from chload.sources.databases.table import parse_url

    source = Source("postgresql", postgres)
    source.orders(table_name, 1, 20_000)
    source.sql(f"UPDATE {table_name} SET qty = qty + 1 WHERE id % 1000 = 0; "
               f"ANALYZE {table_name}")
    monkeypatch.setenv("PGPASSWORD", DATABASE_PASSWORD)

    def ids(ordered: bool) -> list[int]:
        session = PostgresSession(parse_url(source.url(table_name), None), None, None)
        try:
            if ordered:
                session.read_in_key_order()
            out = tmp_path / f"range-{ordered}.tsv"
            session.read('"id" > 0 AND "id" <= 20000', os.open(
                out, os.O_WRONLY | os.O_CREAT, 0o600)).finish()
        finally:
            session.close()
        return [int(line.split("\t", 1)[0]) for line in out.read_text().splitlines()]

    as_it_lies, asked = ids(False), ids(True)
    assert sorted(as_it_lies) == asked == list(range(1, 20_001))
    assert as_it_lies != asked  # (the updated rows came last: the test can fail)
