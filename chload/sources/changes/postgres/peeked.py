"""A followed table's changes read by SQL: the fallback where no replication connection
can be had (no psycopg, no free WAL sender: max_wal_senders).

Per round, the changes committed in `(after, upto]` (after: the ledger's end; upto: the
server's WAL position now, at most UNIT_BYTES on) are read by one `psql` COPY over
`pg_logical_slot_peek_changes` (sql.py: no row in Python) into the engine's Native spool,
and loaded as one unit; only after the commit is the slot moved to `upto`
(`pg_replication_slot_advance`). While a unit loads, the next one (`(upto, now]`) may be
read on another thread (`_read_ahead`): the slot is read past the unit not yet
confirmed, that unit's transactions left out by where their commits start (sql.py
`skip`), so the loading unit's WAL is decoded twice; it is done only while a load takes
longer than a read. The slot is moved only once the read is done (a read holds the slot)
and the unit before it committed.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

from chload.core.run import Event, Listener
from chload.errors import SourceError
from chload.runtime.faults import crash_point
from chload.sources.changes.postgres.follow import (
    POLL_SECONDS,
    SESSION,
    UNIT_BYTES,
    Follow,
    check_columns,
    load_unit,
    remove,
    to_native,
)
from chload.sources.changes.postgres.slot import lsn_text
from chload.sources.changes.postgres.sql import changes_query

if TYPE_CHECKING:
    from chload.api import LoadReport, LoadSpec
    from chload.sources.kafka.source import LoadRound


def rounds(spec: LoadSpec, follow: Follow, listener: Listener, load_round: LoadRound,
           report: LoadReport, stop: threading.Event, after: int, until: int | None,
           read: int, spool: str) -> None:
    """Units of `(after, upto]` read from the slot by SQL until `until` (None: until
    stopped), each loaded, then the slot moved (see the module's docstring)."""
    slot = follow.slot
    ahead = ThreadPoolExecutor(1, thread_name_prefix="chload-changes")
    unit: tuple[int, int, str] | None = None  # (after, upto, spool) read, not yet loaded
    took = [0.0, 0.0]  # seconds the last unit took to read, to load
    try:
        while not stop.is_set():
            if unit is None:
                if until is not None and read >= until:
                    return
                now = slot.current()
                upto = min(now, read + UNIT_BYTES, until if until is not None else now)
                listener(Event("lag", follow.stream, bytes=max(0, now - read)))
                if upto <= read:
                    stop.wait(POLL_SECONDS)
                    continue
                check_columns(spec, follow, report)
                path = os.path.join(spool, f"{after}-{upto}.native")
                started = time.monotonic()
                found = _read(follow, upto, path)
                took[0] = time.monotonic() - started
                if not found:  # nothing of this table: the slot
                    remove(path)  # moves on, the ledger does not
                    slot.advance(upto)
                    read = upto
                    if until is None and upto >= now:
                        stop.wait(POLL_SECONDS)
                    continue
                unit = (after, upto, path)
            # read ahead only while a load takes longer than a read: reading ahead decodes
            # the loading unit again, which costs more than it overlaps where reads are
            # the longer part (a busy source, or its cores shared)
            nxt = _read_ahead(follow, ahead, unit[1], until, spool, listener) if (
                took[1] >= took[0]) else None
            started = time.monotonic()
            try:
                load_unit(follow, unit, load_round, report)
                took[1] = time.monotonic() - started
            finally:
                remove(unit[2])
                if nxt is not None:
                    wait([nxt[1]])  # (the slot is busy while it is read)
            crash_point("changes-committed")
            slot.advance(unit[1])
            after = read = unit[1]
            unit = None
            if nxt is not None:
                upto, (any_rows, took[0]) = nxt[0], nxt[1].result()
                path = os.path.join(spool, f"ahead-{upto}.native")
                if any_rows:
                    unit = (after, upto, path)
                else:
                    remove(path)
                    slot.advance(upto)
                    read = upto
    finally:
        ahead.shutdown(wait=True)


def resume(spec: LoadSpec, follow: Follow, load_round: LoadRound, report: LoadReport,
           after: int, upto: int, spool: str) -> int:
    """Into a cluster, the unit `(after, upto]` some shards have committed and others
    lack (a run killed between two shards' commits) read again, that range exactly: the
    slot stands at `after` (or past it over none of the table's changes) and a peek up to
    `upto` gives the transactions whose commit starts before it, those the unit held
    however it was read (streamed or by SQL). Loaded as that unit (its name and identity
    the same), the cluster commits it on the shards lacking it only (targets/cluster
    `_pending`); the slot then moves to `upto`, which is returned."""
    check_columns(spec, follow, report)
    path = os.path.join(spool, f"{after}-{upto}.native")
    try:
        if not _read(follow, upto, path):
            raise SourceError(f"{follow.url.display}: changes {after}-{upto - 1}, committed "
                              "on some shards only, hold no change of the table when read "
                              "again; drop the follow (chload sources --drop) and the table, "
                              "then follow again")
        load_unit(follow, (after, upto, path), load_round, report)
    finally:
        remove(path)
    crash_point("changes-committed")
    follow.slot.advance(upto)
    return upto


def _read_ahead(follow: Follow, ahead: ThreadPoolExecutor, loading: int, until: int | None,
                spool: str, listener: Listener) -> tuple[int, Future[tuple[bool, float]]] | None:
    """The next unit's changes, `(loading, now]`, read on another thread while the unit
    ending at `loading` loads: the slot is read past that unit (its transactions left out)
    and moved only after each commit, so a kill loses or doubles nothing. None when there
    is nothing after it yet, or the source's columns changed (that unit then waits for
    the check `_check_columns` makes before a read)."""
    if until is not None and loading >= until:
        return None
    now = follow.slot.current()
    upto = min(now, loading + UNIT_BYTES, until if until is not None else now)
    listener(Event("lag", follow.stream, bytes=max(0, now - loading)))
    if upto <= loading:
        return None
    seen = follow.slot.describe()
    if [(c.name, c.pg_type) for c in seen.columns] != [
            (c.name, c.pg_type) for c in follow.described.columns]:
        return None
    path = os.path.join(spool, f"ahead-{upto}.native")
    return upto, ahead.submit(_timed_read, follow, upto, path, loading)


def _timed_read(follow: Follow, upto: int, native: str, skip: int) -> tuple[bool, float]:
    started = time.monotonic()
    return _read(follow, upto, native, skip), time.monotonic() - started


def _read(follow: Follow, upto: int, native: str, skip: int | None = None) -> bool:
    """The changes up to `upto` the slot has not confirmed (and, with `skip`, committed
    after `skip`), as rows of the table, into the Native spool `native`; whether it
    holds any."""
    sql = changes_query(follow.slot.name, lsn_text(upto), (follow.url.schema, follow.url.table),
                        follow.url.display, follow.described.columns, follow.key,
                        None if skip is None else lsn_text(skip))
    return to_native(follow, lambda stdin: stdin.write((SESSION + sql + ";\n").encode()),
                     native)
