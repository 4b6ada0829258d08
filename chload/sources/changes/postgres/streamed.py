"""A followed table's changes streamed once (replication.py), loaded unit by unit.

While a unit loads, the stream's thread goes on spooling what the server sends, and the
next unit (what came meanwhile, each change decoded once) is taken and converted on
another thread. A unit is a
segment the stream sealed at a safe position `upto` (every transaction whose commit
starts before it, none after), named `(after, upto]` after the ledger's end `after`.
Its changes, one JSON text a line, are made the table's rows by the engine where the
table's types allow (engine_rows.py), else in PostgreSQL: one `psql` session (COPY FROM
STDIN into a temporary table) gives them back as the table's rows by the same COPY the
SQL path runs over the slot (sql.py `changes_query`); either way into the engine's
Native spool, no row in Python. Only after the unit's commit is the stream told to
confirm `upto`.
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from chload.core.run import Event, Listener
from chload.runtime.faults import crash_point
from chload.sources.changes.postgres import engine_rows
from chload.sources.changes.postgres.follow import (
    POLL_SECONDS,
    SESSION,
    Follow,
    check_columns,
    load_unit,
    remove,
    to_native,
)
from chload.sources.changes.postgres.replication import Segment, Stream
from chload.sources.changes.postgres.slot import lsn_text
from chload.sources.changes.postgres.sql import changes_query, text

if TYPE_CHECKING:
    from chload.api import LoadReport, LoadSpec
    from chload.sources.kafka.source import LoadRound

SPOOLED = "pg_temp.chload_changes"


def rounds(spec: LoadSpec, follow: Follow, listener: Listener, load_round: LoadRound,
           report: LoadReport, stop: threading.Event, after: int, until: int | None,
           stream: Stream) -> None:
    """Units taken from `stream` until `until` (None: until stopped), each loaded, then
    confirmed; while one loads, the next is taken and converted on another thread (the
    stream spools on meanwhile). Without --follow the run ends once the server said it
    sent everything before `until` (its sent position reaches every record flushed, so
    it gets there)."""
    read = stream.start  # (not `safe`: the thread moves it before a unit is sealed there)
    encoding = str(follow.slot.one("SHOW server_encoding")[0])
    ahead = ThreadPoolExecutor(1, thread_name_prefix="chload-convert")
    unit: Converted | None = None
    idle = False
    try:
        while not stop.is_set():
            if unit is None:
                if until is not None and read >= until:
                    return
                if idle:
                    stream.wait_changes(POLL_SECONDS)
                    if stop.is_set():
                        return
                segment = stream.take(POLL_SECONDS)
                if segment is None:
                    continue
                idle = segment.changes == 0
                if not idle:
                    listener(Event("lag", follow.stream,
                                   bytes=max(0, follow.slot.current() - read)))
                    check_columns(spec, follow, report)
                unit = _converted(follow, segment, encoding, stream.session_set)
            nxt = ahead.submit(_next, follow, stream, encoding) if unit.found and (
                until is None or unit.segment.upto < until) else None
            try:
                if unit.found:
                    load_unit(follow, (after, unit.segment.upto, unit.native), load_round,
                              report)
            finally:
                remove(unit.native)
                if nxt is not None:
                    wait([nxt])
            if unit.found:
                crash_point("changes-committed")
                after = unit.segment.upto
            if unit.segment.upto > read:  # (a unit with nothing of this table too)
                stream.confirm(unit.segment.upto)
                read = unit.segment.upto
            unit = nxt.result() if nxt is not None else None
            if unit is not None and unit.found:
                listener(Event("lag", follow.stream, bytes=max(0, follow.slot.current() - read)))
    finally:
        ahead.shutdown(wait=True)
        if unit is not None:
            remove(unit.native)


@dataclass(slots=True)
class Converted:
    """A segment taken from the stream, its rows in the Native spool `native` (if any)."""

    segment: Segment
    native: str
    found: bool


def _converted(follow: Follow, segment: Segment, encoding: str,
               session_set: bool) -> Converted:
    native = f"{segment.path}.native"
    try:
        found = segment.changes > 0 and _convert(follow, segment, native, encoding,
                                                   session_set)
    finally:
        remove(segment.path)
    return Converted(segment, native, found)


def _next(follow: Follow, stream: Stream, encoding: str) -> Converted | None:
    """The next unit, taken and converted while one loads; None when none came within
    POLL_SECONDS, or the source's columns changed (it is then taken after the check
    `check_columns` makes before a conversion)."""
    segment = stream.take(POLL_SECONDS)
    if segment is None:
        return None
    if segment.changes:
        seen = follow.slot.describe()
        if [(c.name, c.pg_type) for c in seen.columns] != [
                (c.name, c.pg_type) for c in follow.described.columns]:
            stream.put_back(segment)
            return None
    return _converted(follow, segment, encoding, stream.session_set)


def _convert(follow: Follow, segment: Segment, native: str, encoding: str,
             session_set: bool) -> bool:
    """The segment's changes as the table's rows, in the Native spool `native`: by the
    engine where it can (engine_rows.py), else through psql."""
    if engine_rows.eligible(follow, encoding, session_set):
        return engine_rows.convert(follow, segment.path, native)
    sql = changes_query(follow.slot.name, lsn_text(segment.upto),
                        (follow.url.schema, follow.url.table), follow.url.display,
                        follow.described.columns, follow.key, spooled=SPOOLED)
    # CSV whose quote and delimiter (0x01, 0x02) JSON text never holds: each line as sent
    head = (f"{SESSION}CREATE TEMPORARY TABLE chload_changes (data text); COPY {SPOOLED} "
            "FROM STDIN (FORMAT csv, DELIMITER E'\\x02', QUOTE E'\\x01', ENCODING "
            f"{text(encoding)});\n")

    def feed(stdin: IO[bytes]) -> None:
        stdin.write(head.encode())
        with open(segment.path, "rb") as spooled:
            shutil.copyfileobj(spooled, stdin, 1 << 20)
        stdin.write(f"\\.\n{sql};\n".encode())

    return to_native(follow, feed, native)

