"""A MySQL/MariaDB table followed from its binlog (ROW format), exactly once.

First run: the binlog position is read, then the table is copied by the parallel range
readers (databases/mysql.py) into a table of its own (mysql_table.py), its rows at
version 0, and an empty unit ending at that position is committed: the snapshot is
done. Then the binlog is read from the ledger's end (mysql_binlog.py), unit by unit of
whole transactions, each unit `mysql-changes://host:port/db/table/<first>-<last>`
(positions as mysql_table.position numbers) committed through the committer with the
stream rule of the ledger (sources.StreamPosition: a unit commits only where the
stream's committed end is still its first position).

Why the position is read before the copy and not under its lock: every change after it
is replayed with a higher version than the copy's rows, and a ROW event carries whole
rows, so a change the copy saw already is applied again to the same value; a change it
missed is applied. A copy cut short is started over (its rows count only with the
unit that ends at its position). docs/sources-databases.md "Change capture".
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from chload.commit.ledger import COMMITTING, LOADED, own_history
from chload.core.run import Listener
from chload.errors import SourceError, UsageError
from chload.formats import FileFormat
from chload.runtime.faults import crash_point
from chload.schema import Column, structure
from chload.sources.base import RemoteSource, SourceContext, SourceFile, StreamPosition
from chload.sources.changes import (
    mysql_binlog_native as binlog_native,
    mysql_table,
    table as changes_table,
)
from chload.sources.changes.mysql_binlog import BinlogReader, Cut, Layout, layout_of
from chload.sources.changes.mysql_rows import escaped
from chload.sources.databases.base import storable
from chload.sources.databases.mysql_columns import column_of
from chload.sources.databases.table import DbUrl, parse_url

if TYPE_CHECKING:
    from chload.api import LoadReport, LoadSpec
    from chload.sources.base import LoadRound
    from chload.targets.base import Target

SCHEME = "mysql-changes://"
BATCH_ROWS = 500_000
BATCH_SECONDS = 1.0
LoadTable = Callable[["LoadSpec"], "LoadReport"]
_REQUIRED = (("log_bin", "1", "log-bin (the binary log)"),
             ("binlog_format", "ROW", "binlog_format=ROW"),
             ("binlog_row_image", "FULL", "binlog_row_image=FULL"),
             ("binlog_row_metadata", "FULL", "binlog_row_metadata=FULL"))
# a unit's spool: its columns named on its first line, so no load guesses whether it has
# a header
_TSV = FileFormat("TSVWithNames", "none")
_EMPTY = FileFormat("TSV", "none")  # the unit that ends the copy


class Server:
    """The control connection (pymysql): settings, positions, columns."""

    def __init__(self, url: DbUrl) -> None:
        import pymysql

        self.url = url
        self.password = url.password if url.password is not None else os.environ.get(
            "MYSQL_PWD")
        self.settings = {"host": url.host, "port": url.port, "user": url.user,
                         "passwd": self.password or ""}
        try:
            self.conn = pymysql.connect(host=url.host, port=url.port, user=url.user or None,
                                        password=self.password or "", database=url.database,
                                        connect_timeout=10, charset="utf8mb4",
                                        autocommit=True)
        except pymysql.Error as exc:
            raise SourceError(f"{url.display}: {exc.args[-1] if exc.args else exc}") from None

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import pymysql

        try:
            with self.conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        except pymysql.Error as exc:
            raise SourceError(f"{self.url.display}: {exc.args[-1] if exc.args else exc}"
                              ) from None

    def check_binlog(self) -> None:
        """One line naming the first setting change capture needs that the server lacks."""
        for name, wanted, setting in _REQUIRED:
            found = self.rows(f"SELECT @@{name}")[0][0]
            if str(found).upper() != wanted:
                raise UsageError(f"{self.url.display}: the server has {name}={found}; change "
                                 f"capture reads the binlog with {setting}: set it in the "
                                 "server's configuration and restart it")

    def master(self) -> tuple[str, int]:
        found = self.rows("SHOW MASTER STATUS")
        if not found:
            raise UsageError(f"{self.url.display}: SHOW MASTER STATUS is empty: the binary "
                             "log is off (start the server with log-bin)")
        return str(found[0][0]), int(found[0][1])

    def columns(self) -> tuple[list[tuple[str, str, bool]], list[str]]:
        """(name, type, nullable) in table order, and the primary key."""
        found = self.rows("SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_KEY FROM "
                          "information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND "
                          "TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                          (self.url.schema, self.url.table))
        if not found:
            raise SourceError(f"{self.url.display}: no such table (or no right to see it)")
        key = self.rows("SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE "
                        "TABLE_SCHEMA = %s AND TABLE_NAME = %s AND CONSTRAINT_NAME = "
                        "'PRIMARY' ORDER BY ORDINAL_POSITION", (self.url.schema, self.url.table))
        return ([(str(r[0]), str(r[1]).lower(), r[2] == "YES") for r in found],
                [str(k[0]) for k in key])

    def close(self) -> None:
        self.conn.close()


def stream_of(url: DbUrl) -> str:
    return f"{SCHEME}{url.host}:{url.port}/{url.database}/{url.table}"


def committed_end(target: Target, table: Any, stream: str) -> int | None:
    """The stream's committed end in the table's own history (None: no unit yet); into a
    cluster, of the units every shard has (table.py)."""
    return resume_point(target, table, stream)[0]


def resume_point(target: Target, table: Any,
                 stream: str) -> tuple[int | None, tuple[int, int] | None]:
    """`committed_end`, and into a cluster the unit `(first, last)` some shards have
    committed and others lack (table.resume_point), to be read again first."""
    if getattr(target, "dist", None) is not None:
        return changes_table.resume_point(target, table.display, stream)
    live = {e.uri: e for e in target.ledger.latest(table.display)
            if e.uri.startswith(stream + "/") and e.state in (COMMITTING, LOADED)}
    own, _ = own_history(target.ledger.table_state(table.database, table.name), live)
    ends = [int(uri.rpartition("-")[2]) + 1 for uri in own]
    return (max(ends) if ends else None), None


def target_columns(target: Target, source: Sequence[tuple[str, str, bool]]) -> list[Column]:
    return [Column(name, storable(column_of(name, typ, nulls).type, target.has_type))
            for name, typ, nulls in source]


class MysqlChanges(RemoteSource):
    """mysql:// followed (--follow, or a table whose ledger holds its change stream):
    a `Stream` whose units are binlog position ranges spooled to local TSV files."""

    kind = "mysql-changes"
    schemes: tuple[str, ...] = ()
    options: tuple[str, ...] = ("follow", "batch_rows", "batch_seconds")
    unit = "batch"
    reads_in_place = False

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.load_table: LoadTable | None = None
        self.unit_columns: builtins.list[Column] | None = None  # a unit's columns
        self.made = False  # the table made by this run (make_table): nothing to truncate

    def follows(self, spec: LoadSpec, target: Target, table: Any) -> bool:
        """Whether this load is change capture: --follow, or the table already follows."""
        if spec.follow:
            return True
        url = parse_url(spec.sources[0], None)
        with target.for_table(table.sql, spec.shards, spec.shard_by, os.environ) as t:
            return resume_point(t, table, stream_of(url)) != (None, None)

    def make_table(self, spec: LoadSpec, target: Target, table: Any) -> None:
        """With --cluster, a missing followed table made on that cluster before the run
        opens it (mysql_table.create; the copy then starts on an empty table); an existing
        one that is not Distributed refused in one line."""
        self.made = False
        if not spec.cluster:
            return
        if target.table_columns(table.sql) is not None:  # (as PostgreSQL's: table.py)
            changes_table.check_cluster_table(target, table.sql, table.display, spec.cluster)
            return
        server = Server(parse_url(spec.sources[0], None))
        try:
            source, key = server.columns()
            mysql_table.create(target, table.sql, target_columns(target, source), key,
                               table.display, spec.cluster, spec.shards)
        finally:
            server.close()
        self.made = True

    def begin(self, stop: threading.Event, load_table: LoadTable) -> None:
        self.stop, self.load_table = stop, load_table

    def rounds(self, spec: LoadSpec, target: Target, listener: Listener,
               load_round: LoadRound, table: Any, report: LoadReport) -> None:
        url = parse_url(spec.sources[0], None)
        server = Server(url)
        self.unit_columns = None
        try:
            server.check_binlog()
            report.recovered += target.recover(table.sql)  # a unit a kill left committing
            source, key = server.columns()
            changes_table.check_sharding(target, table.display, key)
            stream = stream_of(url)
            after, pending = resume_point(target, table, stream)
            if pending is not None:  # a unit on some shards only: theirs first
                after = self._resume(target, server, pending, table, report, load_round,
                                     stream)
            if after is None:
                after = self._snapshot(spec, target, server, source, key, table, report,
                                       load_round, stream)
            end = None if spec.follow else mysql_table.position(*server.master())
            report.unit = self.unit
            done = self._changes(spec, target, server, after, end, table, report,
                                 load_round, stream)
            report.notes.append("changes applied up to binlog {}:{}".format(
                *mysql_table.log_of(done, server.master()[0])))
        finally:
            server.close()

    def _snapshot(self, spec: LoadSpec, target: Target, server: Server,
                  source: list[tuple[str, str, bool]], key: list[str], table: Any,
                  report: LoadReport, load_round: LoadRound, stream: str) -> int:
        """The copy at version 0, then the empty unit ending where the binlog was before
        it; returns that position."""
        existing = target.table_columns(table.sql)
        mysql_table.check_existing(existing, table.display)
        log_file, log_pos = server.master()
        start = mysql_table.position(log_file, log_pos)
        if existing is None:
            mysql_table.create(target, table.sql, target_columns(target, source), key,
                               table.display)
        elif not self.made:  # a copy cut short: its rows are dropped, the copy taken again
            changes_table.truncate(target, table.sql)
        assert self.load_table is not None
        copied = self.load_table(replace(spec, follow=False, force=True, cluster=None))
        _merge(report, copied)
        if copied.files_failed or copied.errors:
            raise SourceError(f"{table.display}: the copy of {server.url.display} failed; "
                              "run the same command again to take it again")
        crash_point("mysql-changes-copied")  # tests: the copy committed, its end not
        self._commit(load_round, target, table, stream, 0, start - 1, b"", report)
        report.notes.append(f"copied {copied.rows_loaded:,} rows in {copied.files_loaded} "
                            f"ranges; changes from binlog {log_file}:{log_pos} on")
        return start

    def _changes(self, spec: LoadSpec, target: Target, server: Server, after: int,
                 end: int | None, table: Any, report: LoadReport, load_round: LoadRound,
                 stream: str) -> int:
        """Unit after unit from `after`; the next unit is read (decoded, spooled) while
        one commits. A unit is taken only in order, so a commit that fails stops the
        reads: nothing past the ledger's end counts. Returns the end committed."""
        basename = server.master()[0]
        log_file, log_pos = mysql_table.log_of(after, basename)
        reader = BinlogReader(server.settings, log_file, log_pos, server.url.schema,
                              server.url.table, spec.follow)
        if reader.native is None and reader.native_why not in ("", binlog_native.CHOSEN):
            report.notes.append(f"binlog read by the Python reader, slower: {reader.native_why}")
        halt = threading.Event()
        waiting = threading.Event()  # the commits wait for the unit being read
        spools = iter(range(1 << 62))

        def read(layout: Layout) -> tuple[str, Cut]:
            path = os.path.join(target.workdir, "tmp",
                                f"mysql-changes-{os.getpid()}-{next(spools)}.tsv")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as out:
                out.write(_header(layout))
                return path, reader.unit(out, layout, spec.batch_rows or BATCH_ROWS,
                                         spec.batch_seconds or BATCH_SECONDS, end,
                                         lambda: self.stop.is_set() or halt.is_set(),
                                         waiting.is_set)

        ahead: Future[tuple[str, Cut]] | None = None
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="chload-binlog") as pool:
                layout = self._layout(target, table, server)
                ahead = pool.submit(read, layout)
                while ahead is not None:
                    waiting.set()
                    path, cut = ahead.result()
                    waiting.clear()
                    last = cut.ddl is not None or cut.exhausted or self.stop.is_set()
                    ahead = None if last else pool.submit(read, layout)
                    try:
                        if cut.rows:
                            self._commit(load_round, target, table, stream, after,
                                         cut.end - 1, path, report)
                            after = cut.end
                    finally:
                        _remove(path)
                    if cut.ddl is not None:
                        layout = self._ddl(target, table, server, cut.ddl)
                        ahead = pool.submit(read, layout)
            return after
        finally:
            halt.set()
            if ahead is not None:
                with contextlib.suppress(Exception):
                    _remove(ahead.result()[0])
            reader.close()

    def _resume(self, target: Target, server: Server, pending: tuple[int, int], table: Any,
                report: LoadReport, load_round: LoadRound, stream: str) -> int:
        """Into a cluster, the unit `(first, last)` some shards have committed and others
        lack (a run killed between two shards' commits) read again from the binlog, that
        range exactly (whole transactions from `first` to the one ending at `last` + 1,
        where the unit was cut), and committed as that unit: the cluster commits it on
        the shards lacking it only (targets/cluster `_pending`). The unit that ends the
        copy (`first` 0) is empty: the copy committed before it. Returns its end."""
        first, last = pending
        if first == 0:
            self._commit(load_round, target, table, stream, 0, last, b"", report)
            return last + 1
        log_file, log_pos = mysql_table.log_of(first, server.master()[0])
        reader = BinlogReader(server.settings, log_file, log_pos, server.url.schema,
                              server.url.table, False)
        path = os.path.join(target.workdir, "tmp", f"mysql-changes-{os.getpid()}-resume.tsv")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            layout = self._layout(target, table, server)
            with open(path, "wb") as out:
                out.write(_header(layout))
                cut = reader.unit(out, layout, 1 << 62, float("inf"), last + 1, lambda: False)
            if cut.end != last + 1 or not cut.rows:
                raise SourceError(
                    f"{stream}/{first}-{last}: committed on some shards only, and read again "
                    f"it ends at {cut.end - 1} with {cut.rows} rows (binlog purged or "
                    "rewritten?); drop the follow (chload sources --drop) and the table, then "
                    "follow again")
            self._commit(load_round, target, table, stream, first, last, path, report)
        finally:
            reader.close()
            _remove(path)
        return last + 1

    def _layout(self, target: Target, table: Any, server: Server) -> Layout:
        """The lines' columns (the table's, in its order), kept for the units' commits
        until DDL changes them."""
        existing = target.table_columns(table.sql) or []
        self.unit_columns = mysql_table.unit_columns(existing)
        source, key = server.columns()
        types = {n: t for n, t, _ in source}
        data = mysql_table.data_columns(existing)
        return layout_of([(c.name, types.get(c.name, "")) for c in data], key)

    def _ddl(self, target: Target, table: Any, server: Server, ddl: str) -> Layout:
        """A column added at the source is added to the table; other DDL stops."""
        source, _ = server.columns()
        kept = {c.name: c.type for c in target.table_columns(table.sql) or []}
        wanted = target_columns(target, source)
        names = {c.name for c in wanted}
        gone = set(kept) - names - {mysql_table.VERSION, mysql_table.DELETED}
        changed = [c for c in wanted if c.name in kept and c.type != kept[c.name]]
        words = ddl.split()[:2]
        if words and words[0].upper() == "ALTER" and not gone and not changed:
            added = [c for c in wanted if c.name not in kept]
            if added:
                target.add_columns(table.sql, added)
            return self._layout(target, table, server)
        raise UsageError(f"{server.url.display}: `{' '.join(ddl.split())[:120]}` changed the "
                         f"source table; {table.display} follows only added columns: "
                         "load it again into a new --table")

    def _commit(self, load_round: LoadRound, target: Target, table: Any, stream: str,
                first: int, last: int, path: str | bytes, report: LoadReport) -> None:
        """One unit through the committer: its ledger entry with its rows, or neither."""
        if isinstance(path, bytes):
            path = os.path.join(target.workdir, "tmp", f"mysql-changes-{os.getpid()}-0.tsv")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb"):
                pass
        uri = f"{stream}/{first}-{last}"
        if first == 0 or self.unit_columns is None:
            self.unit_columns = mysql_table.unit_columns(target.table_columns(table.sql) or [])
        columns = self.unit_columns
        size = os.path.getsize(path)
        unit = SourceFile(uri, size, 0, _TSV if size else _EMPTY,
                          etag=f"{first}-{last}", local_path=path,
                          position=StreamPosition(stream, first))
        try:
            done = load_round([unit], 1, structure(columns))
        finally:
            if first == 0 and os.path.exists(path):
                os.remove(path)
        _merge(report, done)
        result = next((r for r in done.files if r.uri == uri), None)
        if result is None or result.status != "loaded":
            why = result.error if result is not None and result.error else "not committed"
            raise SourceError(f"{uri}: {why}; run the same command again to go on from "
                              "the ledger's end")

    def list(self, pattern: str, context: SourceContext) -> builtins.list[SourceFile]:
        raise UsageError(f"{pattern}: change capture is read by `chload load` alone")

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        raise UsageError(f"{file.uri}: a change unit is read from its spool, not in place")

    def audit_columns(self, target: Target, data: builtins.list[Column], fmt: str,
                      inferred: bool) -> builtins.list[Column]:
        return data

    def release(self, files: Iterable[SourceFile]) -> None:
        return None

    def loads_alone(self, file: SourceFile) -> bool:
        return True


def _header(layout: Layout) -> bytes:
    names = [*layout.names, mysql_table.VERSION, mysql_table.DELETED]
    return b"\t".join(escaped(n.encode()) for n in names) + b"\n"


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _merge(report: LoadReport, done: LoadReport) -> None:
    report.add_units(done.files)
    report.errors += done.errors
    report.created_table = report.created_table or done.created_table


SOURCE = MysqlChanges()
