"""The embedded target: ClickHouse in this process (chDB), persistent in a directory.

Exactly once per file, without a column of ours in the user's table:

1. ledger `loading` (with the name of a fresh stage table);
2. `INSERT INTO chload.stage_X SELECT ... FROM file(...)`: the engine parses and writes
   into a table shaped like the target (`CREATE TABLE ... AS`);
3. under one lock: note the target's highest block number (`mark`), ledger
   `committing`, `ALTER TABLE t ATTACH PARTITION ... FROM chload.stage_X` (hard links,
   milliseconds), ledger `loaded`;
4. drop the stage.

A crash before 3 leaves only a stage, which recovery drops. A crash inside 3 is
settled by the block numbers: MergeTree numbers every attached part above every
existing one and merges keep the range, so a part whose `max_block_number` exceeds the
mark can only come from this attach (this process is the directory's only writer:
engine.py holds a lock). Recovery attaches whatever partition is not yet there.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Sequence

from chload.engine import Engine
from chload.errors import ChloadError
from chload.ledger import COMMITTING, DATABASE, FAILED, LOADED, LOADING, FileEvent, Ledger
from chload.schema import AUDIT_COLUMNS, Column, quote_ident, quote_str, structure
from chload.sources import SourceFile
from chload.targets import LoadJob

# Settings every load runs with; user --setting values come after and win.
LOAD_SETTINGS: tuple[tuple[str, str], ...] = (
    ("input_format_parallel_parsing", "1"),
    ("max_insert_threads", "2"),
)


class EmbeddedTarget:
    """chDB in a directory; the ledger lives in its `chload` database."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.display = f"embedded ClickHouse in {path}"
        self.engine = Engine(self.path)
        self.ledger = Ledger(self)
        self.ledger.ensure()
        self._commit = threading.Lock()

    # -- SQL ---------------------------------------------------------------------------
    def command(self, sql: str) -> None:
        self.engine.query(sql, "TSV", f"target {self.path}")

    def rows(self, sql: str) -> list[dict]:
        return self.engine.rows(sql, f"target {self.path}")

    def text(self, sql: str, fmt: str) -> str:
        return self.engine.query(sql, fmt, "query")

    infer_rows = rows

    def reader(self, file: SourceFile, fmt: str, columns: Sequence[Column] | None) -> str:
        args = [quote_str(file.local_path or file.uri), quote_str(fmt)]
        args.append(quote_str(structure(columns)) if columns else "'auto'")
        args.append(quote_str(file.format.compression if file.format.compression != "none"
                              else "none"))
        return f"file({', '.join(args)})"

    def table_columns(self, table: str) -> list[Column] | None:
        database, name = _split(table)
        rows = self.rows(
            f"SELECT name, type, default_kind FROM system.columns WHERE database = "
            f"{quote_str(database)} AND table = {quote_str(name)} ORDER BY position"
        )
        return [Column(r["name"], r["type"], r["default_kind"]) for r in rows] or None

    def default_workers(self, files: Sequence[SourceFile]) -> int:
        # Measured on 2 cores, 20 gzip CSV files: 2 parallel per-file inserts beat one
        # glob query by ~10%; more than 2 per core adds nothing.
        return max(1, min(len(files), max(2, os.cpu_count() or 2)))

    # -- loading -----------------------------------------------------------------------
    def load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> tuple[int, int]:
        stage = f"{DATABASE}.stage_{uuid.uuid4().hex[:16]}"
        event = _event(job, LOADING, stage=stage)
        self.ledger.record([event])
        try:
            self.command(f"CREATE TABLE {stage} AS {job.table}")
            rows, read = self.engine.execute(_insert_sql(stage, job, self.reader), job.file.uri)
            progress(rows, read)
            with self._commit:
                self._attach(job.table, stage, _event(job, COMMITTING, stage, rows, read))
                self.ledger.record([_event(job, LOADED, stage, rows, read)])
        except ChloadError as exc:
            self.ledger.record([_event(job, FAILED, stage, error=str(exc))])
            raise
        finally:
            self.command(f"DROP TABLE IF EXISTS {stage} SYNC")
        return rows, read

    def _attach(self, table: str, stage: str, committing: FileEvent) -> None:
        committing.mark = self._max_block(table)
        self.ledger.record([committing])
        for partition in self._partitions(stage):
            self.command(f"ALTER TABLE {table} ATTACH PARTITION ID {quote_str(partition)} "
                         f"FROM {stage}")

    def _max_block(self, table: str) -> int:
        database, name = _split(table)
        rows = self.rows(
            f"SELECT max(max_block_number) AS m FROM system.parts WHERE database = "
            f"{quote_str(database)} AND table = {quote_str(name)} AND active"
        )
        return int(rows[0]["m"] or 0) if rows else 0

    def _partitions(self, stage: str, above: int = -1) -> list[str]:
        database, name = _split(stage)
        rows = self.rows(
            f"SELECT DISTINCT partition_id FROM system.parts WHERE database = "
            f"{quote_str(database)} AND table = {quote_str(name)} AND active "
            f"AND max_block_number > {above} ORDER BY partition_id"
        )
        return [r["partition_id"] for r in rows]

    # -- recovery ----------------------------------------------------------------------
    def recover(self, table: str) -> int:
        """Settle files an interrupted run left `loading` or `committing`."""
        pending = self.ledger.latest(_display(table), [LOADING, COMMITTING])
        for event in pending:
            if event.state == COMMITTING and self._exists(event.stage):
                self._finish_attach(table, event)
                self.ledger.record([_copy(event, LOADED)])
            else:
                self.ledger.record([_copy(event, FAILED, "interrupted before commit; "
                                                         "will load again")])
            self.command(f"DROP TABLE IF EXISTS {event.stage} SYNC")
        self._drop_orphan_stages()
        return len(pending)

    def _finish_attach(self, table: str, event: FileEvent) -> None:
        done = set(self._partitions(table, above=event.mark))
        for partition in self._partitions(event.stage):
            if partition not in done:
                self.command(f"ALTER TABLE {table} ATTACH PARTITION ID "
                             f"{quote_str(partition)} FROM {event.stage}")

    def _exists(self, stage: str) -> bool:
        database, name = _split(stage)
        return bool(self.rows(f"SELECT 1 AS x FROM system.tables WHERE database = "
                              f"{quote_str(database)} AND name = {quote_str(name)}"))

    def _drop_orphan_stages(self) -> None:
        for row in self.rows(f"SELECT name FROM system.tables WHERE database = "
                             f"'{DATABASE}' AND startsWith(name, 'stage_')"):
            self.command(f"DROP TABLE IF EXISTS {DATABASE}.{quote_ident(row['name'])} SYNC")

    def close(self) -> None:
        self.engine.close()


