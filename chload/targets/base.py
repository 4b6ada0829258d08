"""What every target is: the `Target` protocol, and a unit's job and result.

A target is a list of shards (one, for a single server or the embedded engine), so a
cluster is a planning decision, not a rewrite. A target loads a unit atomically: its
rows are all there and recorded `loaded` in the ledger, or none are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from chload.commit.ledger import Ledger
from chload.commit.rejects import ErrorBudget
from chload.schema import Column, display_table, quote_str, split_table
from chload.sources.base import SourceFile, StreamPosition

if TYPE_CHECKING:
    from chload.runtime.adaptive import Controller


@dataclass(frozen=True, slots=True)
class LoadJob:
    """Everything a target needs to load one file into one table."""

    file: SourceFile
    table: str  # qualified and quoted: `db`.`t`
    table_display: str  # db.t as the user wrote it
    columns: Sequence[Column]  # the table's columns the data fills, in the data's order
    read_columns: Sequence[Column]  # how to read the data (names and types)
    audit: bool
    settings: Sequence[tuple[str, str]]
    run_id: str
    budget: ErrorBudget = ErrorBudget()
    batch: tuple[SourceFile, ...] = ()  # several small files loaded as one (file = first)
    threads: int = 0  # engine threads for this file's query (0: the engine's default)
    mode: str = "append"  # --mode: append or replace-partitions (the committer's)
    settle: Callable[[], None] | None = None  # asked right before any of its files commits
    # (identity.check_read): raises what the run's sources found that stops the run
    # (RunSources.settle: a database's check of the rows to load, run beside the ranges)
    stream: Callable[[SourceFile], Callable[[], Iterator[bytes]] | None] | None = None
    # how a remote unit's bytes as stored are read here (RunSources.stream): a server
    # target posts them as they are where it would post a local file's

    @property
    def files(self) -> tuple[SourceFile, ...]:
        return self.batch or (self.file,)

    @property
    def follows(self) -> tuple[StreamPosition, ...]:
        """Where the files that are units of a stream must start (committer.py checks)."""
        return tuple(f.position for f in self.files if f.position is not None)

    @property
    def line_base(self) -> int:
        """What a rejected row's number is offset by (a Kafka unit's first offset - 1)."""
        return self.file.position.line_base if self.file.position else 0


class Loaded(NamedTuple):
    """What loading one file did. `elsewhere`: another run committed the same file
    meanwhile, so this one attached nothing (the runner reports the file skipped).
    `partly`: a stream's unit into a cluster that this run committed on some shards
    while the others had it from another run meanwhile; `rows` are this run's."""

    rows: int
    bytes: int
    rejected: int = 0
    elsewhere: bool = False
    partly: bool = False


