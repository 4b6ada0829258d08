"""PostgreSQL and MariaDB sources on the untidy tables a new user points chload at on day
one: composite keys, domains, types no ClickHouse type holds, times outside 1970-2106,
MySQL's zero dates, bit columns. Each is loaded with the real `chload` command into
embedded chDB (and an 18.16 server where it differs); the values are checked through
SQL against the source's, or the run must stop with one line saying what to pass.
Small tables: the whole file runs in well under a minute."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
import services
from conftest import DATABASE_PASSWORD, run_chload
from test_databases import Source

pytestmark = pytest.mark.integration


@pytest.fixture
def pg(postgres: services.Service) -> Source:
    return Source("postgresql", postgres)


@pytest.fixture
def my(mariadb: services.Service) -> Source:
    return Source("mysql", mariadb)


@pytest.fixture(params=["postgresql", "mysql"])
def db(request: pytest.FixtureRequest) -> Source:
    return Source(request.param, request.getfixturevalue(
        "postgres" if request.param == "postgresql" else "mariadb"))


@pytest.fixture
def server(clickhouse: services.Service) -> tuple[str, dict[str, str]]:
    return (f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default",
            {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]})


def _load(db: Source, table: str, target: str, *args: str, env: dict[str, str] | None = None,
          into: str = "") -> dict:
    done = run_chload("load", db.url(table), "--table", into or table, "--target", target,
                      "--json", *args, env={**db.env, **(env or {})})
    assert done.returncode == 0, done.stderr
    assert DATABASE_PASSWORD not in done.stdout + done.stderr
    return json.loads(done.stdout)


def _refused(db: Source, table: str, target: str, *args: str, env: dict[str, str] | None = None,
             into: str = "") -> str:
    """The one line of a run that must stop (exit 2), the password nowhere in it."""
    done = run_chload("load", db.url(table), "--table", into or table, "--target", target,
                      *args, env={**db.env, **(env or {})})
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr and DATABASE_PASSWORD not in done.stderr
    return done.stderr.strip()


def _suggested(line: str) -> str:
    """The --schema a message suggests, as the shell would pass it."""
    return shlex.split(line.split("e.g. --schema ", 1)[1])[0]


def _ch(target: str, sql: str, env: dict[str, str] | None = None) -> list[str]:
    done = run_chload("sql", sql, "--target", target, "--format", "TSV", env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split("\n")


def test_a_composite_primary_key_is_the_tables_order(db: Source, table_name: str,
                                                     target_dir: str,
                                                     server: tuple[str, dict[str, str]]
                                                     ) -> None:
    """ORDER BY (a, b): a bare `a, b` was a syntax error at the CREATE, on both targets."""
    db.sql(f"CREATE TABLE {table_name} (a int NOT NULL, b varchar(10) NOT NULL, c int, "
           f"PRIMARY KEY (a, b)); INSERT INTO {table_name} VALUES (1, 'x', 10), (1, 'y', 20), "
           "(2, 'x', NULL)")
    for target, env in ((target_dir, None), server):
        assert _load(db, table_name, target, env=env)["rows_loaded"] == 3
        got = _ch(target, f"SELECT a, b, c FROM {table_name} ORDER BY a, b", env)
        assert got == ["1\tx\t10", "1\ty\t20", "2\tx\t\\N"]
        key = _ch(target, "SELECT engine_full FROM system.tables WHERE name = "
                          f"'{table_name}'", env)[0]
        assert "ORDER BY (a, b)" in key.replace("`", ""), key


def test_a_domain_column_is_its_base_type(pg: Source, table_name: str, target_dir: str) -> None:
    pg.sql(f"""DROP DOMAIN IF EXISTS pos_{table_name}; DROP DOMAIN IF EXISTS mail_{table_name};
        CREATE DOMAIN pos_{table_name} AS int CHECK (VALUE > 0);
        CREATE DOMAIN mail_{table_name} AS varchar(40);
        CREATE TABLE {table_name} (id int PRIMARY KEY, n pos_{table_name},
        m mail_{table_name} NOT NULL);
        INSERT INTO {table_name} VALUES (1, 5, 'a@b.c'), (2, NULL, '')""")
    _load(pg, table_name, target_dir)
    got = _ch(target_dir, f"SELECT id, n, m, toTypeName(n), toTypeName(m) FROM {table_name} "
                          "ORDER BY id")
    assert got == ["1\t5\ta@b.c\tNullable(Int32)\tString",
                   "2\t\\N\t\tNullable(Int32)\tString"]


def test_a_type_not_carried_loads_with_the_schema_the_message_gives(
        pg: Source, table_name: str, target_dir: str) -> None:
    """interval, money, time and numeric without a precision stop the run with one line
    naming them and a whole --schema to pass; that --schema then loads their text."""
    pg.sql(f"""CREATE TABLE {table_name} (id int PRIMARY KEY, span interval, t time,
        n numeric, ok text, "at" timestamp);
        INSERT INTO {table_name} VALUES (1, '1 day 02:03:04', '12:34:56.5',
        123456789012345678901234567890.12345678901234, 'x', '2020-01-01 01:02:03.5'),
        (2, NULL, NULL, NULL, NULL, NULL)""")
    line = _refused(pg, table_name, target_dir)
    assert len(line.splitlines()) == 1, line
    assert "span (interval)" in line and "t (time without time zone)" in line
    assert "n (numeric)" in line and "ok (" not in line
    schema = _suggested(line)
    assert _load(pg, table_name, target_dir, "--schema", schema)["rows_loaded"] == 2
    got = _ch(target_dir, f"SELECT span, t, n, ok FROM {table_name} ORDER BY id")
    assert got == ["1 day 02:03:04\t12:34:56.5\t"
                   "123456789012345678901234567890.12345678901234\tx", "\\N\t\\N\t\\N\t\\N"]


def test_mariadb_time_loads_with_the_schema_the_message_gives(
        my: Source, table_name: str, target_dir: str) -> None:
    my.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, t time NOT NULL); "
           f"INSERT INTO {table_name} VALUES (1, '-838:59:59'), (2, '12:00:01')")
    line = _refused(my, table_name, target_dir)
    assert "t (time)" in line, line
    schema = _suggested(line)
    _load(my, table_name, target_dir, "--schema", schema)
    assert _ch(target_dir, f"SELECT t FROM {table_name} ORDER BY id") == [
        "-838:59:59", "12:00:01"]


def test_whole_second_times_outside_1970_to_2106_are_kept(db: Source, table_name: str,
                                                          target_dir: str) -> None:
    """A whole-second timestamp (PostgreSQL timestamp(0), MySQL datetime) was a DateTime,
    which holds 1970 to 2106 only: 1960 was loaded as 1970-01-01, silently."""
    typ = "timestamp(0)" if db.kind == "postgresql" else "datetime"
    db.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, t {typ} NOT NULL); "
           f"INSERT INTO {table_name} VALUES (1, '1960-05-06 07:08:09'), "
           "(2, '2200-01-02 03:04:05'), (3, '2020-01-01 00:00:00')")
    _load(db, table_name, target_dir)
    assert _ch(target_dir, f"SELECT toString(t) FROM {table_name} ORDER BY id") == [
        "1960-05-06 07:08:09", "2200-01-02 03:04:05", "2020-01-01 00:00:00"]


@pytest.mark.parametrize("reader", ["native", "client"])
def test_a_mariadb_bit_column_is_its_number(my: Source, table_name: str, target_dir: str,
                                            reader: str) -> None:
    my.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, b bit(5), w bit(64) NOT NULL); "
           f"INSERT INTO {table_name} VALUES (1, b'10101', b'1{'0' * 63}'), (2, NULL, 0)")
    _load(my, table_name, target_dir,
          env={"CHLOAD_MYSQL_READER": reader if reader == "client" else ""})
    assert _ch(target_dir, f"SELECT b, w FROM {table_name} ORDER BY id") == [
        f"21\t{2 ** 63}", "\\N\t0"]


@pytest.mark.parametrize("reader", ["native", "client"])
def test_mariadb_zero_dates_stop_the_run_or_load_as_the_schema_says(
        my: Source, table_name: str, target_dir: str, reader: str) -> None:
    """'0000-00-00' (and a zero month or day), let in by a permissive sql_mode: the engine
    read them as 1900-01-01 and 2026-01-01, silently. Now the range fails (the native
    reader names the column and the --schema to pass); typed Nullable they are NULL,
    typed String their text."""
    my.sql(f"SET SESSION sql_mode = ''; CREATE TABLE {table_name} (id int PRIMARY KEY, "
           "d date NOT NULL, dt datetime NULL); "
           f"INSERT INTO {table_name} VALUES (1, '2024-01-02', '2024-01-02 03:04:05'), "
           "(2, '0000-00-00', '0000-00-00 00:00:00'), (3, '2024-02-00', NULL)")
    env = {"CHLOAD_MYSQL_READER": reader if reader == "client" else ""}
    line = _refused(my, table_name, target_dir, "--workers", "1", env=env)
    if reader == "native":
        assert "column d holds the zero date '0000-00-00'" in line, line
        schema = _suggested(line)
        assert "d Nullable(Date32)" in schema
    else:  # the server's guard makes it text no date parser takes
        assert "zero date" in line, line
        schema = ("id Int32, d Nullable(Date32), dt Nullable(DateTime64(0, 'UTC'))")
    assert _ch(target_dir, f"SELECT count() FROM {table_name}") == ["0"]
    assert "ALTER or drop it first" in line or reader == "client"  # it holds d Date32
    as_null = f"{target_dir}-null"
    _load(my, table_name, as_null, "--schema", schema, env=env)
    assert _ch(as_null, f"SELECT id, d, dt FROM {table_name} ORDER BY id") == [
        "1\t2024-01-02\t2024-01-02 03:04:05", "2\t\\N\t\\N", "3\t\\N\t\\N"]
    kept = f"{target_dir}-text"
    _load(my, table_name, kept, "--schema", "id Int32, d String, dt Nullable(String)",
          env=env)
    assert _ch(kept, f"SELECT id, d, dt FROM {table_name} ORDER BY id") == [
        "1\t2024-01-02\t2024-01-02 03:04:05", "2\t0000-00-00\t0000-00-00 00:00:00",
        "3\t2024-02-00\t\\N"]


def test_a_postgres_array_of_two_dimensions_is_refused_not_emptied(
        pg: Source, table_name: str, target_dir: str) -> None:
    """int[] may hold {{1,2},{3,4}}: it was loaded as [], silently. Now its range fails
    naming the column; --schema String loads every array's JSON text."""
    pg.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, a int[], t text[]); "
           f"INSERT INTO {table_name} VALUES (1, '{{1,2}}', '{{x,NULL,\"y z\"}}'), "
           f"(2, '{{{{1,2}},{{3,4}}}}', NULL), (3, NULL, '{{}}')")
    line = _refused(pg, table_name, target_dir, "--workers", "1")
    assert "column a holds an array of 2 or more dimensions" in line, line
    assert "--schema with a as String" in line
    _load(pg, table_name, f"{target_dir}-text", "--schema",
          "id Int32, a Nullable(String), t Array(Nullable(String))")
    assert _ch(f"{target_dir}-text", f"SELECT a, t FROM {table_name} ORDER BY id") == [
        "[1,2]\t['x',NULL,'y z']", "[[1,2],[3,4]]\t[]", "\\N\t[]"]


