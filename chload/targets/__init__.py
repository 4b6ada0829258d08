"""Targets: where rows go. One small protocol, one module per kind.

A target is a list of shards (one, for a single server or the embedded engine), so a
cluster is a planning decision, not a rewrite (DESIGN principle 6). Each target loads
one file atomically (`load_file`): its rows are all there, recorded `loaded` in the
ledger, or none are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from chload.errors import UsageError
from chload.ledger import Ledger
from chload.rejects import ErrorBudget
from chload.schema import Column
from chload.sources import SourceFile, StreamPosition

if TYPE_CHECKING:
    from chload.adaptive import Controller
    from chload.targets.http import TargetURL

DEFAULT_TARGET = "./chload-data"
TARGET_ENV = "CHLOAD_TARGET"


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

    @property
    def files(self) -> tuple[SourceFile, ...]:
        return self.batch or (self.file,)

    @property
    def follows(self) -> tuple[StreamPosition, ...]:
        """Where the files that are units of a stream must start (commit.py checks)."""
        return tuple(f.position for f in self.files if f.position is not None)

    @property
    def line_base(self) -> int:
        """What a rejected row's number is offset by (a Kafka unit's first offset - 1)."""
        return self.file.position.line_base if self.file.position else 0


class Loaded(NamedTuple):
    """What loading one file did. `elsewhere`: another run committed the same file
    meanwhile, so this one attached nothing (the runner reports the file skipped)."""

    rows: int
    bytes: int
    rejected: int = 0
    elsewhere: bool = False


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
    def database(self) -> str:
        """What a bare --table name means (a server URL may name a database)."""
        ...

    @property
    def workdir(self) -> str:
        """A directory on this machine for what a run spools (stdin) and whose disk the
        monitor watches."""
        ...

    def command(self, sql: str) -> None: ...

    def rows(self, sql: str) -> list[dict]: ...

    def text(self, sql: str, fmt: str) -> str: ...

    def infer_rows(self, sql: str) -> list[dict]:
        """Run a schema-inference query in the engine that can read the sources."""
        ...

    def reader(self, file: SourceFile, fmt: str, columns: Sequence[Column] | None) -> str:
        """The table-function SQL with which the inferring engine reads `file`."""
        ...

    def table_columns(self, table: str) -> list[Column] | None: ...

    def create_table(self, table: str, columns: Sequence[Column], order_by: str | None,
                     partition_by: str | None) -> None:
        """Create `table` (qualified and quoted: `db`.`t`) if it does not exist, with
        `columns` as this target can store them (a SchemaError names a column it
        cannot)."""
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
        """Load `job.files` with one commit, all or none; BatchOverlap (or any error)
        and the runner loads them one by one."""
        ...

    def flush(self) -> None:
        """Write any ledger events still buffered."""
        ...

    def for_table(self, table: str, shards: Sequence[tuple[str, str]], shard_by: str,
                  env: Mapping[str, str]) -> AbstractContextManager[Target]:
        """The target a load into `table` goes through: this one, or (a server's
        Distributed table) the cluster of its shards (targets/cluster.py), closed after."""
        ...

    def shard_report(self) -> list[dict]:
        """Per-shard rows, bytes and seconds of the last load ([] for one shard)."""
        ...

    def cost_report(self) -> dict:
        """The last load's fixed and per-unit costs (LoadReport.costs: first data byte,
        requests per committed unit); {} where the target does not measure them."""
        ...

    def close(self) -> None: ...


if TYPE_CHECKING:  # both targets are Targets: mypy checks every member above
    from chload.targets.cluster import ClusterTarget
    from chload.targets.embedded import EmbeddedTarget
    from chload.targets.server import ServerTarget

    def _conforms(e: EmbeddedTarget, s: ServerTarget,
                  c: ClusterTarget) -> tuple[Target, Target, Target]:
        return e, s, c


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """Where rows go, resolved once at the top (api.py) from --target and the
    environment, then passed down: nothing under targets/ reads the environment.

    `where`: a directory (embedded ClickHouse) or the URL as given; `url`: a server's,
    parsed, with its password (the URL's, else $CLICKHOUSE_PASSWORD). `create=False`
    (commands that only read): an embedded directory must exist already."""

    where: str = field(repr=False)  # a URL may hold the password
    url: TargetURL | None = field(default=None, repr=False)
    create: bool = True

    @property
    def display(self) -> str:
        """The target without its password."""
        return self.url.display if self.url is not None else self.where

    @classmethod
    def resolve(cls, target: str | None, env: Mapping[str, str],
                create: bool = True) -> TargetSpec:
        """A --target value (else env's CHLOAD_TARGET, else the default)."""
        value = target or env.get(TARGET_ENV) or DEFAULT_TARGET
        if value.startswith(("http://", "https://")):
            from chload.targets.http import parse_target_url

            return cls(value, parse_target_url(value, env), create)
        if "://" in value:
            raise UsageError(
                f"--target: '{value.split('://')[0]}://' is not a target; use a directory "
                "(embedded ClickHouse) or http(s)://host:port/db (a ClickHouse server)"
            )
        return cls(value, None, create)


def open_target(spec: TargetSpec) -> Target:
    """The target a TargetSpec names.

    `spec.create=False` (commands that only read) refuses an embedded directory that
    does not exist yet, rather than making an empty one.
    """
    if spec.url is not None:
        from chload.targets.server import ServerTarget

        return ServerTarget(spec.url)
    if not spec.create and not os.path.isdir(spec.where):
        raise UsageError(f"target {spec.where}: no embedded ClickHouse there yet; load "
                         "something first, or pass --target DIR (or http(s)://...)")
    from chload.targets.embedded import EmbeddedTarget

    return EmbeddedTarget(spec.where)


SMALL_FILE_BYTES = 4 << 20  # files below this are batched ...
BATCH_FILES = 256  # ... up to this many ...
BATCH_BYTES = 16 << 20  # ... and this many bytes (as stored) in one stage and commit


def group_small_files(files: Sequence[SourceFile], per_batch: int = BATCH_FILES,
                      small: int = SMALL_FILE_BYTES) -> list[tuple[SourceFile, ...]]:
    """Files under `small` bytes in groups of up to `per_batch` files and BATCH_BYTES, in
    order; larger files and streams alone (a target loads each group with one stage and
    one commit)."""
    groups: list[tuple[SourceFile, ...]] = []
    current: list[SourceFile] = []
    for f in files:
        if f.size >= small or f.is_stream:
            groups.append((f,))
            continue
        if current and (len(current) >= per_batch
                        or sum(c.size for c in current) + f.size > BATCH_BYTES):
            groups.append(tuple(current))
            current = []
        current.append(f)
    if current:
        groups.append(tuple(current))
    return groups


def spread_by_size(files: Sequence[SourceFile], count: int,
                   per_group: int = BATCH_FILES) -> list[tuple[SourceFile, ...]]:
    """`files` in up to `count` groups of about equal bytes (largest first, each into the
    lightest group with room for `per_group` files), each group in the files' order."""
    groups: list[list[int]] = [[] for _ in range(count)]
    sizes = [0] * count
    for i in sorted(range(len(files)), key=lambda i: -files[i].size):
        g = min((g for g in range(count) if len(groups[g]) < per_group),
                key=sizes.__getitem__)
        groups[g].append(i)
        sizes[g] += files[i].size
    return [tuple(files[i] for i in sorted(g)) for g in groups if g]
