"""An in-memory `Target` for unit tests of the runner and api.load: no engine, no
server, outcomes scripted per file (dlt's dummy destination is the model).

    target = FakeTarget(str(tmp_path), transient={"a.csv": 2}, terminal={"b.csv": "bad"})
    report = dispatch.load_into(spec, target)

A file's rows are its lines (read from the local file; 1 for anything else). Script:

- `transient`: uri -> how many loads of it fail with TransientError first (after
  reporting progress, which the runner must take back);
- `terminal`: uri -> message: its load fails (DataError), logged `failed`;
- `elsewhere`: uris another run commits meanwhile: load_file attaches nothing
  (Loaded(elsewhere=True)), a batch holding one raises BatchOverlap;
- `batch_size`: plan_batches groups files this many at a time (1: no batches); a batch
  fails (DataError) when a file of it is terminal, before anything is attached.

What it did is in `calls` (("load_file", uri), ("load_batch", (uri, ...)), ...),
`attached` (table -> uris, in commit order) and its ledger's `events` and `run_records`.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from chload.commit.known import KnownUnits
from chload.commit.ledger import (
    FAILED,
    LOADED,
    FileEvent,
    Ledger,
    RunRecord,
    TableState,
    own_history,
)
from chload.commit.rejects import ErrorBudget
from chload.errors import BatchOverlap, DataError, TransientError
from chload.schema import Column, split_table
from chload.sources.base import SourceFile
from chload.targets.base import Loaded, LoadJob, Target


class FakeLedger(Ledger):
    """The ledger in a list: the calls api.py and the runner make, nothing else."""

    def __init__(self, target: FakeTarget) -> None:
        self.target = target
        self.events: list[FileEvent] = []
        self.run_records: list[RunRecord] = []
        self._seq = itertools.count(1)
        self._guard = threading.Lock()

    def table_state(self, database: str, name: str) -> TableState:
        table = f"`{database}`.`{name}`"
        if table not in self.target.tables:
            return TableState(False)
        return TableState(True, "uuid-1", self.target.table_rows(table))

    def stamp(self, target_table: str, uuid: str) -> None:
        pass

    def record(self, events: Sequence[FileEvent],
               mark_of: tuple[str, str] | None = None) -> None:
        with self._guard:
            for event in events:
                event.seq = next(self._seq)
                self.events.append(event)

    def record_run(self, run: RunRecord) -> None:
        self.run_records.append(run)

    def latest(self, target_table: str, states: Sequence[str] | None = None) -> list[FileEvent]:
        last = {e.uri: e for e in self.events if e.target_table == target_table}
        return [e for e in last.values() if not states or e.state in states]

    def of_run(self, run_id: str) -> list[FileEvent]:
        return list({e.uri: e for e in self.events if e.run_id == run_id}.values())

    def loaded(self, target_table: str) -> dict[str, FileEvent]:
        return {e.uri: e for e in self.events
                if e.target_table == target_table and e.state == LOADED}

    def known(self, target_table: str, table: TableState) -> tuple[KnownUnits, str]:
        own, why = own_history(table, self.loaded(target_table))
        return KnownUnits.of_events(own), why

    def runs(self, target_table: str | None, limit: int = 50) -> list[dict]:
        return [{"run_id": r.run_id} for r in reversed(self.run_records)][:limit]


class FakeTarget:
    """A Target in memory (see the module docstring)."""

    display = "fake target"
    database = "default"
    engine_name = ""
    reads_pipes = False
    wants_key_order = False
    single_writer = True
    notes: Sequence[str] = ()

    def __init__(self, workdir: str, *, transient: dict[str, int] | None = None,
                 terminal: dict[str, str] | None = None, elsewhere: Sequence[str] = (),
                 batch_size: int = 1, workers: int = 2) -> None:
        self.workdir = workdir
        self.transient = dict(transient or {})
        self.terminal = dict(terminal or {})
        self.elsewhere = set(elsewhere)
        self.batch_size, self.workers = batch_size, workers
        self.ledger = FakeLedger(self)
        self.tables: dict[str, list[Column]] = {}
        self.engines: dict[str, str] = {}
        self.attached: dict[str, list[str]] = {}
        self.rows_of: dict[str, int] = {}
        self.commands: list[str] = []
        self.calls: list[tuple[str, object]] = []
        self.streams = 0
        self.flushed = self.closed = False
        self._guard = threading.Lock()

    def has_type(self, name: str) -> bool:
        return True

    # -- SQL (none runs) ---------------------------------------------------------------
    def command(self, sql: str) -> None:
        self.commands.append(sql)

    def rows(self, sql: str) -> list[dict]:
        return []

    def text(self, sql: str, fmt: str) -> str:
        return ""

    def binary(self, sql: str, fmt: str) -> bytes:
        return b""

    infer_rows = rows

    def reader(self, file: SourceFile, fmt: str, columns: Sequence[Column] | None) -> str:
        return f"fake('{file.uri}', '{fmt}')"

    def table_columns(self, table: str) -> list[Column] | None:
        return self.tables.get(table)

    def create_table(self, table: str, columns: Sequence[Column], order_by: str | None,
                     partition_by: str | None, engine: str = "MergeTree") -> None:
        self.tables.setdefault(table, list(columns))
        self.engines[table] = f"{engine} ORDER BY {order_by}"

    def table_engines(self, table: str) -> list[tuple[str, str]]:
        return [(table, self.engines[table])] if table in self.engines else []

    def add_columns(self, table: str, columns: Sequence[Column]) -> list[str]:
        have = self.tables.setdefault(table, [])
        added = [c for c in columns if c.name not in {h.name for h in have}]
        have += added
        return [c.name for c in added]

    def table_rows(self, table: str) -> int:
        return sum(self.rows_of[uri] for uri in self.attached.get(table, []))

    # -- planning ----------------------------------------------------------------------
    def recover(self, table: str) -> int:
        return 0

    def default_workers(self, files: Sequence[SourceFile]) -> int:
        return self.workers

    def open_streams(self, streams: int, adapt: object = None) -> int:
        self.streams = streams
        return streams

    def plan_batches(self, files: Sequence[SourceFile], budget: ErrorBudget,
                     workers: int) -> list[tuple[SourceFile, ...]]:
        n = max(1, self.batch_size)
        return [tuple(files[i:i + n]) for i in range(0, len(files), n)]

    # -- loading -----------------------------------------------------------------------
    def load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> Loaded:
        f = job.file
        self._call("load_file", f.uri)
        rows = _rows(f)
        with self._guard:
            retry = self.transient.get(f.uri, 0)
            if retry:
                self.transient[f.uri] = retry - 1
        if retry:
            progress(rows, f.size)  # parsed, then the connection dropped
            raise TransientError(f"{f.uri}: server 127.0.0.1:1 unreachable (scripted)")
        if f.uri in self.terminal:
            self.ledger.record([_event(job, f, FAILED, error=self.terminal[f.uri])])
            raise DataError(f"{f.uri}: {self.terminal[f.uri]}")
        progress(rows, f.size)
        if f.uri in self.elsewhere:
            return Loaded(0, f.size, elsewhere=True)
        self._attach(job, [(f, rows)])
        return Loaded(rows, f.size)

    def load_batch(self, job: LoadJob, progress: Callable[[int, int], None]) -> list[Loaded]:
        self._call("load_batch", tuple(f.uri for f in job.files))
        done = [(f, _rows(f)) for f in job.files]
        progress(sum(r for _, r in done), sum(f.size for f in job.files))
        bad = [f.uri for f in job.files if f.uri in self.terminal]
        if bad:
            raise DataError(f"{bad[0]}: {self.terminal[bad[0]]} (in a batch)")
        if any(f.uri in self.elsewhere for f in job.files):
            raise BatchOverlap(f"{job.file.uri}: another load committed some files of this "
                               "batch meanwhile; loading them one by one")
        self._attach(job, done)
        return [Loaded(rows, f.size) for f, rows in done]

    def _attach(self, job: LoadJob, done: Sequence[tuple[SourceFile, int]]) -> None:
        with self._guard:
            for f, rows in done:
                self.attached.setdefault(job.table, []).append(f.uri)
                self.rows_of[f.uri] = rows
        self.ledger.record([_event(job, f, LOADED, rows) for f, rows in done])

    def _call(self, kind: str, what: object) -> None:
        with self._guard:
            self.calls.append((kind, what))

    def flush(self) -> None:
        self.flushed = True

    def begin_run(self) -> None:
        return None

    def for_table(self, table: str, shards: Sequence[tuple[str, str]], shard_by: str,
                  env: Mapping[str, str]) -> AbstractContextManager[Target]:
        return contextlib.nullcontext(self)

    def shard_report(self) -> list[dict]:
        return []

    def cost_report(self) -> dict:
        return {}

    def close(self, failed: bool = False) -> None:
        self.closed = True


def _rows(f: SourceFile) -> int:
    if f.local_path is None:
        return 1
    with open(f.local_path, "rb") as data:
        return sum(1 for line in data if line.strip())


def _event(job: LoadJob, f: SourceFile, state: str, rows: int = 0,
           error: str = "") -> FileEvent:
    database, name = split_table(job.table)
    return FileEvent(f"{database}.{name}", f.uri, f.identity, f.size, f.mtime_ns, state,
                     rows, f.size if rows else 0, error, job.run_id)
