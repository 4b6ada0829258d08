"""Sources: turn what the user typed into a list of `SourceFile`s with identities.

One module per kind of source, each implementing `Source` as its `SOURCE`, found by
URI scheme (`SCHEMES`, `source_for`). Each lists its units (never reads their rows)
and describes how the engine can reach them; the engine does all the reading. What a
source needs to list (format, S3 settings, the engine that lists HDFS) comes in a
`SourceContext` built once by the caller: nothing here reads the environment.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from chload.errors import UsageError
from chload.formats import FileFormat

if TYPE_CHECKING:
    from chload.sources.aws import S3Settings


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


Query = Callable[[str], list[dict]]  # runs SQL in an engine, returns small rows


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What listing needs beyond the pattern, resolved once at the top (api) and passed
    down: no source reads the environment or finds an engine by itself.

    `query` runs SQL in the engine that will read the data: HDFS is listed through the
    engine's own hdfs() (the client that reads it, hdfs.py), and chDB allows one engine
    path per process, so that engine is the target's (given by api, never taken).
    `s3` is None unless a source is s3:// (resolving reads ~/.aws and may import botocore).
    """

    format: str | None = None
    compression: str | None = None
    workdir: str = "."  # where standard input is spooled (the target's tmp directory)
    s3: S3Settings | None = None
    query: Query | None = None


class Source(Protocol):
    """What every kind of source provides: listing with identities, and the engine's
    reader. One module of chload.sources per kind, exposing `SOURCE`; see `SCHEMES`."""

    kind: str  # the module's name; SourceFile.kind of what it lists
    schemes: tuple[str, ...]  # the URI schemes it reads (SCHEMES says the same)

    def list(self, pattern: str, context: SourceContext) -> list[SourceFile]:
        """Every unit the pattern names, each once, with its identity; reads no rows."""
        ...

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        """The SQL table function with which the engine reads `file` (never a secret)."""
        ...

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        """One table function over several files and the SQL giving each row's uri, or
        None: read them one by one."""
        ...

    def release(self, files: Iterable[SourceFile]) -> None:
        """Remove what listing made for the engine (links, spools); never a source."""
        ...

    def current(self, file: SourceFile) -> SourceFile:
        """`file` with its identity as it is now (identity.py); as listed if unknowable."""
        ...

    def still_there(self, file: SourceFile) -> bool | None:
        """Whether `file` can still be read, asked cheaply; None: only a read can tell."""
        ...

    def reads_at_uri(self, file: SourceFile) -> bool:
        """True when the engine reads `file` at its uri, so its `_path` is the uri."""
        ...

    def known_empty(self, file: SourceFile) -> bool:
        """True when `file` surely holds no bytes (a size of 0 that is not just unsaid)."""
        ...


# URI scheme -> kind, which is the module of chload.sources whose `SOURCE` lists and
# reads it. A path without a scheme (and `-`, standard input) is `local`. A new kind of
# source is one module and one line here, e.g. for `kafka://broker:9092/topic`:
#     chload/sources/kafka.py  (class KafkaSource: kind = "kafka" ...; SOURCE = KafkaSource())
#     "kafka": "kafka",
SCHEMES: dict[str, str] = {
    "file": "local",
    "s3": "s3",
    "hdfs": "hdfs",
    "http": "http",
    "https": "http",
}


def kind_of(pattern: str) -> str:
    """Which kind of source reads what the user typed (a path, `-`, or scheme://...)."""
    if "://" not in pattern:
        return "local"
    scheme = pattern.split("://")[0].lower()
    if scheme not in SCHEMES:
        raise UsageError(f"{pattern.split('@')[-1]}: {scheme}:// is not a source chload "
                         "reads; use a path, s3://, hdfs://, http:// or https://")
    return SCHEMES[scheme]


def source_for(what: str | SourceFile) -> Source:
    """The source that lists a pattern, or that listed a file (by its `kind`)."""
    kind = what.kind if isinstance(what, SourceFile) else kind_of(what)
    if kind not in SCHEMES.values():
        raise NotImplementedError(f"{kind}: no reader for this kind of source")
    source: Source = importlib.import_module(f"chload.sources.{kind}").SOURCE
    return source


def table_function(file: SourceFile, fmt: str, structure: str | None) -> str:
    """The SQL table function with which the engine reads `file` itself (pull).

    `structure` None means: let the engine infer it. One place per kind of source, so
    targets never build source SQL (and secrets stay out of SQL text where possible).
    """
    return source_for(file).table_function(file, fmt, structure)


def table_function_many(files: Sequence[SourceFile], fmt: str,
                        structure: str | None) -> tuple[str, str] | None:
    """One table function reading several files, and the SQL expression that gives each
    row's file `uri`; None when the files cannot share one (read them one by one).

    For object stores this is what makes many small objects fast: the engine reads a
    `{a,b,c}` list of keys without listing, and 256 objects take one query plan
    instead of 256 (measured on MinIO: 0.45 s against 2.4 s for a UNION ALL).
    """
    if len(files) < 2 or len({f.kind for f in files}) != 1:
        return None
    return source_for(files[0]).table_function_many(files, fmt, structure)


def release(files: Iterable[SourceFile]) -> None:
    """Release what listing made for each file (its source's `release`)."""
    by_kind: dict[str, list[SourceFile]] = {}
    for f in files:
        by_kind.setdefault(f.kind, []).append(f)
    for group in by_kind.values():
        source_for(group[0]).release(group)


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
