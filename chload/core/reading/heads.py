"""The first lines of a run's files, judged once per distinct line.

The header check (core/plan.py check_headers) asks each CSV/TSV file of a run for the
fields of its first line (sniff.header_names) and whether it can be read as written
(sniff.unreadable), and each text file whether its first values fit (fit.check). The
files of one export share a first line, and a first load of many small files asks each
of them: here each file's start is looked up once (sniff.starts) and its first line is
one slice of it; what depends only on that line and the format is worked out once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chload.core.reading import sniff
from chload.formats import FileFormat
from chload.schema import AUDIT_COLUMNS, Column
from chload.sources.base import SourceFile


@dataclass(frozen=True, slots=True, eq=False)  # (one for the files of one first line)
class Head:
    """What a file's first line tells: `named`, its format is CSV/TSV with a header;
    `fields`, that header's fields (None: not read here, the engine reads them);
    `unreadable`, why the file cannot be read as written (sniff.unreadable)."""

    named: bool
    fields: list[str] | None = None
    unreadable: str | None = None


_OTHER = Head(False)  # a format with no first line to read here (Parquet, JSON, ...)


def read(files: Sequence[SourceFile]) -> list[Head]:
    """Each file's Head, its start (sniff.start) read _CHUNK files at a time and let go:
    a run of many large files holds a few of their starts at once, not all."""
    heads: list[Head] = [_OTHER] * len(files)
    for fmt, at in by_format(files):
        if sniff.delimiter(fmt) is None:
            continue
        known: dict[bytes | None, Head] = {}  # first line -> its Head
        judged: list[Head] = []
        for first in range(0, len(at), _CHUNK):
            if len(known) > _CHUNK:  # (distinct first lines, as a headerless file has)
                known.clear()
            got = sniff.starts([files[i] for i in at[first:first + _CHUNK]])
            judged += [known.get(line) or known.setdefault(line, _judged(line, fmt))
                       for line in (None if d is None else d[:d.find(b"\n") + 1] or d
                                    for d in got)]  # (the first line, as sniff._first_line)
        if len(at) == len(files):  # (one format: the usual run)
            return judged
        for i, head in zip(at, judged, strict=True):
            heads[i] = head
    return heads


_CHUNK = 512


def by_format(files: Sequence[SourceFile]) -> list[tuple[FileFormat, list[int]]]:
    """The indexes of `files` by format object (a listing shares one: usually one)."""
    if not files:
        return []
    if all(f.format is files[0].format for f in files):
        return [(files[0].format, list(range(len(files))))]
    found: dict[int, list[int]] = {}
    for i, f in enumerate(files):
        found.setdefault(id(f.format), []).append(i)
    return [(files[at[0]].format, at) for at in found.values()]


def _judged(line: bytes | None, fmt: FileFormat) -> Head:
    """The Head of a CSV/TSV file of `fmt` whose first line is `line` (None: unread), as
    sniff.header_names and sniff.unreadable judge it."""
    if line is None:
        return Head(fmt.has_header)
    text = sniff.line_text(line) if fmt.has_header else None
    return Head(fmt.has_header, None if text is None else sniff.split_line(text, fmt),
                sniff.unreadable_line(line))


NEW_HINT = ("Pass --on-new-column add to add them to the table (or ignore to load the "
            "other columns), or add them yourself (ALTER TABLE ... ADD COLUMN)")


def mismatch(names: Sequence[str], read: Sequence[str], table_columns: Sequence[Column],
             audit: bool, by_position: bool, new_columns: str = "fail") -> str:
    """Why a file with these header `names` cannot load with the run ('' if it can)."""
    table = {c.name: c for c in table_columns}
    optional = {c.name for c in table_columns if c.default_kind}
    optional |= set(AUDIT_COLUMNS) if audit else set()
    unknown = [n for n in names if n not in table and new_columns != "ignore"]
    unread = [n for n in names if n in table and n not in read]
    missing = [n for n in read if n not in names and n not in optional
               and new_columns == "fail"]
    parts = []
    if unknown:
        parts.append(f"columns in the data but not in the table: {', '.join(unknown)}")
    if missing:
        parts.append(f"columns in the table but not in the data: {', '.join(missing)}")
    if unread:
        parts.append(f"columns the run's other files lack: {', '.join(unread)} (load it on "
                     "its own)")
    if not parts and by_position and list(names) != list(read):
        parts.append(f"columns {', '.join(names)} in another order than {', '.join(read)} "
                     "(a header with an empty or repeated name is read by position)")
    return "; ".join(parts)
