"""Table formats (Apache Iceberg, Delta Lake): a table's data files of one snapshot, as units.

A table written by Spark, Flink, dbt, pyiceberg or delta-rs is a set of immutable data
files (Parquet) named by a snapshot (Iceberg) or a version (Delta) in the table's
metadata. A loose-file glob over its folder would load files that later snapshots
deleted or compacted away; reading the metadata says which files make the table now.
So a table source lists the data files of the current snapshot (or the one the URI
pins: `?snapshot=` / `?version=`) and hands each to the engine as an ordinary Parquet
file (kind `s3` or `local`): the ledger, batching, pushing into 18.16 and the kill
guarantees are those of files. A data file never changes once written, so its path
and size are its identity.

Appends, or the whole table again. A later snapshot that appended adds data files and
keeps every earlier one: the plan loads just the new ones. A snapshot that deleted or
rewrote rows (overwrite, delete, update, merge, compaction) no longer holds some file
loaded earlier: `check_appends` refuses it in one line, loading nothing, naming
`--mode replace-table`, under which every data file of the snapshot is listed and the
run's new table, swapped in, is the snapshot (core/load.py, commit/swap.py). What the
engine could not read as plain files (Iceberg delete files, Delta deletion vectors,
renamed columns) is refused in every mode. A Delta table's partition values, kept in its
log and not in its files, come with each file as typed constants (`DataFile.constants`)
that every read of the file adds as columns (sources/registry.py).

This module knows neither format: iceberg.py and delta.py each read a `Snapshot`.
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

from chload.errors import NothingMatched, SourceError, UsageError
from chload.formats import FileFormat
from chload.sources.base import RemoteSource, Source, SourceContext, SourceFile
from chload.sources.files import aws
from chload.sources.files.s3 import parse_uri

DATA_FORMATS = {"parquet": "Parquet", "orc": "ORC", "avro": "Avro"}


@dataclass(frozen=True, slots=True)
class TableUri:
    """`iceberg+s3://bucket/path/table?snapshot=N` parsed: which format, where the table's
    root is (`s3://bucket/path` or an absolute local path) and the pinned snapshot."""

    pattern: str
    format: str  # iceberg, delta
    storage: str  # s3, file
    root: str  # s3://bucket/prefix, or an absolute path (no trailing /)
    pinned: str = ""  # a snapshot id or version the URI names; '' for the current one
    name: str = ""  # a catalog's table (`db.events`): `root` is then the catalog's file
    catalog: str = ""  # a catalog's name within that file ('': the only one)


@dataclass(frozen=True, slots=True)
class DataFile:
    """One data file of a snapshot: its location (s3://bucket/key or an absolute path),
    its size in bytes and its format (parquet, orc, avro); `constants`: the columns its
    rows hold that its bytes do not (a Delta table's partition values, SourceFile's)."""

    uri: str
    size: int
    format: str = "parquet"
    constants: tuple[tuple[str, str, str], ...] = ()


@dataclass(slots=True)
class Snapshot:
    """The data files that make a table at one snapshot, and what a load needs to know
    about how the table came to be so."""

    id: str  # the snapshot id (Iceberg) or version (Delta), as users name it
    files: list[DataFile] = field(default_factory=list)
    removals: list[tuple[str, str]] = field(default_factory=list)  # (id, operation) of
    # earlier snapshots that removed or rewrote data files, latest last
    unreadable: str = ""  # why its files are not the table's rows (delete files, ...)
    root: str = ""  # the table's location when a catalog named it (TableUri.root otherwise)
    history: Callable[[], list[tuple[str, str]]] | None = None  # `removals`, asked only
    # when a refusal names them (a Delta log's history is read commit by commit)


def parse(pattern: str, fmt: str, pin: str) -> TableUri:
    """`<fmt>+s3://bucket/path[?<pin>=N]` or `<fmt>+file:///path[?<pin>=N]` -> TableUri;
    an Iceberg SQL catalog in SQLite: `iceberg+sqlite:///path/catalog.db?table=db.t`."""
    scheme, _, rest = pattern.partition("://")
    storage = scheme.lower().removeprefix(fmt + "+")
    rest, _, query = rest.partition("?")
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    if storage == "sqlite":
        return _in_catalog(pattern, fmt, pin, rest, params)
    unknown = sorted(set(params) - {pin})
    if unknown or (pin in params and not re.fullmatch(r"\d+", params[pin])):
        raise UsageError(f"{pattern}: a {fmt} table takes only ?{pin}=N (a number) after "
                         "its location")
    rest = rest.rstrip("/")
    if storage == "s3":
        bucket, key = parse_uri(f"s3://{rest}")
        root = f"s3://{bucket}/{key}".rstrip("/")
    elif storage == "file":
        root = os.path.realpath(unquote(rest) or "/")
    else:
        raise UsageError(f"{pattern}: write a {fmt} table as {fmt}+s3://bucket/path or "
                         f"{fmt}+file:///path")
    return TableUri(pattern, fmt, storage, root, params.get(pin, ""))


def _in_catalog(pattern: str, fmt: str, pin: str, path: str,
                params: dict[str, str]) -> TableUri:
    unknown = sorted(set(params) - {pin, "table", "catalog"})
    if fmt != "iceberg" or unknown or "." not in params.get("table", "") or (
            pin in params and not re.fullmatch(r"\d+", params[pin])):
        raise UsageError(f"{pattern}: name a table of an Iceberg SQL catalog as "
                         "iceberg+sqlite:///path/catalog.db?table=namespace.table "
                         f"[&catalog=name][&{pin}=N]")
    return TableUri(pattern, fmt, "sqlite", os.path.realpath(unquote(path)),
                    params.get(pin, ""), params["table"], params.get("catalog", ""))


def local_path(location: str) -> str:
    """A data file's path as the metadata writes it (`file:///x`, `file:/x`, `/x`),
    made absolute and real, as local files are recorded (files/local.py)."""
    path = re.sub(r"^file:(//)?", "", location)
    return os.path.realpath(unquote(path))


def s3_uri(location: str) -> str:
    """`s3a://` and `s3n://` (Hadoop's spellings) as `s3://`."""
    return re.sub(r"^s3[an]?://", "s3://", location)


def check_appends(table: TableUri, snap: Snapshot, committed: Mapping[str, str]) -> None:
    """Refuse, in one line, a snapshot that is not the loaded files plus appended ones:
    some data file loaded into the run's table is no longer in it (the table was
    overwritten, deleted from or compacted since), or its files are not its rows."""
    if snap.unreadable:
        raise SourceError(f"{table.pattern}: {snap.unreadable}; nothing was loaded")
    live = {f.uri for f in snap.files}
    under = (snap.root or table.root) + "/"
    gone = sum(1 for uri in committed if uri.startswith(under) and uri not in live)
    if not gone:
        return
    removals = snap.removals or (snap.history() if snap.history else [])
    if not removals:
        what = "its history rewrote data"
    elif removals[-1][0] == snap.id:
        what = f"its operation: {removals[-1][1]}"
    else:
        what = f"{_named(table)} {removals[-1][0]}'s operation: {removals[-1][1]}"
    raise SourceError(
        f"{table.pattern}: {gone:,} data file(s) loaded earlier into this table are no "
        f"longer in {_named(table)} {snap.id} ({what}); a load appends only new data "
        f"files, so nothing was loaded: run it with --mode replace-table (not with "
        f"--follow) to make the table this {_named(table)}")


def _named(table: TableUri) -> str:
    return "snapshot" if table.format == "iceberg" else "version"


def units(table: TableUri, snap: Snapshot, s3: aws.S3Settings | None,
          ) -> Iterator[SourceFile]:
    """The snapshot's data files as the file sources describe them (kind s3 or local),
    so the engine reads them as it reads any Parquet file."""
    for f in snap.files:
        fmt = FileFormat(DATA_FORMATS.get(f.format.lower(), "Parquet"), "none")
        etag = f"{table.format}:{f.size}"  # data files are written once: path and size
        if f.uri.startswith("s3://"):
            if s3 is None:
                raise UsageError(f"{table.pattern}: reading S3 needs its settings")
            bucket, key = parse_uri(f.uri)
            yield SourceFile(uri=f.uri, size=f.size, mtime_ns=0, format=fmt, etag=etag,
                             kind="s3", location=s3.object_url(bucket, key),
                             anonymous=s3.anonymous, constants=f.constants)
        elif f.uri.startswith("/"):
            yield SourceFile(uri=f.uri, size=f.size, mtime_ns=0, format=fmt, etag=etag,
                             kind="local", local_path=f.uri, constants=f.constants)
        else:
            raise SourceError(f"{table.pattern}: data file {f.uri} is neither on S3 nor on "
                              "this machine; chload reads tables on s3:// and file:// only")


class TableSource(RemoteSource):
    """A table format's source: lists the data files of a snapshot (its `read`), refuses
    a snapshot that is not appends over what was loaded (but under --mode replace-table,
    which loads it whole into a new table), and leaves the reading to the file sources
    (its units are files of kind s3 or local)."""

    format = ""
    pin = ""  # the URI parameter naming a snapshot: snapshot (Iceberg), version (Delta)
    options: tuple[str, ...] = ("follow", "poll")

    def __init__(self) -> None:
        self._notes: dict[str, str] = {}  # pattern -> its latest snapshot (polls update it)

    def open(self) -> Source:
        return type(self)()  # (this run's notes)

    def read(self, table: TableUri, context: SourceContext) -> Snapshot:
        raise NotImplementedError

    def list(self, pattern: str, context: SourceContext) -> Iterator[SourceFile]:
        table = parse(pattern, self.format, self.pin)
        snap = self.read(table, context)
        # (replace-partitions lists with force, and would keep rows of files gone)
        appends = context.mode == "replace-partitions" or (
            context.mode == "append" and not context.force)
        if appends and context.committed is not None:
            check_appends(table, snap, context.committed())
        elif snap.unreadable:
            check_appends(table, snap, {})
        if not snap.files:
            raise NothingMatched(f"{pattern}: {_named(table)} {snap.id or '(none)'} of the "
                                 "table holds no data file")
        self._notes[pattern] = (f"{self.display(pattern)}: {_named(table)} {snap.id}, "
                                f"{len(snap.files):,} data file(s)")
        return units(table, snap, context.s3)

    def notes(self) -> builtins.list[str]:
        return builtins.list(self._notes.values())

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        raise NotImplementedError(f"{file.uri}: read by the file source of its kind")

    def described(self, files: Sequence[SourceFile],
                  context: SourceContext) -> builtins.list[SourceFile]:
        return builtins.list(files)


def needs_library(table: TableUri, module: str, extra: str) -> UsageError:
    return UsageError(f"{table.pattern}: reading {table.format} tables needs the Python "
                      f"package {module}: pip install 'chload[{extra}]'")


def unreachable(table: TableUri, exc: BaseException) -> SourceError:
    """A library's failure to read the table's metadata, as one line (no secret: the
    libraries' messages name paths and endpoints, never keys)."""
    reason = " ".join(str(exc).split())[:300] or type(exc).__name__
    return SourceError(f"{table.pattern}: cannot read the table's metadata ({reason}); "
                       "check the location, and for S3 the endpoint and credentials")
