#!/usr/bin/env python3
"""The Python a batch of small files costs per file outside the engine, in CPU seconds of
this thread: its ledger rows as JSON, its `loaded` events, its identities taken twice,
each as this tree does it against the way before (a dict a row through json's encoder,
`FileEvent.moved` an event, `Source.current` a file), alternately, in one process.

    python3 bench/commit_python.py [--files 100000] [--repeat 5]

The files are bench/many_files.py's (written once, cached); nothing goes to an engine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from many_files import dataset  # noqa: E402

from chload.commit import ledger, tables  # noqa: E402
from chload.commit.ledger import COMMITTING, LOADED, FileEvent  # noqa: E402
from chload.formats import FileFormat  # noqa: E402
from chload.sources import identity  # noqa: E402
from chload.sources.base import SourceFile  # noqa: E402
from chload.sources.registry import source_for  # noqa: E402

_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
_FIELDS = tuple(FileEvent.__dataclass_fields__)
_VALUES = attrgetter(*_FIELDS)


def _files(root: Path, count: int) -> list[SourceFile]:
    fmt = FileFormat("CSVWithNames", "none")
    found: list[SourceFile] = []
    for top, _, names in os.walk(root / "f"):
        for name in sorted(names):
            path = os.path.join(top, name)
            st = os.stat(path)
            found.append(SourceFile(path, st.st_size, st.st_mtime_ns, fmt, local_path=path))
            if len(found) == count:
                return found
    return found


def _rows_before(events: list[FileEvent]) -> str:
    """Ledger.record's rows before: a dict an event, json's encoder a row."""
    rows = [dict(zip(_FIELDS, _VALUES(e), strict=True)) for e in events]
    for row in rows:
        if not row["table_uuid"]:
            row["table_uuid"] = ""
    return "\n".join(_ENCODE(r) for r in rows)


def _rows_now(events: list[FileEvent]) -> str:
    return tables.json_rows(events, {}, 0) or ""


def _identities_before(files: list[SourceFile]) -> None:
    """identity.as_read and check_read before: `Source.current` of each file."""
    read = tuple(source_for(f).current(f) for f in files)
    for f in read:
        if source_for(f).current(f).identity != f.identity:
            raise AssertionError(f.uri)


def _identities_now(files: list[SourceFile]) -> None:
    read = tuple(identity.current_all(files))
    if identity._changed(read) is not None:
        raise AssertionError("changed")


def _cpu(fn: Callable[[], object]) -> float:
    began = time.thread_time()
    fn()
    return time.thread_time() - began


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    files = _files(dataset(100_000), args.files)
    events = [FileEvent("`default`.`t`", f.uri, f.identity, f.size, f.mtime_ns, COMMITTING,
                        10, f.size, "", "run-0123456789abcdef", "stage_host_1_2_3_abcd", 7,
                        table_uuid="0f1e2d3c-0000-4000-8000-000000000000") for f in files]
    if _rows_before(events) != _rows_now(events):
        raise AssertionError("the rows differ")
    pairs = {
        "ledger rows (2 a file)": (lambda: (_rows_before(events), _rows_before(events)),
                                   lambda: (_rows_now(events), _rows_now(events))),
        "loaded events": (lambda: [e.moved(LOADED) for e in events],
                          lambda: ledger.moved(events, LOADED)),
        "identities (2 a file)": (lambda: _identities_before(files),
                                  lambda: _identities_now(files)),
    }
    print(f"# {len(files):,} files, {args.repeat} rounds alternated, CPU s of this thread, "
          f"load average {os.getloadavg()[0]:.1f}")
    for label, (before, now) in pairs.items():
        spent: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(args.repeat):
            spent["before"].append(_cpu(before))
            spent["now"].append(_cpu(now))
        b, n = statistics.median(spent["before"]), statistics.median(spent["now"])
        print(f"{label:24} before {b:6.3f} s  now {n:6.3f} s  ({n / b:.2f}x)")
    print(f"# load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
