"""A followed PostgreSQL table: its slot and columns (`Follow`), where its rounds start,
and what both ways of reading its changes share (streamed.py, peeked.py): a unit's rows
printed by `psql` (sql.py's COPY) converted by the engine into the table's types as
Native (`to_native`), loaded through the committer and checked in the ledger
(`load_unit`), the source's columns compared with the table's (`check_columns`).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from chload.core.evolve import evolve_described
from chload.errors import ChloadError, SchemaError, SourceError, UsageError
from chload.formats import FileFormat
from chload.runtime.faults import crash_point
from chload.schema import Column, bare_type, parse_structure, quote_ident, quote_str, structure
from chload.sources import pipes as db_pipes
from chload.sources.base import SourceFile, StreamPosition
from chload.sources.changes import table as changes_table
from chload.sources.changes.postgres.slot import (
    Described,
    Slot,
    slot_name,
    stream_name,
)
from chload.sources.changes.postgres.sql import stopped
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
SESSION = "SET DateStyle = ISO; SET extra_float_digits = 1; SET bytea_output = hex; "


class Follow:
    """One followed table of one run: its url, slot, stream name, described columns."""

    def __init__(self, spec: LoadSpec, target: Target, table: Any) -> None:
        if spec.query:
            raise UsageError("--follow of a --query: follow a table (name it in the URL)")
        self.url: DbUrl = parse_url(spec.sources[0], None)
        self.slot = Slot(self.url, slot_name(changes_table.where_followed(target),
                                             table.display, self.url.with_user))
        self.stream = stream_name(self.url, self.slot.name)
        self.target, self.table, self.schema = target, table, spec.schema
        self.spec = spec
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
        first (no unit of changes in the ledger yet). A Distributed table is looked at
        through its cluster (its shards' tables and ledgers)."""
        spec = self.spec
        if spec.cluster and self.target.table_columns(self.table.sql) is None:
            return self._begin(self.target)  # (made on the cluster by ensure_table)
        with self.target.for_table(self.table.sql, spec.shards, spec.shard_by,
                                   os.environ) as target:
            return self._begin(target)

    def _begin(self, target: Target) -> bool:
        target.recover(self.table.sql)
        given = {c.name: c.type for c in parse_structure(self.schema)} if self.schema else {}
        created = changes_table.ensure_table(
            target, self.table.sql, self.table.display,
            [Column(c.name, given.get(c.name, c.type)) for c in self.described.db_columns],
            self.key, self.spec.cluster, self.spec.shards, os.environ)
        end, pending = changes_table.resume_point(target, self.table.display, self.stream)
        if pending is not None:  # (a unit on some shards only: the copy was done)
            end = pending[0]
        if end is not None and not self.slot.exists():
            raise SourceError(f"{self.url.display}: the replication slot {self.slot.name} this "
                              "follow reads is gone; drop the follow (chload sources --drop "
                              f"{self.table.display}) and the table, then follow again")
        if end is None and created and self.slot.exists():
            self.slot.drop()  # a slot left by a follow whose table was dropped since
        if not self.slot.exists():
            self.exported, self.snapshot = self.slot.create()
        return end is None


def start(spec: LoadSpec, follow: Follow, report: LoadReport
          ) -> tuple[int, int | None, int, int | None]:
    """Where the rounds start: the ledger's end `after` (0: none yet; the first unit
    spans all before it), to which the slot is moved first (a commit whose slot move a
    kill cut short); `until`, without --follow, the source's position now; `read`, where
    reading stands (ahead of `after` only over ranges with no change of the table); and
    into a cluster, the end of a unit `(after, upto]` some shards have committed and
    others lack, to be read again first (peeked.resume), else None."""
    target, table = follow.target, follow.table
    report.recovered += target.recover(table.sql)
    end, pending = changes_table.resume_point(target, table.display, follow.stream)
    after = end or 0
    follow.slot.advance(after)
    until = None if spec.follow else follow.slot.current()
    return (after, until, max(after, follow.slot.confirmed()),
            None if pending is None else pending[1] + 1)


def load_unit(follow: Follow, unit: tuple[int, int, str], load_round: LoadRound,
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


def to_native(follow: Follow, feed: Callable[[IO[bytes]], object], native: str) -> bool:
    """The rows a `psql` script prints (`feed` writes it to psql's stdin: the COPY of a
    unit's changes, sql.py) read through a pipe that the engine converts into the table's
    types as it reads (`typed_native`), into the Native spool `native`; whether it holds any."""
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
            try:
                feed(proc.stdin)
                proc.stdin.close()
            except BrokenPipeError:  # psql stopped at an error: its stderr says which
                pass
            typed_native(follow, f"/dev/fd/{read_end}", native)
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


def typed_native(follow: Follow, path: str, native: str) -> None:
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


def check_columns(spec: LoadSpec, follow: Follow, report: LoadReport) -> None:
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


def workdir(target: Target) -> str:
    path = os.path.join(target.workdir, "tmp")
    os.makedirs(path, exist_ok=True)
    return path


def remove(*paths: str) -> None:
    for p in paths:
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