def test_a_table_not_found_says_where_one_of_that_name_is(pg: Source, my: Source, table_name: str,
                                                         target_dir: str) -> None:
    """A table in another schema than public, or spelt in another case: the one line
    says which URL to use; that URL loads (quoted names with spaces too)."""
    schema, mixed = f"s_{table_name}", f"Mixed {table_name}"
    pg.sql(f'CREATE SCHEMA {schema}; CREATE TABLE {schema}.{table_name} (id int PRIMARY '
           f'KEY); INSERT INTO {schema}.{table_name} VALUES (1); CREATE TABLE "{mixed}" '
           f'("Id" int PRIMARY KEY, "a b" text); INSERT INTO "{mixed}" VALUES (7, \'x\')')
    line = _refused(pg, table_name, target_dir)
    assert line.endswith(f"did you mean postgresql://{pg.server.endpoint}/shop/"
                         f"{schema}.{table_name}?"), line
    line = _refused(pg, mixed.lower().replace(" ", "%20"), target_dir, into="m")
    assert f"did you mean postgresql://{pg.server.endpoint}/shop/public.{mixed}?" in line
    done = run_chload("load", pg.url(table_name).replace("public.", f"{schema}."), "--table",
                      table_name, "--target", target_dir, env=pg.env)
    assert done.returncode == 0, done.stderr
    _load(pg, mixed.replace(" ", "%20"), target_dir, into="m")
    assert _ch(target_dir, "SELECT Id, `a b` FROM m") == ["7\tx"]
    my.sql(f"CREATE TABLE Camel_{table_name} (id int PRIMARY KEY)")
    line = _refused(my, f"camel_{table_name}", target_dir)
    assert line.endswith(f"did you mean mysql://{my.server.endpoint}/shop/"
                         f"Camel_{table_name}?"), line


