"""Rejected rows for a server target, kept by the loader's own engine.

With an error budget a server target's file is parsed by chDB in the loader (push.py),
so the engine's errors file (rejects.py) is on the loader's machine, where the server
cannot read it. The loader's engine reads it into a `chload.rejects` of its own, exactly
as the embedded target does (reason, raw text; JSON lines asked again per line), then
pushes this file's rows into the server's `chload.rejects` as Native and forgets them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from chload.commit import rejects
from chload.commit.ledger import DATABASE
from chload.errors import DataError
from chload.runtime.engine import Engine
from chload.schema import Column, quote_ident, quote_str, structure
from chload.sources.registry import table_function
from chload.targets.base import LoadJob
from chload.targets.server.push import PUSH_SETTINGS

# send(insert, columns, select, settings, context): the server runs `insert` (FORMAT
# Native) on the rows the loader's engine selects.
Send = Callable[[str, Sequence[Column], str, Sequence[tuple[str, str]], str], int]


class LoaderSql:
    """The loader's engine as a `Sql` (ledger.py), for rejects.py."""

    def __init__(self, engine: Engine, context: str) -> None:
        self.engine, self.context = engine, context

    def command(self, sql: str) -> None:
        self.engine.query(sql, "TSV", self.context)

    def rows(self, sql: str) -> list[dict]:
        return self.engine.rows(sql, self.context)


class LoaderRejects:
    def __init__(self, engine: Engine, send: Send) -> None:
        self.engine, self.send = engine, send
        self._lock = threading.Lock()
        self._ready = False  # chload.rejects exists in the loader's engine

    def over_budget(self, job: LoadJob, errors_file: str) -> DataError | None:
        """After a failed parse: the over-budget error, if that is why it failed."""
        loader = LoaderSql(self.engine, job.file.uri)
        if not rejects.budget_spent(loader.rows, job.budget, errors_file,
                                    job.file.format.delimiter):
            return None
        return rejects.over_budget(loader.rows, job.file.uri, job.file.format, job.budget,
                                   errors_file)

    def keep(self, job: LoadJob, stage: str, errors_file: str, rows: int) -> int:
        """Count the rejected rows, check the budget (DataError over it), and copy them
        into the server's chload.rejects under `stage`; return how many."""
        loader = LoaderSql(self.engine, job.file.uri)
        rejected = rejects.count_errors(loader.rows, errors_file, job.file.format.delimiter)
        job.budget.check(job.file.uri, rejected, rows)
        rejects.check_accounted(loader.rows, job.file.uri, job.file.format,
                                table_function(job.file, "LineAsString", None), rows, rejected,
                                errors_file)
        if not rejected:
            return 0
        self._ensure(loader)
        rejects.record(loader, errors_file, table=job.table_display, uri=job.file.uri,
                       stage=stage, run_id=job.run_id, fmt=job.file.format,
                       lines_sql=table_function(job.file, "LineAsString", None),
                       parse_sql=lambda text: rejects.parse_one_sql(
                           job.file.format, structure(job.read_columns), text),
                       seq=time.time_ns(), line_base=job.line_base)
        columns = [Column(n, t) for n, t in rejects.REJECT_COLUMNS]
        names = ", ".join(quote_ident(c.name) for c in columns)
        where = f"uri = {quote_str(job.file.uri)} AND stage = {quote_str(stage)}"
        self.send(f"INSERT INTO {rejects.REJECTS} ({names}) FORMAT Native", columns,
                  f"SELECT {names} FROM {rejects.REJECTS} WHERE {where}", PUSH_SETTINGS,
                  job.file.uri)
        loader.command(f"ALTER TABLE {rejects.REJECTS} DELETE WHERE {where} "
                       "SETTINGS mutations_sync = 1")
        return rejected

    def _ensure(self, loader: LoaderSql) -> None:
        with self._lock:
            if not self._ready:
                loader.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
                rejects.ensure(loader)
                self._ready = True
