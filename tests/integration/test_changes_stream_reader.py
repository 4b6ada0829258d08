"""The replication stream's two readers (sources/changes/postgres/stream_native.py: C with
the GIL released; replication.py's Python loop, CHLOAD_PG_STREAM_READER=python) write
the same spool bytes for the same changes, sealed at whole transactions: two slots made
at the same instant on the real PostgreSQL 15, the same changes (texts escaped by
wal2json, a change larger than the C reader's buffer, a transaction of another table,
an empty one), each slot read by one reader, small segments and small batches so that
the C reader comes back at commits by size and by count."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import services
from conftest import DATABASE_PASSWORD

from chload.sources.changes.postgres import replication, stream_native
from chload.sources.changes.postgres.slot import lsn_int
from chload.sources.databases.table import parse_url

pytestmark = pytest.mark.integration

TABLE = "stream_reader"
SLOTS = ("chload_reader_c", "chload_reader_py")
CREATE = f"""CREATE TABLE {TABLE} (id bigint PRIMARY KEY, note text, n int);
CREATE TABLE {TABLE}_other (id bigint PRIMARY KEY)"""
# (each statement sent alone: a transaction of its own)
CHANGES = f"""INSERT INTO {TABLE} SELECT g, E'tab\\there\\nline "q" \\\\ 😀 ' || g, g % 7
    FROM generate_series(1, 3000) g;
INSERT INTO {TABLE}_other SELECT generate_series(1, 50);
BEGIN; COMMIT;
UPDATE {TABLE} SET n = n + 1, note = note || 'u' WHERE id % 3 = 0;
INSERT INTO {TABLE} VALUES (0, repeat('big ', 1000000), 0);
DELETE FROM {TABLE} WHERE id % 5 = 0;
"""
WRITES = 60  # transactions of one change each (rows not deleted), after those above


def _read(server: services.Service, slot: str, start: int, end: int, spool: Path
          ) -> tuple[bytes, int, bool]:
    """The slot's changes from `start` until the stream's safe position reaches `end`:
    (the segments' bytes in order, their changes, whether the C reader read them)."""
    url = parse_url(f"postgresql://loader:{DATABASE_PASSWORD}@{server.endpoint}/shop/"
                    f"public.{TABLE}", None)
    spool.mkdir()
    stream = replication.Stream(url, slot, ("public", TABLE), start, str(spool))
    data, changes, upto, deadline = b"", 0, start, time.monotonic() + 120
    try:
        while upto < end:  # (every change before `end` in the segments taken)
            assert time.monotonic() < deadline, f"{slot}: at {upto}, short of {end}"
            segment = stream.take(5.0)
            if segment is None:
                continue
            upto = segment.upto
            body = Path(segment.path).read_bytes()
            assert body.count(b"\n") == segment.changes and body[-1:] in (b"", b"\n")
            data, changes = data + body, changes + segment.changes
        return data, changes, stream.native is not None
    finally:
        stream.close()


def test_the_c_and_python_readers_spool_the_same_bytes(
        postgres: services.Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    services.postgres_sql(postgres, CREATE)
    for slot in SLOTS:
        services.postgres_sql(postgres, f"SELECT pg_create_logical_replication_slot("
                                        f"'{slot}', 'wal2json')")
    start = max(lsn_int(services.postgres_sql(
        postgres, f"SELECT confirmed_flush_lsn FROM pg_replication_slots "
                  f"WHERE slot_name = '{slot}'").strip()) for slot in SLOTS)
    for statement in CHANGES.strip().rstrip(";").split(";\n"):
        services.postgres_sql(postgres, statement)
    for i in range(WRITES):
        services.postgres_sql(postgres, f"UPDATE {TABLE} SET n = n + 1 WHERE id = {5 * i + 1}")
    end = lsn_int(services.postgres_sql(postgres, "SELECT pg_current_wal_lsn()").strip())
    monkeypatch.setattr(replication, "SEGMENT_BYTES", 200_000)
    monkeypatch.setattr(stream_native, "BATCH", 97)

    monkeypatch.delenv("CHLOAD_PG_STREAM_READER", raising=False)
    ours, ours_changes, native = _read(postgres, SLOTS[0], start, end, tmp_path / "c")
    monkeypatch.setenv("CHLOAD_PG_STREAM_READER", "python")
    theirs, theirs_changes, python_native = _read(postgres, SLOTS[1], start, end,
                                                  tmp_path / "py")

    assert native and not python_native, stream_native.library()
    # 3000 inserts, 1000 updates, the big one, 601 deletes, WRITES updates
    assert ours_changes == theirs_changes == 3000 + 1000 + 1 + 601 + WRITES
    assert b"big big" in ours and "😀".encode() in ours
    assert ours == theirs
    for slot in SLOTS:
        services.postgres_sql(postgres, f"SELECT pg_drop_replication_slot('{slot}')")
