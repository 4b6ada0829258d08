"""A PostgreSQL table followed into ClickHouse: a copy, then its changes, exactly once.

`chload load postgresql://.../db/schema.table --table T --follow`:

1. `begin` (before anything loads): the followed table is created (table.py: the
   source's columns, `_version`, `_is_deleted`, a ReplacingMergeTree by the primary
   key) and the table's logical replication slot (wal2json) is made if missing. Until
   the ledger holds a unit of changes, the API copies the table first (the database
   source's parallel ranges of the snapshot the new slot exported; a copy cut short is
   finished by the next run at a new snapshot, taken after the slot was made). Every
   change after the slot's start is applied over the copy, and a copied row has
   `_version` 0, below every change: whatever snapshot a range was read at, the table
   ends as the source is.
2. `rounds`: per round, the changes committed in `(after, upto]` (after: the ledger's
   end; upto: the server's WAL position now, at most UNIT_BYTES on) are read by one
   `psql` COPY into a spool (postgres_sql.py: no row in Python), converted by the
   engine into the table's types (Native, as a database range is), and loaded as one
   unit through the committer, named by its position range (table.py). Only after
   the commit is the slot's confirmed position moved to `upto`: a kill at any instant
   leaves the ledger's end, which the next run moves the slot to first, so no change is
   lost (the slot keeps it) or applied twice (the ledger names it).
   While a unit loads, the next one (`(upto, now]`) is read on another thread
   (`_read_ahead`): the slot is read past the unit not yet confirmed, that unit's
   transactions left out by where their commits start (postgres_sql.py `skip`), and the
   slot is moved only once the read is done (a read holds the slot) and the unit before
   it committed.
3. Without --follow, rounds go on until the position the run started at is applied.

Each round first compares the source's columns with the table's: a new column is
added (--on-new-column add, core/evolve.py), any other change stops the follow in one
line, with nothing consumed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from chload.core.evolve import evolve_described
from chload.core.run import Event, Listener
from chload.errors import ChloadError, SchemaError, SourceError, UsageError
from chload.formats import FileFormat
from chload.runtime import stopping
from chload.runtime.faults import crash_point
from chload.schema import Column, bare_type, parse_structure, quote_ident, quote_str, structure
from chload.sources import pipes as db_pipes
from chload.sources.base import SourceFile, StreamPosition
from chload.sources.changes import table as changes_table
from chload.sources.changes.postgres_slot import (
    Described,
    Slot,
    lsn_text,
    slot_name,
    stream_name,
)
from chload.sources.changes.postgres_sql import changes_query, stopped
from chload.sources.databases.postgres_psql import (
    Control,
    client_env,
    connection_args,
    find_psql,
)
from chload.sources.databases.table import DbUrl, parse_url

if TYPE_CHECKING:
    from chload.api import LoadReport, LoadSpec
    from chload.sources.kafka.source import LoadRound
    from chload.targets.base import Target

UNIT_BYTES = 256 << 20  # of WAL a unit spans at most (its changes: fewer bytes)
POLL_SECONDS = 0.5  # --follow: how often the server's position is read when idle
NATIVE = FileFormat("Native", "none")
_SESSION = "SET DateStyle = ISO; SET extra_float_digits = 1; SET bytea_output = hex; "


def is_postgres(sources: Sequence[str]) -> bool:
    return len(sources) == 1 and sources[0].split("://")[0].lower() in ("postgresql",
                                                                         "postgres")


class Follow:
    """One followed table of one run: its url, slot, stream name, described columns."""

    def __init__(self, spec: LoadSpec, target: Target, table: Any) -> None:
        if spec.query:
            raise UsageError("--follow of a --query: follow a table (name it in the URL)")
        self.url: DbUrl = parse_url(spec.sources[0], None)
        self.slot = Slot(self.url, slot_name(target.display, table.display,
                                             self.url.with_user))
        self.stream = stream_name(self.url, self.slot.name)
        self.target, self.table, self.schema = target, table, spec.schema
        self.exported: Control | None = None  # a new slot's connection, while copying
        self.snapshot: str | None = None  # the snapshot it exported
        self.stored: list[Column] | None = None  # the table's columns, as last checked
        try:
            self.described: Described = self.slot.describe()
            self.key = changes_table.key_of(self.described.key, spec.upsert_key,
                                            self.url.display)
            if not self.described.key and self.described.identity != "f":
                raise UsageError(f"{self.url.display}: --upsert-key without a primary key "
                                 "needs REPLICA IDENTITY FULL at the source (deletes name "
                                 "their row by it): ALTER TABLE ... REPLICA IDENTITY FULL")
        except BaseException:
            self.slot.close()
            raise

    def close(self) -> None:
        if self.exported is not None:
            self.exported.stop()
        self.slot.close()

    def begin(self) -> bool:
        """The table and the slot made if missing; whether the table is to be copied
        first (no unit of changes in the ledger yet)."""
        self.target.recover(self.table.sql)
        given = {c.name: c.type for c in parse_structure(self.schema)} if self.schema else {}
        created = changes_table.ensure_table(
            self.target, self.table.sql, self.table.display,
            [Column(c.name, given.get(c.name, c.type)) for c in self.described.db_columns],
            self.key)
        end = changes_table.committed_end(self.target, self.table.display, self.stream)
        if end is not None and not self.slot.exists():
            raise SourceError(f"{self.url.display}: the replication slot {self.slot.name} this "
                              "follow reads is gone; drop the follow (chload sources --drop "
                              f"{self.table.display}) and the table, then follow again")
        if end is None and created and self.slot.exists():
            self.slot.drop()  # a slot left by a follow whose table was dropped since
        if not self.slot.exists():
            self.exported, self.snapshot = self.slot.create()
        return end is None


# --------------------------------------------------------------------------- rounds

def rounds(spec: LoadSpec, target: Target, listener: Listener, load_round: LoadRound,
           table: Any, report: LoadReport, stop: threading.Event) -> None:
    follow = Follow(spec, target, table)
    try:
        with _stopping(spec.follow, stop):
            _rounds(spec, follow, listener, load_round, report, stop)
    finally:
        follow.close()


def _rounds(spec: LoadSpec, follow: Follow, listener: Listener, load_round: LoadRound,
            report: LoadReport, stop: threading.Event) -> None:
    slot, target, table = follow.slot, follow.target, follow.table
    report.recovered += target.recover(table.sql)
    end = changes_table.committed_end(target, table.display, follow.stream)
    # the ledger's end (0: none yet; the first unit spans all before it); the slot is
    # moved to it first: a commit whose slot move a kill cut short
    after = end or 0
    slot.advance(after)
    until = None if spec.follow else slot.current()
    read = max(after, slot.confirmed())  # where reading stands: ahead of `after` only
    # over ranges with no change of the table
    spool = tempfile.mkdtemp(prefix="changes-", dir=_workdir(target))
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
                _check_columns(spec, follow, report)
                path = os.path.join(spool, f"{after}-{upto}.native")
                started = time.monotonic()
                found = _read(follow, upto, path)
                took[0] = time.monotonic() - started
                if not found:  # nothing of this table: the slot
                    _remove(path)  # moves on, the ledger does not
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
                _load(follow, unit, load_round, report)
                took[1] = time.monotonic() - started
            finally:
                _remove(unit[2])
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
                    _remove(path)
                    slot.advance(upto)
                    read = upto
    finally:
        ahead.shutdown(wait=True)
        shutil.rmtree(spool, ignore_errors=True)


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


def _load(follow: Follow, unit: tuple[int, int, str], load_round: LoadRound,
          report: LoadReport) -> None:
    """The unit `(after, upto]` read into `path`, committed, or one line saying why not."""
    after, upto, path = unit
    target, table = follow.target, follow.table
    source = _unit(follow, after, upto, path)
    crash_point("changes-round")
    done = load_round([source], 1, None)
    _add(report, done)
    result = next((r for r in done.files if r.uri == source.uri), None)
    if result is None or result.status != "loaded":
        why = result.error if result is not None else "it was not committed"
        raise SourceError(f"{follow.url.display}: changes {source.uri.rpartition('/')[2]}"
                          f" not applied: {why}; run again to go on from the "
                          "ledger's position")
    if changes_table.committed_end(target, table.display, follow.stream) != upto:
        raise SourceError(f"{follow.url.display}: changes {source.uri.rpartition('/')[2]}"
                          " were not committed (another run follows this table into "
                          f"{table.display}?); the slot was not moved: run again")


def _read(follow: Follow, upto: int, native: str, skip: int | None = None) -> bool:
    """The changes up to `upto` the slot has not confirmed (and, with `skip`, committed
    after `skip`), as rows of the table: psql writes them (postgres_sql.py) into a pipe
    that the engine converts into the table's types as it reads (`_convert`), into the
    Native spool `native`; whether it holds any."""
    sql = changes_query(follow.slot.name, lsn_text(upto), (follow.url.schema, follow.url.table),
                        follow.url.display, follow.described.columns, follow.key,
                        None if skip is None else lsn_text(skip))
    psql = find_psql()
    read_end, write_end = db_pipes.make()
    with tempfile.TemporaryFile() as errors:
        try:
            proc = subprocess.Popen([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1",
                                     *connection_args(follow.url)], stdin=subprocess.PIPE,
                                    stdout=write_end, stderr=errors,
                                    env=client_env(follow.url, psql))
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        failed: ChloadError | None = None
        try:
            assert proc.stdin is not None
            proc.stdin.write((_SESSION + sql + ";\n").encode())
            proc.stdin.close()
            _convert(follow, f"/dev/fd/{read_end}", native)
        except ChloadError as exc:
            failed = exc
        finally:
            if failed is not None or proc.poll() is None and not _drained(read_end):
                proc.kill()  # (the engine stopped reading: psql would wait on the pipe)
            code = proc.wait()
            os.close(read_end)
        errors.seek(0)
        said = errors.read().decode(errors="replace")
    if code:
        line = stopped(said)
        if line:
            raise SchemaError(line)
        first = next((x for x in said.splitlines() if "ERROR" in x or "FATAL" in x),
                     said.strip().splitlines()[0] if said.strip() else f"psql exit {code}")
        raise SourceError(f"{follow.url.display}: reading changes: {first.strip()}")
    if failed is not None:
        raise failed
    # (the engine writes nothing for no rows: no second query to count them)
    return os.path.exists(native) and os.path.getsize(native) > 0


def _drained(fd: int) -> bool:
    """Whether the pipe's writer has closed it and nothing is left to read."""
    import select

    ready, _, _ = select.select([fd], [], [], 0)
    return bool(ready) and not os.read(fd, 1)


