"""How a server target groups files into units (a stage and a commit each).

Two ways into a stage differ in what a group costs (fill.py):
- *raw*: the server parses each file in its own request, a part each, merged to one
  before the attach (committer.py rule 2); only small files share a stage, in as many
  groups as streams.
- *through the loader's engine*: a group is one INSERT in chDB streaming one Native
  request, its rows counted per file (fill.py `_flow`); one group per loader core. Small
  files always; larger ones (up to FLOW_BELOW) only into a wide table (WIDE_COLUMNS).
  JSON lines of 512 KB and more stay raw and alone (fill.py `_gathers` decides per unit).
docs/target-server.md ("Grouping", and "Why files group as they do") says why.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from chload.sources.base import SourceFile
from chload.targets.batching import BATCH_BYTES, BATCH_FILES, group_small_files, spread_by_size

BATCHED_BELOW = 512 << 10  # raw: files below this share a stage and a commit
WIDE_COLUMNS = 16  # through the loader's engine: larger files share one in tables this wide
FLOW_BELOW = 64 << 20  # through the loader's engine: files below this share one
FLOW_BYTES = 256 << 20  # ... up to this many bytes (as stored) a group


def plan(files: Sequence[SourceFile], workers: int, pushed: Callable[[SourceFile], bool],
         json_lines: frozenset[str], streamed: bool = True,
         columns: int = WIDE_COLUMNS) -> list[tuple[SourceFile, ...]]:
    """`files` in groups, each loaded by one stage and one commit. `pushed(f)`: must the
    loader's engine read `f` (the server cannot)? `streamed`: False where a group is
    gathered in the loader's memory before it is sent (https, fill.py `_gather`):
    then only small files share a stage, up to BATCH_BYTES a group (bounded memory).
    `columns`: the table's (larger files share a stage only in a wide one)."""
    if not streamed:
        pushed = _never
    cores = max(1, min(workers, os.cpu_count() or 1))
    shared = [f for f in files if not f.is_stream and (
        (f.size < (FLOW_BELOW if columns >= WIDE_COLUMNS else BATCHED_BELOW) and pushed(f))
        or (f.size < BATCHED_BELOW and f.format.name in json_lines))]
    taken = {id(f) for f in shared}
    rest = [f for f in files if id(f) not in taken]
    small = sum(f.size < BATCHED_BELOW for f in rest)
    per_group = -(-small // max(1, workers))  # every stream gets work
    most = FLOW_BYTES if streamed else BATCH_BYTES
    return (group_small_files(rest, min(BATCH_FILES, max(1, per_group)), BATCHED_BELOW)
            + (balanced(shared, cores, most) if shared else []))


def _never(f: SourceFile) -> bool:
    return False


def balanced(files: Sequence[SourceFile], cores: int,
             most_bytes: int = FLOW_BYTES) -> list[tuple[SourceFile, ...]]:
    """`files` in `cores` groups (more when `most_bytes` or BATCH_FILES ask: then a
    multiple of `cores`), of about equal bytes, each in the files' order."""
    total = sum(f.size for f in files)
    count = max(cores, -(-total // most_bytes), -(-len(files) // BATCH_FILES))
    count = min(len(files), -(-count // cores) * cores)
    return spread_by_size(files, count)
