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
from chload.formats import JSON_LINES, FileFormat
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


def read(files: Sequence[SourceFile]) -> tuple[list[Head], list[bytes | None]]:
    """Each file's Head and start (sniff.start; None for a format not read as text)."""
    heads: list[Head] = [_OTHER] * len(files)
    starts: list[bytes | None] = [None] * len(files)
    for fmt, at in by_format(files):
        delimited = sniff.delimiter(fmt) is not None
        if not delimited and fmt.name not in JSON_LINES:
            continue
        whole = len(at) == len(files)  # (one format: the usual run)
        got = sniff.starts(files if whole else [files[i] for i in at])
        judged = _judged_all(got, fmt) if delimited else [_OTHER] * len(got)
        if whole:
            return judged, got
        for k, i in enumerate(at):
            heads[i], starts[i] = judged[k], got[k]
    return heads, starts


def _judged_all(starts: list[bytes | None], fmt: FileFormat) -> list[Head]:
    """The Head of each CSV/TSV file of `fmt` by its start: once a distinct first line."""
    known: dict[bytes | None, Head] = {}
    return [known.get(line) or known.setdefault(line, _judged(line, fmt)) for line in (
        None if d is None else d[:d.find(b"\n") + 1] or d  # (as sniff._first_line)
        for d in starts)]


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
