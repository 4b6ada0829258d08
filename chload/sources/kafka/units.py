"""Kafka units read into spool files: the spooled path of source.py's rounds.

A unit (topic, partition, offsets) is read by read.SpoolReader into a file of its
values joined by newlines, in the target's tmp directory, and loaded like a local file;
the next round's units are read in a thread while one loads (`following`, `taken`).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chload.formats import FileFormat
from chload.sources.base import SourceFile, StreamPosition
from chload.sources.kafka.plan import Partition
from chload.sources.kafka.read import Spooled, SpoolReader, Unit

if TYPE_CHECKING:
    from chload.targets.base import Target

_EXTENSIONS = {"JSONEachRow": "jsonl", "CSV": "csv", "TSV": "tsv", "TabSeparated": "tsv"}

@dataclass(slots=True)
class Spool:
    """A unit read into its spool file, and the committed end its commit requires."""

    part: Partition
    unit: Unit
    after: int
    file: SourceFile


def following(spools: list[Spool], rows: int) -> list[tuple[Partition, Unit, int]]:
    """The unit after each spool's, where its partition has offsets due beyond it."""
    return [(s.part, Unit(s.part.topic, s.part.partition, s.unit.last + 1,
                          min(s.part.end, s.unit.last + 1 + rows) - 1), s.unit.last + 1)
            for s in spools if s.unit.last + 1 < s.part.end]


def taken(ahead: Future[list[Spool]] | None, due: list[Partition], rows: int) -> list[Spool]:
    """The spools read ahead that still follow their partition's end; others removed."""
    if ahead is None:
        return []
    kept = []
    for s in ahead.result():
        due_now = any(s.part is p for p in due)
        if due_now and s.unit.first == s.part.next == s.after == s.part.after:
            kept.append(s)
        else:
            remove(s.file.local_path)
    return kept


def drop_ahead(ahead: Future[list[Spool]]) -> None:
    try:
        for s in ahead.result():
            remove(s.file.local_path)
    except Exception:  # noqa: BLE001 - a read ahead that nothing needs any more
        pass


def line_base(read: Spooled) -> int:
    """Row n of a unit is offset base + n, where its offsets have no gap; else 0."""
    return read.first_offset - 1 if read.contiguous and read.first_offset >= 0 else 0


def read_units(reader: SpoolReader, fmt: FileFormat, spool: str,
          units: list[tuple[Partition, Unit, int]], audit: int = 0) -> list[Spool]:
    """Read units into spool files (one call for all); `after` per unit is the committed
    end its commit will require."""
    if not units:
        return []
    ext = _EXTENSIONS.get(fmt.name, "txt")
    paths = [os.path.join(spool, f"kafka-{u.topic}-{u.partition}-{u.first}-{u.last}.{ext}")
             for _, u, _ in units]
    done = reader.read([(u, path) for (_, u, _), path in zip(units, paths, strict=True)],
                       audit)
    return [Spool(part, unit, after, _spooled(part, unit, after, path, read, fmt))
            for (part, unit, after), path, read in zip(units, paths, done, strict=True)]


def _spooled(part: Partition, unit: Unit, after: int, path: str, read: Spooled,
             fmt: FileFormat) -> SourceFile:
    base = line_base(read)
    identity = f"{part.topic_id}:{unit.first}-{unit.last}"
    return SourceFile(f"{part.stream}/{unit.first}-{unit.last}", read.bytes, 0, fmt,
                      etag=identity, local_path=path,
                      position=StreamPosition(part.stream, after, part.since_seq, base))


@contextmanager
def spool_dir(target: Target) -> Iterator[str]:
    """Spools in the `tmp` directory of the target's workdir (Target.workdir: an
    embedded target's directory, a server's temporary one); else the system's."""
    home = target.workdir
    base = os.path.join(home, "tmp") if home and os.path.isdir(home) else None
    if base:
        os.makedirs(base, exist_ok=True)
    path = tempfile.mkdtemp(prefix="chload-kafka-", dir=base)
    try:
        yield path
    finally:
        for name in os.listdir(path):
            remove(os.path.join(path, name))
        os.rmdir(path)


def remove(path: str | None) -> None:
    if path and os.path.exists(path):
        os.remove(path)


def offset_error(error: str, f: SourceFile) -> str:
    """`<unit uri>: line N, ...` (a row of the spool; a streamed unit's engine error
    says `(at row N)` instead) as the message's offset."""
    base = f.position.line_base if f.position else 0
    match = re.match(rf"^{re.escape(f.uri)}: line (\d+)", error)
    if match and base:
        return f"{f.uri}: offset {base + int(match.group(1))}{error[match.end():]}"
    row = re.search(r" ?\(at row (\d+)\)", error)
    if row and base and error.startswith(f"{f.uri}: "):
        rest = (error[:row.start()] + error[row.end():])[len(f.uri) + 2:]
        return f"{f.uri}: offset {base + int(row.group(1))}, {rest}"
    return error
