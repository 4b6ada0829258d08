"""A remote object posted to a server as it is stored (*relay*): its bytes streamed here
from its source (Source.stream: one GET, `If-Match` its listed identity) straight into
the INSERT's body, for the server to decompress and parse, as a local file's bytes are
posted (fill.py `_post_raw`). The loader's engine does no work for such a unit; a push
would decompress, parse and re-encode every row here, on the cores the server parses
with.

What a local file's read tells the planner is told here by the object's first chunk,
decompressed in this process (at most sniff.LIMIT bytes of text), before anything is
posted: its header, whose columns an 18.16 server takes by position; an empty CSV field
of a Nullable column, which 18.16 reads as the type's default; a value its column cannot
hold (fit.py), which a server's text formats store as another value. An object failing
any of them, or whose start cannot be read so (a compression not inflated here), is
`Unfit`: fill.py pushes it through the loader's engine, which reads columns by name and
refuses what does not fit.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from chload.core.reading import fit, sniff
from chload.runtime.faults import crash_point
from chload.schema import header_columns
from chload.targets.base import LoadJob

HEAD_BYTES = 1 << 16  # bytes as stored read before deciding (the first chunk is larger)


class Unfit(Exception):
    """The object is to be pushed through the loader's engine; nothing was posted."""


@dataclass
class Relay:
    """An object's bytes as stored (`chunks`: every chunk, the ones read to decide
    included) and the columns they fill, in the file's order (`names`)."""

    names: list[str]
    chunks: Iterator[bytes]
    empty: bool  # the object has no bytes
    reading: Generator[bytes, None, None]  # the source's read, ended by `close`

    def close(self) -> None:
        self.reading.close()


def relayable(job: LoadJob) -> bool:
    """Whether the job's file is remote and its source can stream it here."""
    return (not job.file.local_path and job.stream is not None
            and job.stream(job.file) is not None)


def open_relay(job: LoadJob, empty_differs: bool, engine: str) -> Relay:
    """Start reading the object and decide from its start (module docstring); Unfit if
    it is to be pushed. `empty_differs`: the server reads an empty CSV field of a
    Nullable column as the default. The caller closes `chunks` (a generator)."""
    opener = job.stream(job.file) if job.stream is not None else None
    if opener is None:
        raise Unfit
    crash_point("relay")  # (tests: an object rewritten after it was listed)
    chunks = opener()
    assert isinstance(chunks, Generator)
    read: list[bytes] = []
    stored = 0
    for chunk in chunks:
        read.append(chunk)
        stored += len(chunk)
        if stored >= HEAD_BYTES:
            break
    relay = Relay([c.name for c in job.columns], itertools.chain(read, chunks), not stored,
                  chunks)
    if not stored:
        return relay
    try:
        _check(job, relay, b"".join(read), stored < HEAD_BYTES, empty_differs, engine)
    except Unfit:
        relay.close()
        raise
    return relay


def _check(job: LoadJob, relay: Relay, raw: bytes, whole: bool, empty_differs: bool,
           engine: str) -> None:
    f = job.file
    head = sniff.inflate_start(raw, f.format.compression)
    if head is None:
        raise Unfit
    head = head[:sniff.LIMIT]
    if f.format.has_header:
        end = head.find(b"\n")
        if end < 0 and not (whole and len(head) < sniff.LIMIT):
            raise Unfit  # a first line longer than what was read
        try:
            text = (head if end < 0 else head[:end + 1]).decode("utf-8")
        except UnicodeDecodeError:
            raise Unfit from None
        fields = sniff.split_line(text, f.format)
        if fields:
            relay.names = header_columns(fields)
        if not set(relay.names) <= {c.name for c in job.columns}:
            raise Unfit  # a column the table lacks: dropped as read, by the engine
    if empty_differs and fit.empty_fields(f, head):
        raise Unfit
    if fit.check(f, job.columns, [c.name for c in job.read_columns], dict(job.settings),
                 job.table_display, engine, head=head):
        raise Unfit
