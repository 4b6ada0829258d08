"""What every source is: a unit (`SourceFile`), the `Source` protocol, its defaults.

One module per kind of source, each implementing `Source` as its `SOURCE`, found by
URI scheme (`SCHEMES`, `source_for`). Each lists its units (never reads their rows)
and describes how the engine can reach them; the engine does all the reading. What a
source needs to list (format, S3 settings, the engine that lists HDFS, the ledger's
committed units) comes in a `SourceContext` built once by the caller: nothing here
reads the environment. A run holds its sources in `RunSources`: a source that keeps a
session from listing to loading (a database snapshot) keeps it there, not in a global.
"""

from __future__ import annotations

import builtins
from array import array
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

from chload.formats import FileFormat

if TYPE_CHECKING:
    from chload.api import LoadReport, LoadSpec
    from chload.core.plan import TableName
    from chload.core.run import Listener
    from chload.schema import Column
    from chload.sources.files.aws import S3Settings
    from chload.sources.files.azure import AzureSettings
    from chload.targets.base import Target


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


def partly_committed(uris: Iterable[str],
                     complete: Container[str]) -> dict[str, tuple[int, int]]:
    """Each stream's lowest unit (`<stream>/<first>-<last>`) of `uris` not in `complete`:
    into a cluster, the unit some shards have committed and others lack (a run killed
    between two shards' commits), which the stream's next run loads again, that range
    exactly, and commits on the shards lacking it (targets/cluster `_pending`). Kafka's
    partitions and change capture's streams (sources/changes/table.py) alike."""
    pending: dict[str, tuple[int, int]] = {}
    for uri in sorted((u for u in uris if u not in complete), key=_unit_first):
        stream, _, span = uri.rpartition("/")
        first, _, last = span.partition("-")
        pending.setdefault(stream, (int(first), int(last)))
    return pending


def _unit_first(uri: str) -> int:
    return int(uri.rpartition("/")[2].partition("-")[0] or 0)


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
    kind: str = "local"  # which module of chload.sources reads it: local, s3, hdfs, http, ...
    location: str = ""  # remote kinds: the URL the engine reads, if not `uri` (never a
    # secret); a unit fetched before loading (Source.fetch): what its source reads
    anonymous: bool = False  # s3: no credentials, read unsigned (public buckets)
    position: StreamPosition | None = None  # a unit of a stream (Kafka): see StreamPosition
    empty: bool = False  # surely holds no bytes (Source.known_empty, asked when listed)
    aliases: tuple[str, ...] = ()  # other uris a ledger may know it by: a path's abspath
    # spelling, which chload 0.1.0 recorded before uris became the realpath
    constants: tuple[tuple[str, str, str], ...] = ()  # columns its rows hold that its
    # bytes do not (a Delta table's partition values): (name, type, SQL of the value),
    # which every read of the file adds (sources/registry.py table_function)

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def identity(self) -> str:
        return self.etag or f"{self.size}:{self.mtime_ns}"


_FILE_FIELDS = tuple(f.name for f in fields(SourceFile))
_FILE_VALUES = attrgetter(*_FILE_FIELDS)
_FILE_INDEX = {name: i for i, name in enumerate(_FILE_FIELDS)}


def revised(file: SourceFile, **changes: Any) -> SourceFile:
    """`dataclasses.replace(file, **changes)` at about half its cost: a first load of
    many small files makes a copy of each several times (its format, its identity as
    read)."""
    values = list(_FILE_VALUES(file))
    for name, value in changes.items():
        values[_FILE_INDEX[name]] = value
    return SourceFile(*values)


@dataclass(frozen=True, slots=True)
class Skipped:
    """Units a listing found loaded as they are now (`KnownKeys` told it), counted where
    they were met, never made into a `SourceFile`: a rerun over a long history."""

    count: int


class KnownKeys(Protocol):
    """The units loaded into the run's table, as commit/known.py holds them: `uris`
    (sorted) and `identities`, the 64-bit keys of each, and `met`, a byte a unit that a
    listing sets once it has met the unit. A listing that can compare keys itself (the
    local walk's C loop) passes by those that match and yields them as `Skipped`."""

    uris: array
    identities: array

    @property
    def met(self) -> bytearray: ...

    def __len__(self) -> int: ...