def test_an_empty_table_is_created_and_its_rows_load_later(
        db: Source, table_name: str, target_dir: str, server: tuple[str, dict[str, str]]) -> None:
    """An empty table with an integer key listed no unit, so no table was made."""
    db.sql(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    targets = ((target_dir, {}), server)
    for target, env in targets:
        assert _load(db, table_name, target, env=env)["files_loaded"] == 1
        assert _ch(target, f"SELECT count(), toTypeName(any(v)) FROM {table_name}",
                   env) == ["0\tNullable(String)"]
        assert _load(db, table_name, target, env=env)["files_total"] == 0
    db.sql(f"INSERT INTO {table_name} VALUES (1, 'a'), (2, NULL)")
    for target, env in targets:
        assert _load(db, table_name, target, env=env)["rows_loaded"] == 2
        assert _load(db, table_name, target, env=env)["rows_loaded"] == 0


def test_a_latin1_postgres_database_loads_as_utf8(pg: Source, table_name: str,
                                                  target_dir: str) -> None:
    """psql's client encoding followed the locale, so a LATIN1 database's text came as
    Latin-1 bytes (invalid UTF-8 in ClickHouse), silently."""
    database = f"lat_{table_name}"
    services.postgres_sql(pg.server, f"CREATE DATABASE {database} ENCODING 'LATIN1' "
                          "LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0 OWNER loader",
                          admin=True)
    url = f"postgresql://loader@{pg.server.endpoint}/{database}/public.{table_name}"
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
                    str(pg.server.ports["pg"]), "-U", "loader", "-d", database, "-c",
                    f"CREATE TABLE {table_name} (id int PRIMARY KEY, t text); "
                    f"INSERT INTO {table_name} VALUES (1, 'café naïve')"],
                   check=True, capture_output=True,
                   env={**os.environ, **pg.env, "PGCLIENTENCODING": "UTF8"})
    done = run_chload("load", url, "--table", table_name, "--target", target_dir,
                      env={**pg.env, "LC_ALL": "C", "LANG": "C"})
    assert done.returncode == 0, done.stderr
    assert _ch(target_dir, f"SELECT t, hex(t) FROM {table_name}") == [
        "café naïve\t636166C3A9206E61C3AF7665"]


