"""Apache Iceberg tables: `iceberg+s3://bucket/warehouse/db/table` or
`iceberg+file:///path/table` (the table's location, the folder holding `metadata/`),
optionally `?snapshot=<id>`.

The metadata is read with pyiceberg (the `iceberg` extra), imported only here: the
table's latest `metadata/*.metadata.json` (by its version number, as the engine's
iceberg() finds it; `version-hint.text` is not needed), then the snapshot's manifests
for its data files. A catalog is not needed to read a table whose location is known;
the files are read by the engine (table.py).
"""

from __future__ import annotations

import os
import re
from typing import Any

from chload.errors import NothingMatched, SourceError
from chload.sources.base import SourceContext
from chload.sources.files import aws
from chload.sources.files.s3 import Lister, parse_uri
from chload.sources.lake.table import (
    DataFile,
    Snapshot,
    TableSource,
    TableUri,
    local_path,
    needs_library,
    s3_uri,
    unreachable,
)

_VERSION = re.compile(r"^v?(\d+)[-.].*\.metadata\.json$")


def latest_metadata(table: TableUri, s3: aws.S3Settings | None) -> str:
    """The location of the table's newest metadata file (the highest version number)."""
    if table.storage == "s3":
        if s3 is None:
            raise SourceError(f"{table.pattern}: reading S3 needs its settings")
        bucket, key = parse_uri(table.root)
        names = [o.key.rsplit("/", 1)[-1] for o in Lister(s3).list(bucket, key + "/metadata/")]
    else:
        try:
            names = os.listdir(os.path.join(table.root, "metadata"))
        except OSError as exc:
            raise NothingMatched(f"{table.pattern}: no Iceberg table there ({exc.strerror} "
                                 "reading its metadata/ folder)") from exc
    versions = [(int(m[1]), name) for name in names if (m := _VERSION.match(name))]
    if not versions:
        raise NothingMatched(f"{table.pattern}: no Iceberg table there (no "
                             "metadata/*.metadata.json); name the table's location")
    return f"{table.root}/metadata/{max(versions)[1]}"


def io_properties(s3: aws.S3Settings | None) -> dict[str, str]:
    """pyiceberg's FileIO settings for the run's S3 settings (never shown)."""
    if s3 is None:
        return {}
    props = {"s3.region": s3.region}
    if s3.custom_endpoint:
        props["s3.endpoint"] = s3.endpoint
    if s3.credentials is not None:
        props["s3.access-key-id"] = s3.credentials.access_key
        props["s3.secret-access-key"] = s3.credentials.secret_key
        if s3.credentials.token:
            props["s3.session-token"] = s3.credentials.token
    else:
        props["s3.anonymous"] = "true"
    return props


def read(table: TableUri, context: SourceContext) -> Snapshot:
    """The data files of the pinned (or current) snapshot, and the snapshots before it
    that removed or rewrote data."""
    try:
        from pyiceberg.table import StaticTable
    except ImportError as exc:
        raise needs_library(table, "pyiceberg", "iceberg") from exc
    where = latest_metadata(table, context.s3)
    try:
        tbl = StaticTable.from_metadata(where, properties=io_properties(context.s3))
        return _snapshot(table, tbl)
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001  # pyiceberg's and pyarrow's, at this one boundary
        raise unreachable(table, exc) from exc


def _snapshot(table: TableUri, tbl: Any) -> Snapshot:
    meta = tbl.metadata
    snap = meta.snapshot_by_id(int(table.pinned)) if table.pinned else tbl.current_snapshot()
    if snap is None:
        if table.pinned:
            raise SourceError(f"{table.pattern}: the table has no snapshot {table.pinned}; "
                              "its snapshots: " + ", ".join(
                                  str(s.snapshot_id) for s in meta.snapshots[-5:]))
        return Snapshot(id="")
    out = Snapshot(id=str(snap.snapshot_id), removals=_removals(meta, snap),
                   unreadable=_renamed(meta))
    for task in tbl.scan(snapshot_id=snap.snapshot_id).plan_files():
        if task.delete_files and not out.unreadable:
            out.unreadable = (f"snapshot {snap.snapshot_id} has delete files (rows deleted "
                              "by merge-on-read), which plain data files do not show; "
                              "compact the table (rewrite its data files) and load again")
        path = task.file.file_path
        uri = s3_uri(path) if re.match(r"^s3[an]?://", path) else local_path(path)
        fmt = str(getattr(task.file.file_format, "value", task.file.file_format))
        out.files.append(DataFile(uri, int(task.file.file_size_in_bytes), fmt.lower()))
    return out


def _removals(meta: Any, snap: Any) -> list[tuple[str, str]]:
    """The snapshots from the first to `snap` (its ancestors) whose operation was not an
    append, oldest first."""
    by_id = {s.snapshot_id: s for s in meta.snapshots}
    chain, at = [], snap
    while at is not None:
        chain.append(at)
        at = by_id.get(at.parent_snapshot_id) if at.parent_snapshot_id is not None else None
    out = []
    for s in reversed(chain):
        op = getattr(s.summary, "operation", None) if s.summary is not None else None
        name = str(getattr(op, "value", op) or "")
        if name and name != "append":
            out.append((str(s.snapshot_id), name))
    return out


def _renamed(meta: Any) -> str:
    """Why the files' columns are not the table's: a column renamed in the schema's
    history (its older files name it otherwise; the engine reads columns by name)."""
    names: dict[int, set[str]] = {}
    for schema in meta.schemas:
        for fld in schema.fields:
            names.setdefault(fld.field_id, set()).add(fld.name)
    renamed = sorted("/".join(sorted(n)) for n in names.values() if len(n) > 1)
    if not renamed:
        return ""
    return (f"the table renamed column(s) {', '.join(renamed)}, so its older data files "
            "name them otherwise; chload reads files' columns by name and cannot load it")


class IcebergSource(TableSource):
    """iceberg+s3:// and iceberg+file://: an Iceberg table's data files (table.py)."""

    kind = "iceberg"
    format = "iceberg"
    pin = "snapshot"
    schemes: tuple[str, ...] = ("iceberg+s3", "iceberg+file")

    def read(self, table: TableUri, context: SourceContext) -> Snapshot:
        return read(table, context)


SOURCE = IcebergSource()
