"""A PostgreSQL table followed into ClickHouse: a copy, then its changes, exactly once.

`chload load postgresql://.../db/schema.table --table T --follow`:

1. `begin` (follow.py, before anything loads): the followed table is created (table.py:
   the source's columns, `_version`, `_is_deleted`, a ReplacingMergeTree by the primary
   key) and the table's logical replication slot (wal2json) is made if missing. Until
   the ledger holds a unit of changes, the API copies the table first (the database
   source's parallel ranges of the snapshot the new slot exported; a copy cut short is
   finished by the next run at a new snapshot, taken after the slot was made). Every
   change after the slot's start is applied over the copy, and a copied row has
   `_version` 0, below every change: whatever snapshot a range was read at, the table
   ends as the source is.
2. `rounds`: the slot's changes streamed over a replication connection (replication.py,
   streamed.py: each change decoded once, the stream going on while a unit loads; a
   unit's rows made by the engine from the spooled JSON where the types allow,
   engine_rows.py, else through psql), or,
   where no replication connection can be had, read by SQL (peeked.py); either way
   loaded as units of WAL ranges `(after, upto]` through the committer, and the slot's
   confirmed position moved to `upto` only after the unit's commit: a kill at any
   instant leaves the ledger's end, which the next run moves the slot to first, so no
   change is lost (the slot keeps it) or applied twice (the ledger names it).
3. Without --follow, rounds go on until the position the run started at is applied.

Into a cluster each unit commits on every shard, each with its own ledger: a kill
between two shards' commits leaves a unit some shards have. The next run reads that
range again first, by SQL (peeked.resume: the slot still stands before it), and the
cluster commits it on the shards lacking it only; the slot moves past it only then.

Each unit first compares the source's columns with the table's: a new column is added
(--on-new-column add, core/evolve.py), any other change stops the follow in one line,
with nothing consumed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from chload.core.run import Listener
from chload.errors import UsageError
from chload.runtime import stopping
from chload.sources.changes import table as changes_table
from chload.sources.changes.postgres import peeked, stream_native, streamed
from chload.sources.changes.postgres.follow import Follow, start, workdir
from chload.sources.changes.postgres.replication import Stream, Unavailable
from chload.sources.changes.postgres.slot import slot_name, stream_name
from chload.sources.databases.table import parse_url

if TYPE_CHECKING:
    from chload.api import LoadReport, LoadSpec
    from chload.schema import Column
    from chload.sources.kafka.source import LoadRound
    from chload.targets.base import Target

__all__ = ["Changes", "Follow", "followed", "is_postgres", "rounds"]
BY_SQL = "CHLOAD_CHANGES_BY_SQL"  # set to 1: read by SQL even where a stream can be had


def is_postgres(sources: Sequence[str]) -> bool:
    return len(sources) == 1 and sources[0].split("://")[0].lower() in ("postgresql",
                                                                         "postgres")


def rounds(spec: LoadSpec, target: Target, listener: Listener, load_round: LoadRound,
           table: Any, report: LoadReport, stop: threading.Event) -> None:
    follow = Follow(spec, target, table)
    spool = tempfile.mkdtemp(prefix="changes-", dir=workdir(target))
    try:
        with _stopping(spec.follow, stop):
            after, until, read, cut = start(spec, follow, report)
            if cut is not None:  # a unit on some shards only: theirs first, that range
                after = read = peeked.resume(spec, follow, load_round, report, after, cut,
                                             spool)
            stream = _stream(follow, read, spool, report)
            if stream is None:
                peeked.rounds(spec, follow, listener, load_round, report, stop, after, until,
                              read, spool)
                return
            try:
                streamed.rounds(spec, follow, listener, load_round, report, stop, after,
                                until, stream)
            finally:
                stream.close()
    finally:
        follow.close()
        shutil.rmtree(spool, ignore_errors=True)


def _stream(follow: Follow, read: int, spool: str, report: LoadReport) -> Stream | None:
    """The slot streamed from `read`, or None where that cannot be had: the SQL path,
    said in one line of the report."""
    if os.environ.get(BY_SQL) == "1":
        return None
    try:
        stream = Stream(follow.url, follow.slot.name, (follow.url.schema, follow.url.table),
                        read, spool)
    except Unavailable as why:
        report.notes.append(f"{follow.url.display}: changes read by SQL, not streamed (slower: "
                            f"each unit decoded by a query): {why}")
        return None
    if stream.native is None and stream.native_why not in ("", stream_native.CHOSEN):
        report.notes.append(f"{follow.url.display}: changes streamed by the Python reader, "
                            f"slower: {stream.native_why}")
    return stream


@contextmanager
def _stopping(follow: bool, stop: threading.Event) -> Iterator[None]:
    """With --follow on another thread than the main one (a pipelines file), the run
    ends with runtime.stopping.stop_following; on the main one the API has set SIGINT
    and SIGTERM to set `stop` already."""
    if not follow or threading.current_thread() is threading.main_thread():
        yield
        return
    with stopping.registered(stop):
        yield
class Changes:
    """The `Stream` (sources/base.py) of a followed table, for the API's rounds."""

    def __init__(self, stop: threading.Event, on_new_column: str = "fail") -> None:
        self.stop, self.on_new_column = stop, on_new_column

    def rounds(self, spec: LoadSpec, target: Target, listener: Listener,
               load_round: LoadRound, table: Any, report: LoadReport) -> None:
        spec = replace(spec, on_new_column=self.on_new_column)
        rounds(spec, target, listener, load_round, table, report, self.stop)

    def audit_columns(self, target: Target, data: list[Column], fmt: str,
                      inferred: bool) -> list[Column]:
        raise UsageError("--audit with --follow of a table: the change columns "
                         f"({changes_table.VERSION}, {changes_table.DELETED}) say where a "
                         "row comes from; leave out --audit")


def followed(spec: LoadSpec, target: Target) -> bool:
    """Whether spec.table follows the source (its change columns, or changes of it in
    the ledger): a run without --follow then applies its changes up to now."""
    if spec.query:
        return False
    from chload.core.load import default_database
    from chload.core.plan import parse_table

    table = parse_table(spec.table, default_database(target))
    names = {c.name for c in target.table_columns(table.sql) or []}
    if {changes_table.VERSION, changes_table.DELETED} <= names:
        return True  # a followed table (whose first copy may not be complete)
    url = parse_url(spec.sources[0], None)
    name = slot_name(changes_table.where_followed(target), table.display, url.with_user)
    return changes_table.resume_point(target, table.display,
                                      stream_name(url, name)) != (None, None)