def _insert_sql(stage: str, job: LoadJob, reader: Callable[..., str]) -> str:
    names = [quote_ident(c.name) for c in job.columns]
    exprs = list(names)
    if job.audit:
        names += [quote_ident(n) for n in AUDIT_COLUMNS]
        source = "_path" if not job.file.is_stream else quote_str(job.file.uri)
        exprs += [source, "now()"]
    settings = ", ".join(f"{k} = {_setting_value(v)}" for k, v in (*LOAD_SETTINGS, *job.settings))
    source_sql = reader(job.file, job.file.format.name, job.read_columns)
    return (f"INSERT INTO {stage} ({', '.join(names)}) SELECT {', '.join(exprs)} "
            f"FROM {source_sql} SETTINGS {settings}")


def _setting_value(value: str) -> str:
    return value if value.lstrip("-").replace(".", "", 1).isdigit() else quote_str(value)


def _event(job: LoadJob, state: str, stage: str = "", rows: int = 0, read: int = 0,
           error: str = "") -> FileEvent:
    f = job.file
    return FileEvent(job.table_display, f.uri, f.identity, f.size, f.mtime_ns, state,
                     rows, read, error, job.run_id, stage)


def _copy(event: FileEvent, state: str, error: str = "") -> FileEvent:
    return FileEvent(event.target_table, event.uri, event.identity, event.size,
                     event.mtime_ns, state, event.rows, event.bytes, error, event.run_id,
                     event.stage, event.mark)


def _split(table: str) -> tuple[str, str]:
    database, _, name = table.partition(".")
    return database.strip("`"), name.strip("`")


def _display(table: str) -> str:
    database, name = _split(table)
    return f"{database}.{name}"