def test_postgres_arrays_of_varchar_n_and_char_n_are_arrays(pg: Source, table_name: str,
                                                            target_dir: str) -> None:
    """varchar(20)[] was refused (its element type, with its length, matched no entry)."""
    pg.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY, tags varchar(20)[], "
           f"codes char(2)[]); INSERT INTO {table_name} VALUES "
           "(1, '{a,NULL,\"b c\"}', '{x,yz}'), (2, NULL, '{}')")
    _load(pg, table_name, target_dir)
    assert _ch(target_dir, f"SELECT tags, codes FROM {table_name} ORDER BY id") == [
        "['a',NULL,'b c']\t['x ','yz']", "[]\t[]"]


def test_a_zero_datetime_not_null_names_its_nullable_type(my: Source, table_name: str,
                                                          target_dir: str) -> None:
    my.sql(f"SET SESSION sql_mode = ''; CREATE TABLE {table_name} (id int PRIMARY KEY, "
           f"at datetime NOT NULL); INSERT INTO {table_name} VALUES (1, 0)")
    line = _refused(my, table_name, target_dir)
    assert "at as Nullable(DateTime64(0, 'UTC')) to load" in line, line
    assert _suggested(line) == "id Int32, at Nullable(DateTime64(0, 'UTC'))"


def test_no_postgres_password_at_a_terminal_is_one_line_not_a_prompt(
        pg: Source, table_name: str, target_dir: str) -> None:
    """At a terminal, psql asked for the password on /dev/tty (two of them at once,
    under the progress bar) and the run waited; now it never asks, and says how to
    give the password."""
    import pty
    import select
    import signal
    import time

    pg.sql(f"CREATE TABLE {table_name} (id int PRIMARY KEY)")
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    env["HOME"] = target_dir + "-home"  # no ~/.pgpass
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own, the pty its terminal
        os.execve(sys.executable, [sys.executable, "-m", "chload", "load", pg.url(table_name),
                                   "--table", table_name, "--target", target_dir, "-q"], env)
    out, deadline = b"", time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child ended
                break
            if not chunk:
                break
            out += chunk
    ended, status = os.waitpid(pid, os.WNOHANG)
    while not ended and time.monotonic() < deadline:  # its output ended: it is ending
        time.sleep(0.05)
        ended, status = os.waitpid(pid, os.WNOHANG)
    if not ended:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    os.close(fd)
    text = out.decode(errors="replace")
    assert ended, f"still waiting after 60 s: {text!r}"
    assert "Password for user" not in text
    assert os.waitstatus_to_exitcode(status) == 2, text
    assert "no password supplied; give it by $PGPASSWORD" in text, text


def test_no_mariadb_password_says_how_to_give_it(my: Source, table_name: str,
                                                 target_dir: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MYSQL_PWD"}
    env["HOME"] = target_dir + "-home"  # no ~/.my.cnf
    done = subprocess.run([sys.executable, "-m", "chload", "load", my.url(table_name),
                           "--table", table_name, "--target", target_dir], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().endswith("(using password: NO); give it by $MYSQL_PWD, "
                                        "~/.my.cnf ([client] password) or the URL"), done.stderr
