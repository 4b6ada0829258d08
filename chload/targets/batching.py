"""Small files in batches: one stage and one commit for many files, by size."""

from __future__ import annotations

from collections.abc import Sequence

from chload.sources.base import SourceFile

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