def _convert(follow: Follow, path: str, native: str) -> None:
    """The TSV at `path` (as the copy's COPY prints it) converted by the engine into the
    table's types, as Native: what both targets read."""
    target, table = follow.target, follow.table
    if follow.stored is None:
        follow.stored = target.table_columns(table.sql) or []
    stored = {c.name: c.type for c in follow.stored}
    own = follow.described.db_columns
    # a column the table keeps as String (--schema) is the source's text, as copied
    read = [Column(c.name, "Nullable(String)" if not c.expr and bare_type(
        stored.get(c.name, c.type)) == "String" else c.spool_type) for c in own] + [
        Column(changes_table.VERSION, "UInt64"), Column(changes_table.DELETED, "UInt8")]
    exprs = [f"CAST({c.expr or quote_ident(c.name)} AS {stored.get(c.name, c.type)}) AS "
             f"{quote_ident(c.name)}" for c in own] + [
        quote_ident(changes_table.VERSION), quote_ident(changes_table.DELETED)]
    target.infer_rows(
        f"INSERT INTO FUNCTION file({quote_str(native)}, 'Native') SELECT {', '.join(exprs)} "
        f"FROM file({quote_str(path)}, 'TSV', {quote_str(structure(read))}) "
        "SETTINGS input_format_null_as_default = 1")