Query = Callable[[str], list[dict]]  # runs SQL in an engine, returns small rows


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What listing needs beyond the pattern, resolved once at the top (api) and passed
    down: no source reads the environment or finds an engine by itself.

    `query` runs SQL in the engine that will read the data: HDFS is listed through the
    engine's own hdfs() (the client that reads it, hdfs.py), and chDB allows one engine
    path per process, so that engine is the target's (given by api, never taken).
    `s3` is None unless a source is s3:// (resolving reads ~/.aws and may import botocore);
    `azure` and `gcs` likewise, for az:// and gs:// sources.
    """

    format: str | None = None
    compression: str | None = None
    workdir: str = "."  # where standard input is spooled (the target's tmp directory)
    s3: S3Settings | None = None
    azure: AzureSettings | None = None
    gcs: S3Settings | None = None  # gs://: GCS's S3-interoperable API (files/gcs.py)
    query: Query | None = None
    patterns: tuple[str, ...] = ()  # every source the run names (one that loads alone checks)
    select: str | None = None  # --query: a database source loads this SELECT's rows
    incremental_by: str | None = None  # --incremental-by: a column that only grows
    snapshot: str | None = None  # a database source's copy reads this exported snapshot
    # (a followed PostgreSQL table's: its slot's, sources/changes/postgres/)
    force: bool = False  # --force: a source of ranges lists every range, committed or not
    mode: str = "append"  # --mode: under replace-table a table format's source lists a
    # snapshot that rewrote loaded data files whole (sources/lake/table.py)
    workers: int | None = None  # --workers (None: automatic): a source cutting ranges cuts
    # enough for them
    committed: Callable[[], Mapping[str, str]] | None = None  # uri -> identity of the units
    # committed into the run's table (the ledger's, of the table as it is now, `committing`
    # ones included: recovery finishes them); a source of ranges lists the complement
    last_commit: Callable[[], tuple[str, int] | None] | None = None  # the run id and time
    # (ns) of the latest of those units: a finished copy's report says which run made it
    pipes: bool = False  # the engine that loads runs in this process and reads a pipe
    # (/dev/fd/N): a fetched unit may stream into it rather than be spooled first
    key_order: bool = False  # the target sorts a unit by its key after the last byte
    # (Target.wants_key_order): a database source reads ranges in key order where cheap
    last_loaded: Callable[[str], str] | None = None  # --after-last-key: the greatest uri
    # loaded into the run's table (as it is now) that begins with a prefix, '' if none;
    # an S3 listing starts after it
    schema: str | None = None  # --schema: a database source carries a column it cannot
    has_type: Callable[[str], bool] | None = None  # the target stores a type of this family
    # (Target.has_type; None: not known): a database source types a date column Date on a
    # server without Date32 where every value fits (databases/base.py)
    engine: str = ""  # which ClickHouse stores the rows (Target.engine_name)
    rejects: bool = False  # an error budget rejects rows (--max-errors)
    table_exists: Callable[[], bool] | None = None  # the run's table exists now (its types
    # are the table's, not what the source describes; None: not known)
    known: KnownKeys | None = None  # the units loaded into the run's table (RunSources.
    # against): a listing may pass those it meets unchanged as `Skipped`; None: list all


class Source(Protocol):
    """What every kind of source provides: listing with identities, and the engine's
    reader. One module of chload.sources per kind, exposing `SOURCE`; see `SCHEMES`.

    A source whose units the engine reads where they are (files, objects: `InPlace`
    gives those answers) implements listing and reading. A source whose units must be
    made readable first (a key range of a database snapshot, an offset range of a Kafka
    partition) uses the other hooks, each asked in one place:

    - `open` (api, once per kind and run: `RunSources`): the object for this run; a
      source keeping a session from listing to loading returns a new one, whose `list`
      opens the session and whose `close` (api, when the run ends) ends it;
    - `fetch` (the runner, right before a unit's load, retried on TransientError):
      the unit as a local file with the same uri and identity (a spool under
      `workdir`), removed by the same source's `release` right after the load;
    - `loads_alone` (api, when grouping): a unit never batched with others;
    - `columns`, `sorting_key` (api, before inference): what the source knows of its
      data's columns and key; the planner then infers nothing;
    - `display` (api: the run's record, messages): a pattern without its secrets;
    - `stored`, `settle` (the run, before any unit is fetched; before each commit): the
      table's types told, and what the source checks against them waited for;
    - `options`: the LoadSpec fields only this kind reads (`query`, `incremental_by`):
      given while no source of the run reads them, they are a usage error;
    - `unit`: what the summary calls one unit (`file`, a database's `range`, a Kafka
      `batch`); `notes` (api, after the run): what this run's object found worth
      saying in the report, not an error (a finished copy that loads nothing).
    """

    kind: str  # the kind's name in the registry; SourceFile.kind of what it lists
    schemes: tuple[str, ...]  # the URI schemes it reads (SCHEMES says the same)
    options: tuple[str, ...]  # LoadSpec fields only this kind reads
    unit: str  # one unit, as the summary names it: file, range, batch
    reads_in_place: bool  # the engine reads its units where they are (files, objects):
    # DESCRIBE reads a typed file's own columns, and values are checked as the engine reads
    grows: bool  # a unit may still be written when listed (a local file): a load that
    # follows takes it once unchanged since the last poll (core/follow.py); an object,
    # written whole, is taken when listed

    def open(self) -> Source:
        """The object that lists, fetches and releases this run's units: `self`, unless
        the source keeps something from listing to loading (then a new object)."""
        ...

    def list(self, pattern: str, context: SourceContext) -> Iterable[SourceFile | Skipped]:
        """Every unit the pattern names, each once, with its identity; reads no rows.
        A long listing is best yielded as it comes (the plan holds only new units);
        units `context.known` holds unchanged may come counted, as `Skipped`."""
        ...

    def described(self, files: Sequence[SourceFile],
                  context: SourceContext) -> builtins.list[SourceFile]:
        """`files` (units the plan will load), each with what only its bytes tell (a
        text file's compression, by its first bytes), in their order: listing leaves
        it out, so a unit the ledger skips costs no read."""
        ...

    def start(self, file: SourceFile, limit: int, context: SourceContext) -> bytes | None:
        """A remote unit's first `limit` bytes as stored (one ranged read), for its
        first line (planner.check_headers), or None: the engine reads that line."""
        ...

    def stream(self, file: SourceFile, context: SourceContext,
               ) -> Callable[[], Iterator[bytes]] | None:
        """How to read a remote unit's bytes as stored, streamed here (one read each time
        it is called), for a target that posts them to a server as they are; None: the
        source cannot (the engine reads the unit). Calling it reads nothing yet."""
        ...

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        """The SQL table function with which the engine reads `file` (never a secret)."""
        ...

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        """One table function over several files and the SQL giving each row's uri, or
        None: read them one by one."""
        ...

    def fetch(self, file: SourceFile, columns: Sequence[Column], workdir: str) -> SourceFile:
        """`file` made readable by the engine: itself, or a local copy of its bytes (same
        uri and identity, `kind` local, `local_path` a spool under `workdir`) that the
        engine reads as `columns` (a source converting while it spools writes those)."""
        ...

    def release(self, files: Iterable[SourceFile]) -> None:
        """Remove what listing or `fetch` made for the engine (links, spools); never a
        source."""
        ...

    def close(self) -> None:
        """End what this run's object keeps (a session, a snapshot); the run is over."""
        ...

    def loads_alone(self, file: SourceFile) -> bool:
        """True when `file` is committed on its own, never in a batch of small files."""
        ...

    def columns(self, files: Sequence[SourceFile]) -> builtins.list[Column] | None:
        """The columns of `files`' data, when the source knows them (a database table's);
        None: the engine infers them."""
        ...

    def sorting_key(self, files: Sequence[SourceFile]) -> str | None:
        """ORDER BY for a table created for `files` (a primary key), if the source has one."""
        ...

    def display(self, pattern: str) -> str:
        """`pattern` as shown in the run's record and messages (never a secret)."""
        ...

    def current(self, file: SourceFile) -> SourceFile:
        """`file` with its identity as it is now (identity.py); as listed if unknowable."""
        ...

    def current_many(self, files: Sequence[SourceFile]) -> Iterator[SourceFile]:
        """`current` of each of `files` (a batch's), in order, each asked as it is taken
        (a caller that stops early asks no more)."""
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

    def begin_early(self, pattern: str, context: SourceContext) -> Callable[[], None] | None:
        """Start, while the target opens, what listing `pattern` will need (a database's
        snapshot session); the cleanup to call when the run ends, or None: nothing begun."""
        ...

    def stored(self, columns: Sequence[Column], read: Sequence[Column], engine: str,
               rejects: bool) -> None:
        """The run's table as the target stores it (`columns`), the types its rows are
        read as (`read`), the engine that parses them and whether an error budget keeps
        rejected rows: told before any unit is fetched, to a source that checks values
        against the target's types (a database's)."""
        ...

    def notes(self) -> builtins.list[str]:
        """What listing found worth a line of the report (not an error), e.g. that a
        copy finished by an earlier run loads nothing now, and what would."""
        ...

    def listing_calls(self) -> int:
        """The requests this run's object made to list (S3's ListObjectsV2 pages); 0
        where listing asks no service by pages."""
        ...

    def settle(self) -> None:
        """Wait for what the source checks of every unit before any commits (a
        database's query beside the ranges, begun by `stored`); raise what it found
        (errors.ValuesRefused). Asked right before each commit, and once the units ran."""
        ...


class InPlace:
    """The `Source` answers of a kind whose units the engine reads where they are
    (files, objects): one object for every run, nothing fetched, batched when small,
    columns inferred by the engine, shown as typed."""

    options: tuple[str, ...] = ()
    unit = "file"
    reads_in_place = True
    grows = False

    def open(self) -> Source:
        return self  # type: ignore[return-value]  # the subclass is the Source

    def fetch(self, file: SourceFile, columns: Sequence[Column], workdir: str) -> SourceFile:
        return file

    def described(self, files: Sequence[SourceFile],
                  context: SourceContext) -> builtins.list[SourceFile]:
        return builtins.list(files)

    def start(self, file: SourceFile, limit: int, context: SourceContext) -> bytes | None:
        return None

    def stream(self, file: SourceFile, context: SourceContext,
               ) -> Callable[[], Iterator[bytes]] | None:
        return None

    def close(self) -> None:
        return None

    def loads_alone(self, file: SourceFile) -> bool:
        return False

    def columns(self, files: Sequence[SourceFile]) -> builtins.list[Column] | None:
        return None

    def sorting_key(self, files: Sequence[SourceFile]) -> str | None:
        return None

    def display(self, pattern: str) -> str:
        return pattern

    def current_many(self, files: Sequence[SourceFile]) -> Iterator[SourceFile]:
        return map(self.current, files)  # type: ignore[attr-defined]

    def begin_early(self, pattern: str, context: SourceContext) -> Callable[[], None] | None:
        return None

    def stored(self, columns: Sequence[Column], read: Sequence[Column], engine: str,
               rejects: bool) -> None:
        return None

    def notes(self) -> builtins.list[str]:
        return []

    def listing_calls(self) -> int:
        return 0

    def settle(self) -> None:
        return None


class RemoteSource(InPlace):
    """The `Source` answers every kind reached over the network shares (object stores,
    HTTP, HDFS, Kafka, databases; a subclass lists and reads): listing makes nothing to
    release; a unit keeps its listed identity (identity.py says why); only a read tells
    whether it is still there; a size of 0 may just be unsaid (HTTP without
    Content-Length), so no unit is known empty."""

    kind = ""
    schemes: tuple[str, ...] = ()

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        return None

    def release(self, files: Iterable[SourceFile]) -> None:
        return None

    def current(self, file: SourceFile) -> SourceFile:
        return file

    def still_there(self, file: SourceFile) -> bool | None:
        return None

    def reads_at_uri(self, file: SourceFile) -> bool:
        return False

    def known_empty(self, file: SourceFile) -> bool:
        return False


# loads one round's units as one load, each unit exactly once: (units, workers, schema)
LoadRound = Callable[[list[SourceFile], int | None, str | None], "LoadReport"]


class Stream(Protocol):
    """A source whose units are planned and read round by round (a Kafka topic), not
    listed once: the API hands it the run and a `LoadRound` that loads each round."""

    def rounds(self, spec: LoadSpec, target: Target, listener: Listener,
               load_round: LoadRound, table: TableName, report: LoadReport) -> None:
        """Load the spec's streams into `table` round by round, adding each round's
        results to `report`, until caught up (or, following, until stopped)."""
        ...

    def audit_columns(self, target: Target, data: list[Column], fmt: str,
                      inferred: bool) -> list[Column]:
        """--audit: the data's columns with those the stream's reader writes into each
        row, at the types the target stores them."""
        ...
