"""`chload sources` for a MariaDB follow: the followed table is listed with the binlog
position it loaded and the server's; its lag in bytes grows with writes (across binlog
files); a warning line names the binlog file it needs when that file is the oldest left
and when it was purged; `--drop` says there is nothing to drop at the source. The real
`chload` against MariaDB 10.11, into embedded chDB and an 18.16 server."""

from __future__ import annotations

import json
import time

import pytest
import services
from conftest import DATABASE_PASSWORD, run_chload
from test_mysql_changes import (
    ENV,
    _connect,
    _orders,
    _started,
    target as target,  # noqa: F401 (the fixture)
)

pytestmark = pytest.mark.integration


def _sources(target: tuple[str, dict[str, str]], *args: str) -> tuple[str, str]:
    done = run_chload("sources", "--target", target[0], *args, env={**ENV, **target[1]})
    assert done.returncode == 0, done.stdout + done.stderr
    assert DATABASE_PASSWORD not in done.stdout + done.stderr
    return done.stdout, done.stderr


def _entry(target: tuple[str, dict[str, str]], table: str) -> dict:
    found = [f for f in json.loads(_sources(target, "--json")[0])
             if f["table"].endswith("." + table)]
    assert len(found) == 1, found
    return found[0]


def _write(db: services.Service, table: str, first: int, rows: int) -> None:
    conn = _connect(db)
    try:
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} VALUES (%s, 1, 1.50, %s, NOW(6))",
                            [(first + i, "x" * 80) for i in range(rows)])
    finally:
        conn.close()


def _purge_to(db: services.Service, name: str, timeout: float = 30) -> None:
    """PURGE BINARY LOGS TO `name`, again until the server holds no older file: MariaDB
    keeps a file a binlog checkpoint or a dump thread (a killed follow's, until its
    heartbeat fails) still needs, with a warning only."""
    deadline = time.monotonic() + timeout
    while True:
        services.mariadb_sql(db, f"PURGE BINARY LOGS TO '{name}'", admin=True)
        logs = services.mariadb_sql(db, "SHOW BINARY LOGS", admin=True).split()
        older = [log for log in logs if log.startswith("binlog.") and log < name]
        if not older:
            return
        assert time.monotonic() < deadline, (older, services.mariadb_sql(
            db, "SHOW PROCESSLIST", admin=True))
        time.sleep(0.5)


def test_a_follow_shows_its_position_its_lag_grows_and_a_purge_is_a_warning(
        mariadb: services.Service, target: tuple[str, dict[str, str]], table_name: str) -> None:
    _orders(mariadb, table_name)
    _started(mariadb, table_name, target)  # --follow: the copy, then changes; SIGTERM
    first = _entry(target, table_name)
    assert first["kind"] == "mysql" and "error" not in first, first
    assert first["source"] == f"mysql://loader@{mariadb.endpoint}/shop/{table_name}"
    assert first["lag_bytes"] == 0 and first["lag_seconds"] == 0, first  # nothing written
    assert first["binlog"] == first["server_binlog"], first
    out, _ = _sources(target)
    assert f"binlog {first['binlog']}" in out and "lag 0 B" in out, out

    _write(mariadb, table_name, 10**9, 2000)
    grown = _entry(target, table_name)
    assert grown["binlog"] == first["binlog"], grown
    assert grown["lag_bytes"] > 2000 * 80 and grown["lag_seconds"] > 0, grown

    services.mariadb_sql(mariadb, "FLUSH BINARY LOGS", admin=True)
    _write(mariadb, table_name, 2 * 10**9, 500)
    needed = first["binlog"].split(":")[0]
    _purge_to(mariadb, needed)
    across = _entry(target, table_name)
    assert across["lag_bytes"] > grown["lag_bytes"] + 500 * 80, across
    assert across["server_binlog"].split(":")[0] > needed, across
    assert "is the oldest left" in across["warning"], across
    assert "binlog_expire_logs_seconds" in across["warning"], across

    current = across["server_binlog"].split(":")[0]
    _purge_to(mariadb, current)
    out, err = _sources(target)
    assert f"binlog {first['binlog']}" in out, out
    # the server's ledger is shared with the other follows of the run: only ours counts
    warnings = [line for line in err.splitlines()
                if line.startswith("warning:") and f".{table_name} " in line]
    assert len(warnings) == 1, err
    assert f"binlog {needed}" in warnings[0] and "no longer on the server" in warnings[0]
    assert "new --table" in warnings[0] and f".{table_name})" in warnings[0]


def test_dropping_a_mysql_follow_drops_nothing_at_the_source(
        mariadb: services.Service, target: tuple[str, dict[str, str]], table_name: str) -> None:
    _orders(mariadb, table_name)
    _started(mariadb, table_name, target)
    out, _ = _sources(target, "--drop", table_name)
    assert f"follow of mysql://loader@{mariadb.endpoint}/shop/{table_name} dropped" in out
    assert "nothing to drop there" in out, out
    done = run_chload("sources", "--target", target[0], "--drop", "t_not_followed",
                      env={**ENV, **target[1]})
    assert done.returncode != 0 and "t_not_followed" in done.stderr, done.stderr