def _unit(follow: Follow, after: int, upto: int, native: str) -> SourceFile:
    """The Native spool as the unit of `(after, upto]`."""
    uri = changes_table.unit_uri(follow.stream, after, upto)
    return SourceFile(uri, os.path.getsize(native), 0, NATIVE,
                      etag=f"{follow.slot.name}:{after}-{upto}", local_path=native,
                      position=StreamPosition(follow.stream, after))


def _check_columns(spec: LoadSpec, follow: Follow, report: LoadReport) -> None:
    """The source's columns as they are now against those followed (this run's, and
    the table's): new ones added (--on-new-column add), any other change stops the
    follow in one line."""
    now = follow.slot.describe()
    before = {c.name: c.pg_type for c in follow.described.columns}
    after = {c.name: c.pg_type for c in now.columns}
    existing = follow.stored = follow.target.table_columns(follow.table.sql) or []
    kept = [c.name for c in existing if c.name not in (changes_table.VERSION,
                                                         changes_table.DELETED)]
    where = follow.url.display
    for name in [*before, *(k for k in kept if k not in before)]:
        if name not in after:
            raise SchemaError(f"{where}: column {name} was dropped or renamed at the source; "
                              "the follow stopped with nothing lost: drop the follow (chload "
                              "sources --drop) and load the table again")
        if name in before and after[name] != before[name]:
            raise SchemaError(f"{where}: column {name} changed type from {before[name]} to "
                              f"{after[name]}; the follow stopped with nothing lost: drop "
                              "the follow (chload sources --drop) and load the table again")
    new = [c for c in now.db_columns if c.name not in kept]
    if new and spec.on_new_column != "add":
        raise SchemaError(f"{where}: column {new[0].name} was added at the source; follow with "
                          "--on-new-column add to add it to the table (nothing was lost)")
    if new:
        evolution = evolve_described(follow.target, follow.table.sql, follow.table.display,
                                     [Column(c.name, c.type) for c in now.db_columns],
                                     existing, follow.stream)
        report.schema_changes += [c.as_dict() for c in evolution.changes]
        follow.stored = None  # (read again when next asked)
    follow.described = now


def _add(report: LoadReport, done: LoadReport) -> None:
    report.add_units(done.files)
    report.created_table = report.created_table or done.created_table


def _workdir(target: Target) -> str:
    path = os.path.join(target.workdir, "tmp")
    os.makedirs(path, exist_ok=True)
    return path


def _remove(*paths: str) -> None:
    for p in paths:
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


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
    name = slot_name(target.display, table.display, url.with_user)
    return changes_table.committed_end(target, table.display, stream_name(url, name)) is not None
