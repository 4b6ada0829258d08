"""A followed table's changes streamed once (replication.py), loaded unit by unit.

While a unit converts and loads, the stream's thread goes on spooling what the server
sends: the next unit is what came meanwhile, each change decoded once. A unit is a
segment the stream sealed at a safe position `upto` (every transaction whose commit
starts before it, none after), named `(after, upto]` after the ledger's end `after`.
Its changes, one JSON text a line, go to PostgreSQL in one `psql` session (COPY FROM
STDIN into a temporary table) and come back as the table's rows by the same COPY the
SQL path runs over the slot (sql.py `changes_query`), into the engine's Native spool:
no row in Python. Only after the unit's commit is the stream told to confirm `upto`.
"""

from __future__ import annotations

import shutil
import threading
from typing import IO, TYPE_CHECKING

from chload.core.run import Event, Listener
from chload.runtime.faults import crash_point
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
    confirmed. Without --follow the run ends once the server said it sent everything
    before `until` (its sent position reaches every record flushed, so it gets there)."""
    read = stream.start  # (not `safe`: the thread moves it before a unit is sealed there)
    encoding = str(follow.slot.one("SHOW server_encoding")[0])
    idle = False
    while not stop.is_set():
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
        if idle:
            remove(segment.path)
            if segment.upto > read:  # nothing of this table: the slot moves on
                stream.confirm(segment.upto)
                read = segment.upto
            continue
        listener(Event("lag", follow.stream, bytes=max(0, follow.slot.current() - read)))
        check_columns(spec, follow, report)
        native = f"{segment.path}.native"
        try:
            found = _convert(follow, segment, native, encoding)
            remove(segment.path)
            if found:
                load_unit(follow, (after, segment.upto, native), load_round, report)
        finally:
            remove(segment.path, native)
        if found:
            crash_point("changes-committed")
            after = segment.upto
        stream.confirm(segment.upto)
        read = segment.upto


def _convert(follow: Follow, segment: Segment, native: str, encoding: str) -> bool:
    """The segment's changes as the table's rows, in the Native spool `native`."""
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