class Target(Protocol):
    reads_pipes: bool  # a unit may be a pipe, read by the engine while it is written
    single_writer: bool  # no other process can load into it meanwhile (its own lock)
    wants_key_order: bool  # it sorts a unit's rows by the table's key after the last
    # byte: a source that can give them in that order cheaply should (SourceContext)
    """Everything api.py, the planner, the runner, the ledger and rejects.py use of a
    target. EmbeddedTarget and ServerTarget implement all of it (checked by mypy:
    `_conforms` below), and so does the unit tests' FakeTarget (tests/unit/fake_target.py)."""

    @property
    def display(self) -> str:
        """Where the data goes, for messages and reports (never a secret)."""
        ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def notes(self) -> Sequence[str]:
        """What the report of a load into the table last given to `for_table` should
        say, not an error (a server's table made here while its cluster's other servers
        hold a Distributed one of that name: server/peers.py)."""
        ...

    @property
    def database(self) -> str:
        """What a bare --table name means (a server URL may name a database)."""
        ...

    @property
    def engine_name(self) -> str:
        """Which ClickHouse parses and stores the rows: "chdb" (the embedded engine), a
        server's version, or '' when not known (core/reading/ranges.py bounds its date types)."""
        ...

    def has_type(self, name: str) -> bool:
        """Whether the target stores a column type of this family (DateTime64, ...)."""
        ...

    @property
    def workdir(self) -> str:
        """A directory on this machine for what a run spools (stdin) and whose disk the
        monitor watches."""
        ...

    def command(self, sql: str) -> None: ...

    def rows(self, sql: str) -> list[dict]: ...

    def text(self, sql: str, fmt: str) -> str: ...

    def binary(self, sql: str, fmt: str) -> bytes:
        """A query's answer as the engine sends it (RowBinary: the ledger's keys)."""
        ...

    def infer_rows(self, sql: str) -> list[dict]:
        """Run a schema-inference query in the engine that can read the sources."""
        ...

    def reader(self, file: SourceFile, fmt: str, columns: Sequence[Column] | None) -> str:
        """The table-function SQL with which the inferring engine reads `file`."""
        ...

    def table_columns(self, table: str) -> list[Column] | None: ...

    def create_table(self, table: str, columns: Sequence[Column], order_by: str | None,
                     partition_by: str | None, engine: str = "MergeTree") -> None:
        """Create `table` (qualified and quoted: `db`.`t`) if it does not exist, with
        `columns` as this target can store them (a SchemaError names a column it
        cannot), of `engine` (a MergeTree-family engine clause: --upsert-key's
        ReplacingMergeTree)."""
        ...

    def table_engines(self, table: str) -> list[tuple[str, str]]:
        """Where `table`'s rows are kept and each one's engine clause (engine_full):
        the table itself, or a Distributed table's local table on each shard."""
        ...

    def add_columns(self, table: str, columns: Sequence[Column]) -> list[str]:
        """Add to `table` each of `columns` it lacks (--on-new-column add: core/evolve.py),
        as this target stores its type; return the names this call added (a column
        another loader added meanwhile is kept as it is, not counted). Returns once every
        server holding the table (a cluster's shards and replicas) shows them."""
        ...

    def recover(self, table: str) -> int:
        """Finish or undo what an interrupted earlier run left; return files settled."""
        ...

    def default_workers(self, files: Sequence[SourceFile]) -> int: ...

    def open_streams(self, streams: int, adapt: Controller | None = None) -> int:
        """Let `streams` files load at once; return how many to keep in flight. With
        `adapt` (--workers auto), a target that can moves the limit with what it
        measures (adaptive.py); one that cannot freezes it and says why."""
        ...

    def plan_batches(self, files: Sequence[SourceFile], budget: ErrorBudget,
                     workers: int) -> list[tuple[SourceFile, ...]]:
        """The files in groups, each loaded by one `load_batch` (a group of one by
        `load_file`)."""
        ...

    def load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> Loaded:
        """Load one file atomically; return Loaded(rows, bytes read, rows rejected)."""
        ...

    def load_batch(self, job: LoadJob, progress: Callable[[int, int], None]) -> list[Loaded]:
        """Load `job.files` with one commit, all or none; on BatchOverlap (or any error)
        the runner loads each half as a batch, halved again while it fails (run.py)."""
        ...

    def flush(self) -> None:
        """Write any ledger events still buffered."""
        ...

    def begin_run(self) -> None:
        """A new run begins on this open target: a unit committed from now on by anyone
        else (or by this process before now) is another run's, which a commit of it
        must not double (committer.py rule 5). A load that follows files begins each
        poll so: a file its earlier poll loaded may be loaded again with --force."""
        ...

    def for_table(self, table: str, shards: Sequence[tuple[str, str]], shard_by: str,
                  env: Mapping[str, str]) -> AbstractContextManager[Target]:
        """The target a load into `table` goes through: this one, or (a server's
        Distributed table) the cluster of its shards (cluster/target.py), closed after."""
        ...

    def shard_report(self) -> list[dict]:
        """Per-shard rows, bytes and seconds of the last load ([] for one shard)."""
        ...

    def cost_report(self) -> dict:
        """The last load's fixed and per-unit costs (LoadReport.costs: first data byte,
        requests per committed unit); {} where the target does not measure them."""
        ...

    def close(self, failed: bool = False) -> None:
        """Release what the target holds. `failed`: the run that opened it ended by an
        error; a target that made its place for that run and committed nothing there
        removes it (an embedded directory); the others ignore it."""
        ...


def engines_of(rows: Callable[[str], list[dict]], table: str) -> list[tuple[str, str]]:
    """Target.table_engines of a table kept where `rows` asks: its own engine clause."""
    database, name = split_table(table)
    found = rows(f"SELECT engine_full FROM system.tables WHERE database = "
                 f"{quote_str(database)} AND name = {quote_str(name)}")
    return [(display_table(table), r["engine_full"]) for r in found]
