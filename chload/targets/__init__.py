"""Targets: where rows go. One small protocol, one module per kind.

A target is a list of shards (one, for a single server or the embedded engine), so a
cluster is a planning decision, not a rewrite (DESIGN principle 6). Each target loads
one file atomically (`load_file`): its rows are all there, recorded `loaded` in the
ledger, or none are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from chload.errors import UsageError
from chload.ledger import Ledger
from chload.records import dataclass
from chload.rejects import ErrorBudget
from chload.schema import Column
from chload.sources import SourceFile, StreamPosition

DEFAULT_TARGET = "./chload-data"


@dataclass(frozen=True)
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
    """What loading one file did. A target may also return a plain (rows, bytes).
    `elsewhere`: another run committed the same file meanwhile, so this one attached
    nothing (the runner reports the file skipped)."""

    rows: int
    bytes: int
    rejected: int = 0
    elsewhere: bool = False


class Target(Protocol):
    """What the planner and runner need from any target."""

    display: str  # where the data goes, for messages and reports (never a secret)
    ledger: Ledger

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

    def recover(self, table: str) -> int:
        """Finish or undo what an interrupted earlier run left; return files settled."""
        ...

    def load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> tuple[int, ...]:
        """Load one file atomically; return Loaded(rows, bytes read, rows rejected)."""
        ...

    def default_workers(self, files: Sequence[SourceFile]) -> int: ...

    def flush(self) -> None:
        """Write any ledger events still buffered."""
        ...

    def close(self) -> None: ...


def open_target(target: str | None, create: bool = True) -> Target:
    """The target a --target value (or CHLOAD_TARGET, or the default) names.

    `create=False` (commands that only read) refuses an embedded directory that does not
    exist yet, rather than making an empty one.
    """
    value = target or os.environ.get("CHLOAD_TARGET") or DEFAULT_TARGET
    if value.startswith(("http://", "https://")):
        from chload.targets.server import ServerTarget

        return ServerTarget(value)
    if "://" in value:
        raise UsageError(
            f"--target: '{value.split('://')[0]}://' is not a target; use a directory "
            "(embedded ClickHouse) or http(s)://host:port/db (a ClickHouse server)"
        )
    if not create and not os.path.isdir(value):
        raise UsageError(f"target {value}: no embedded ClickHouse there yet; load something "
                         "first, or pass --target DIR (or http(s)://...)")
    from chload.targets.embedded import EmbeddedTarget

    return EmbeddedTarget(value)


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
