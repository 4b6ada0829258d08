"""How the embedded target groups files into units (a stage and a commit each).

Small files are batched and medium ones share stages, so that many files do not cost a
stage and a commit each; every group is one INSERT through a Null table and two views
(embedded/target.py `_load_flow`), which runs on one thread: so groups come at least one per
worker, of about equal parsing work.
"""

from __future__ import annotations

from collections.abc import Sequence

from chload.commit.rejects import ErrorBudget
from chload.sources.base import SourceFile
from chload.targets.batching import BATCH_BYTES, spread_by_size

# Files below this are batched: above it, a file's own stage and commit cost little
# next to its parse (docs/benchmarks.md). A server target batches larger files: there
# each file's own stage and commit are several requests.
SMALL_FILE_BYTES = 1 << 20
# Files from SMALL_FILE_BYTES to this share a stage and a commit, up to SHARED_FILES and
# SHARED_BYTES (about 2-3 s of parsing gzip CSV on one core; _parse_cost) a group, so
# a crash costs little redone work; larger files have a stage each, whose cost is
# little next to their parse.
MEDIUM_FILE_BYTES = 16 << 20
SHARED_FILES = 16
SHARED_BYTES = 32 << 20
# Small files holding this much in all are split into at least a batch per worker.
SPLIT_BYTES = 1 << 20
# Small files a batch holds at most: one file() reads them all, and the batch's fixed
# cost (its stage and views, its commit and ledger statements) is paid once for them;
# far more than a server target's (BATCH_FILES), whose files are each a request or a
# part. A batch that fails is split in halves by the runner until the bad file is alone.
SMALL_BATCH_FILES = 4096
# ... and names in all at most this many bytes: the commit's survey lists a batch's
# uris in one statement, which the engine parses up to max_query_size (256 KiB).
BATCH_URI_BYTES = 160 << 10


def plan_groups(files: Sequence[SourceFile], budget: ErrorBudget,
                workers: int) -> list[tuple[SourceFile, ...]]:
    """Group files, so that many of them do not cost a stage and a commit each.

    Small files (< 1 MB) and medium ones (< 16 MB, in smaller groups) are parsed
    together, each group by one INSERT into one stage (_load_flow), which runs on one
    thread. Either kind goes in balanced rounds: one group when there is little to
    parse, else a multiple of `workers` groups of about equal bytes, so that no worker
    idles through a last round the others have no share of (16 CSV files of 4.5 MB in 3
    groups on 2 workers: the third group ran alone, a third of the load on one core).
    Files with an error budget load alone: the engine's errors file does not say which
    file a rejected row came from.
    """
    if budget.allows_errors:
        return [(f,) for f in files]
    alone = [f for f in files if f.size >= SMALL_FILE_BYTES or f.is_stream]
    small = [f for f in files if not (f.size >= SMALL_FILE_BYTES or f.is_stream)]
    medium = [f for f in alone if _medium(f)]
    large = [(f,) for f in alone if not _medium(f)]
    return large + batch_small(small, workers) + share_stages(medium, workers)


def batch_small(files: Sequence[SourceFile], workers: int) -> list[tuple[SourceFile, ...]]:
    """Small files in runs of neighbours (one file() reads a run of one directory), at
    least one run a worker once they hold SPLIT_BYTES: a group's INSERT (a Null table
    and two views, _load_flow) runs on one thread whatever max_threads says, so a single
    batch of every file would leave the other cores idle."""
    split = sum(f.size for f in files) >= SPLIT_BYTES
    longest = max((len(f.uri.encode()) for f in files), default=0) + 4  # quotes, comma
    most = max(1, min(SMALL_BATCH_FILES, BATCH_URI_BYTES // longest))
    return balanced(files, workers, most, BATCH_BYTES,
                    min(workers, len(files)) if split else 1, runs=True)


def share_stages(files: Sequence[SourceFile], workers: int) -> list[tuple[SourceFile, ...]]:
    """Medium files in groups, at least one per worker."""
    return balanced(files, workers, SHARED_FILES, SHARED_BYTES, min(workers, len(files)),
                    runs=False)


def balanced(files: Sequence[SourceFile], workers: int, most_files: int, most_bytes: int,
             least: int, runs: bool) -> list[tuple[SourceFile, ...]]:
    """`files` in as few groups as `most_files` and `most_bytes` allow (at least
    `least`), rounded up to a multiple of `workers` when more than one, of about equal
    bytes each: runs of neighbours (`runs`), else groups balanced by size."""
    if not files:
        return []
    total = sum(_parse_cost(f) for f in files)
    count = max(-(-len(files) // most_files), -(-total // most_bytes), least)
    if count > 1:
        count = min(len(files), -(-count // workers) * workers)
    if runs:
        return _runs(files, count, most_files)
    return spread_by_size(files, count, most_files)


def _parse_cost(f: SourceFile) -> int:
    """The bytes of gzip CSV that take as long to parse as `f`: its size, or a third of
    it for uncompressed text (plain text parses about three times as fast per byte),
    so 32 MB of plain JSON is not a group."""
    return f.size // 3 if plain_text(f) else f.size


_COLUMNAR = frozenset({"Parquet", "ORC", "Avro", "Arrow", "ArrowStream", "Native"})


def _runs(files: Sequence[SourceFile], count: int, most_files: int) -> list[tuple[SourceFile, ...]]:
    """`files` cut in order into about `count` runs of equal bytes (neighbours share a
    directory: one file() reads a run, sources.table_function_many), `most_files` at most."""
    total = sum(f.size for f in files) or 1
    runs: list[tuple[SourceFile, ...]] = []
    current: list[SourceFile] = []
    done = 0
    for f in files:
        current.append(f)
        done += f.size
        if len(current) >= most_files or done * count >= total * (len(runs) + 1):
            runs.append(tuple(current))
            current = []
    return runs + ([tuple(current)] if current else [])


def _medium(f: SourceFile) -> bool:
    return SMALL_FILE_BYTES <= f.size < MEDIUM_FILE_BYTES and not f.is_stream


def plain_text(f: SourceFile) -> bool:
    """Uncompressed text: parses faster per byte, and takes about its size in memory."""
    return f.format.compression == "none" and f.format.name not in _COLUMNAR
