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
    formats = {id(f.format): f.format for f in files}.items()
    delimited = {k for k, fmt in formats if sniff.delimiter(fmt) is not None}
    texts = delimited | {k for k, fmt in formats if fmt.name in JSON_LINES}
    text = [i for i, f in enumerate(files) if id(f.format) in texts]
    starts: list[bytes | None] = [None] * len(files)
    for i, data in zip(text, sniff.starts([files[i] for i in text]), strict=True):
        starts[i] = data
    heads = [_OTHER] * len(files)
    known: dict[tuple[int, bytes | None], Head] = {}  # (format, first line) -> its Head
    for i in text:
        fmt = files[i].format
        if id(fmt) not in delimited:
            continue
        data = starts[i]  # its first line, as sniff._first_line cuts it
        line = None if data is None else data[:data.find(b"\n") + 1] or data
        head = known.get((id(fmt), line))
        if head is None:
            head = known[(id(fmt), line)] = _judged(line, fmt)
        heads[i] = head
    return heads, starts


def _judged(line: bytes | None, fmt: FileFormat) -> Head:
    """The Head of a CSV/TSV file of `fmt` whose first line is `line` (None: unread), as
    sniff.header_names and sniff.unreadable judge it."""
    if line is None:
        return Head(fmt.has_header)
    text = sniff.line_text(line) if fmt.has_header else None
    return Head(fmt.has_header, None if text is None else sniff.split_line(text, fmt),
                sniff.unreadable_line(line))
