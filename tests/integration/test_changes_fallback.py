"""A PostgreSQL follow that cannot have a replication connection, really (every WAL
sender of the server taken, not CHLOAD_CHANGES_BY_SQL): it reads the slot by SQL by
itself, says so in one note with the server's reason, and ends exactly as the source is.

(pg_hba.conf cannot refuse one role a logical replication connection only: such a
connection names its database and matches that database's lines, as a plain one does;
its `replication` keyword matches physical replication only. A full set of WAL senders
is what refuses it while SQL goes on.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import services
from conftest import DATABASE_PASSWORD
from test_changes_postgres import CREATE, WRITE, _ch
from test_databases import Source

from chload.sources.databases.postgres_psql import find_psql

pytestmark = pytest.mark.integration
SENDERS = "SELECT count(*) FROM pg_stat_replication"


@pytest.fixture
def pg(postgres: services.Service) -> Source:
    return Source("postgresql", postgres)


def _admin(pg: Source, sql: str) -> int:
    return int(services.postgres_sql(pg.server, sql, admin=True).strip())


@pytest.fixture
def senders_taken(pg: Source) -> Iterator[None]:
    """Every free WAL sender held by an idle replication connection (psql waiting on its
    stdin) until the test ends: a new one is refused (max_wal_senders)."""
    free = _admin(pg, "SHOW max_wal_senders") - _admin(pg, SENDERS)
    conninfo = (f"host={pg.server.endpoint.split(':')[0]} port={pg.server.ports['pg']} "
                "dbname=shop user=loader replication=database")
    held = [subprocess.Popen([find_psql(), "-X", "-q", conninfo],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL,
                             env={**os.environ, "PGPASSWORD": DATABASE_PASSWORD})
            for _ in range(free)]
    try:
        deadline = time.monotonic() + 30
        while _admin(pg, SENDERS) < free and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _admin(pg, "SHOW max_wal_senders") == _admin(pg, SENDERS)
        yield
    finally:
        for proc in held:
            proc.kill()
            proc.wait(timeout=30)


def _follow(pg: Source, t: str, target_dir: str, sql: str) -> str:
    """`--follow` of `t`; `sql` at the source once it is up, 3 s to apply it, then
    SIGTERM: it exits 0; its summary."""
    env = {**os.environ, **pg.env}
    env.pop("CHLOAD_CHANGES_BY_SQL", None)  # (the fallback must come by itself)
    proc = subprocess.Popen([sys.executable, "-m", "chload", "load", pg.url(t), "--table", t,
                             "--target", target_dir, "--follow"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(6)
        pg.sql(sql)
        time.sleep(3)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out


def _notes(summary: str) -> list[str]:
    return [line for line in summary.splitlines() if "read by SQL" in line]


@pytest.fixture
def followed(pg: Source, target_dir: str, table_name: str) -> str:
    """A table followed once, streamed (its slot made, its copy taken)."""
    pg.sql(CREATE.format(t=table_name, rows=300))
    summary = _follow(pg, table_name, target_dir, f"UPDATE {table_name} SET n = 0")
    assert _notes(summary) == [], summary
    return table_name


def test_a_follow_with_no_free_wal_sender_falls_back_to_sql_by_itself_and_ends_exact(
        pg: Source, target_dir: str, followed: str, senders_taken: None) -> None:
    t = followed
    writes = "; ".join(WRITE.format(t=t, new=1000 + i, k=i + 1, gone=10 + i, moved=20 + i)
                       for i in range(3))
    summary = _follow(pg, t, target_dir, writes)
    notes = _notes(summary)
    assert len(notes) == 1 and "note:" in notes[0], summary
    assert "max_wal_senders" in notes[0], notes[0]  # the server's reason
    source = pg.sql(f"SELECT count(*), sum(id), sum(n) FROM {t}").strip()
    assert _ch((target_dir, {}), f"SELECT count(), sum(id), sum(n) FROM {t} FINAL "
                                 "WHERE NOT _is_deleted") == source
    versions = _ch((target_dir, {}), f"SELECT count(), uniqExact(id, _version) FROM {t} "
                                     "WHERE _version > 0").split("\t")
    assert int(versions[0]) > 0 and versions[0] == versions[1]  # each change once
