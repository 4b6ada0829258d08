"""Sources: turn what the user typed into a list of `SourceFile`s with identities.

One module per kind of source. Each lists its objects (never reads their rows) and
describes how the engine can reach them; the engine does all the reading.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from chload.errors import UsageError
from chload.formats import FileFormat
from chload.records import dataclass


@dataclass(frozen=True)
class StreamPosition:
    """Where a unit of a stream (a Kafka partition) stands in that stream.

    A stream's units are named `<stream>/<first>-<last>` (offsets, inclusive), and the
    ledger holds them in order: a unit may commit only while the stream's committed end
    (last + 1 of its latest committed unit, 0 for none) is still `after`, the end its
    plan saw (commit.py checks it under the commit lock). Ledger events older than
    `since_seq` are set aside (a table re-created, a topic re-created with --force).
    `line_base`: row n of the unit's data is record `line_base + n` of the stream (a
    Kafka offset), for the rejects' `line`; 0 when rows are not numbered so.
    """

    stream: str
    after: int
    since_seq: int = 0
    line_base: int = 0


@dataclass(frozen=True)
class SourceFile:
    """One file or object to load, known by its identity.

    `uri` is what the ledger records and the user sees (never a secret);
    `size` and `mtime_ns` (or `etag`) make the identity: a file is loaded again when
    they change.
    """

    uri: str
    size: int
    mtime_ns: int
    format: FileFormat
    etag: str = ""
    local_path: str | None = None  # files on this machine: the path the engine reads (the
    # file itself, a plain-named link to it, or stdin's spool); `uri` when it is the file
    is_stream: bool = False  # stdin: no identity, never skipped
    kind: str = "local"  # which module of chload.sources reads it: local, s3, hdfs, http
    location: str = ""  # remote kinds: the URL the engine reads, if not `uri` (never a secret)
    anonymous: bool = False  # s3: no credentials, read unsigned (public buckets)
    position: StreamPosition | None = None  # a unit of a stream (Kafka): see StreamPosition

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def identity(self) -> str:
        return self.etag or f"{self.size}:{self.mtime_ns}"


class Source(Protocol):
    """What every kind of source provides: listing, with identities."""

    def list_files(self) -> list[SourceFile]: ...


def table_function(file: SourceFile, fmt: str, structure: str | None) -> str:
    """The SQL table function with which the engine reads `file` itself (pull).

    `structure` None means: let the engine infer it. One place per kind of source, so
    targets never build source SQL (and secrets stay out of SQL text where possible).
    """
    if file.kind == "local":
        from chload.sources.local import table_function as local

        return local(file, fmt, structure)
    if file.kind == "s3":
        from chload.sources.s3 import table_function as s3

        return s3(file, fmt, structure)
    if file.kind == "hdfs":
        from chload.sources.hdfs import table_function as hdfs

        return hdfs(file, fmt, structure)
    if file.kind == "http":
        from chload.sources.http import table_function as http

        return http(file, fmt, structure)
    raise NotImplementedError(f"{file.kind}: no reader for this kind of source")


def table_function_many(files: Sequence[SourceFile], fmt: str,
                        structure: str | None) -> tuple[str, str] | None:
    """One table function reading several files, and the SQL expression that gives each
    row's file `uri`; None when the files cannot share one (read them one by one).

    For object stores this is what makes many small objects fast: the engine reads a
    `{a,b,c}` list of keys without listing, and 256 objects take one query plan
    instead of 256 (measured on MinIO: 0.45 s against 2.4 s for a UNION ALL).
    """
    kinds = {f.kind for f in files}
    if len(files) < 2 or len(kinds) != 1:
        return None
    kind = kinds.pop()
    if kind == "local":
        from chload.sources.local import table_function_many as local

        return local(files, fmt, structure)
    if kind == "s3":
        from chload.sources.s3 import table_function_many as s3

        return s3(files, fmt, structure)
    if kind == "hdfs":
        from chload.sources.hdfs import table_function_many as hdfs

        return hdfs(files, fmt, structure)
    return None


_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Shell-style brace expansion: `a{1..3}` -> a1 a2 a3; `{x,y}` -> x y.

    Zero-padded ranges keep their width (`{000..099}`), as ClickHouse and bash do.
    """
    match = _BRACE.search(pattern)
    if not match:
        return [pattern]
    head, body, tail = pattern[: match.start()], match.group(1), pattern[match.end():]
    rng = _RANGE.match(body)
    if rng:
        lo, hi = int(rng.group(1)), int(rng.group(2))
        width = len(rng.group(1)) if rng.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        if abs(hi - lo) > 100_000:
            raise UsageError(f"{pattern}: range {{{body}}} expands to more than 100,000 names")
        options = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    elif "," in body:
        options = body.split(",")
    else:
        return [head + "{" + body + "}" + name for name in expand_braces(tail)]
    return [name for option in options for name in expand_braces(head + option + tail)]
