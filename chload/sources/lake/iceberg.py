"""Apache Iceberg tables: `iceberg+s3://bucket/warehouse/db/table` or
`iceberg+file:///path/table` (the table's location, the folder holding `metadata/`),
optionally `?snapshot=<id>`.

The metadata is read here, as the Iceberg spec writes it: the table's latest
`metadata/*.metadata.json` (by its version number, as the engine's iceberg() finds it;
`version-hint.text` is not needed) or the one a SQL catalog in SQLite names
(`iceberg+sqlite:///path/catalog.db?table=db.events`), then the snapshot's manifest
list and its manifests (Avro: avro.py) for its live data files. No catalog is needed
to read a table whose location is known, and no library (pyiceberg's import alone costs
more than listing a table). The files are read by the engine (table.py).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

from chload.errors import NothingMatched, SourceError, TransientError
from chload.sources.base import SourceContext
from chload.sources.files import aws
from chload.sources.files.s3 import Lister, parse_uri
from chload.sources.lake import avro
from chload.sources.lake.table import DataFile, Snapshot, TableSource, TableUri, local_path, s3_uri

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


def from_catalog(table: TableUri) -> str:
    """The metadata location an Iceberg SQL catalog (in SQLite, the `iceberg_tables` table
    of pyiceberg's and Iceberg's JdbcCatalog) holds for the table."""
    namespace, _, name = table.name.rpartition(".")
    sql = ("SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? "
           "AND table_name = ?" + (" AND catalog_name = ?" if table.catalog else ""))
    args = [namespace, name] + ([table.catalog] if table.catalog else [])
    try:
        with contextlib.closing(sqlite3.connect(f"file:{table.root}?mode=ro", uri=True)) as db:
            found = db.execute(sql, args).fetchall()
    except sqlite3.Error as exc:
        raise SourceError(f"{table.pattern}: cannot read the catalog {table.root} ({exc})"
                          ) from exc
    if len(found) != 1 or not found[0][0]:
        what = "no such table" if not found else "several catalogs hold it: add &catalog="
        raise SourceError(f"{table.pattern}: {what} in the catalog {table.root}")
    return str(found[0][0])


def fetch(location: str, table: TableUri, objects: _Objects | None) -> bytes:
    """The whole bytes of one metadata file (JSON, a manifest list, a manifest)."""
    if re.match(r"^s3[an]?://", location):
        if objects is None:
            raise SourceError(f"{table.pattern}: reading S3 needs its settings")
        bucket, key = parse_uri(s3_uri(location))
        return objects.get(bucket, key, table)
    path = local_path(location)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise SourceError(f"{table.pattern}: cannot read {path} ({exc.strerror}), a file "
                          "of the table's metadata") from exc


class _Objects(Lister):
    """GET of whole metadata objects over the listing's signed keep-alive connection."""

    def get(self, bucket: str, key: str, table: TableUri) -> bytes:
        url = f"{self.config.bucket_url(bucket)}/{quote(key, safe='/~-._')}"
        try:
            status, _, body = self._request(url)
        except (OSError, http.client.HTTPException) as exc:
            self._close()
            raise TransientError(f"{table.pattern}: cannot reach {self.config.endpoint} "
                                 f"({type(exc).__name__}) reading the table's metadata") from None
        if status != 200:
            raise SourceError(f"{table.pattern}: s3://{bucket}/{key}, a file of the table's "
                              f"metadata, answered HTTP {status}; check the credentials")
        return body


def read(table: TableUri, context: SourceContext) -> Snapshot:
    """The data files of the pinned (or current) snapshot, and the snapshots before it
    that removed or rewrote data."""
    where = from_catalog(table) if table.storage == "sqlite" else latest_metadata(
        table, context.s3)
    objects = _Objects(context.s3) if context.s3 is not None else None
    try:
        meta = json.loads(fetch(where, table, objects))
        snap = _snapshot(table, meta, lambda loc: avro.records(fetch(loc, table, objects)))
        if table.storage == "sqlite":
            location = str(meta["location"]).rstrip("/")
            snap.root = s3_uri(location) if location.startswith("s3") else local_path(location)
        return snap
    except (avro.AvroError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{table.pattern}: cannot read the table's metadata ({exc}); is it "
                          "an Iceberg table?") from exc
    finally:
        if objects is not None:
            objects._close()


Records = Callable[[str], Iterator[dict[str, Any]]]


def _snapshot(table: TableUri, meta: dict[str, Any], records: Records) -> Snapshot:
    by_id = {s["snapshot-id"]: s for s in meta.get("snapshots") or []}
    wanted = int(table.pinned) if table.pinned else meta.get("current-snapshot-id")
    snap = by_id.get(wanted) if wanted is not None else None
    if snap is None:
        if table.pinned:
            raise SourceError(f"{table.pattern}: the table has no snapshot {table.pinned}; "
                              "its latest: " + ", ".join(str(i) for i in list(by_id)[-5:]))
        return Snapshot(id="")
    if "manifest-list" not in snap:
        raise SourceError(f"{table.pattern}: snapshot {wanted} lists its manifests inline "
                          "(an early format-version 1 table), which chload does not read")
    out = Snapshot(id=str(wanted), removals=_removals(by_id, snap), unreadable=_renamed(meta))
    for manifest in records(snap["manifest-list"]):
        for entry in records(manifest["manifest_path"]):
            if entry["status"] == 2:  # DELETED from the table by this snapshot
                continue
            data = entry["data_file"]
            if data.get("content", 0) != 0 or manifest.get("content", 0) != 0:
                out.unreadable = out.unreadable or (
                    f"snapshot {wanted} has delete files (rows deleted by merge-on-read), "
                    "which plain data files do not show; compact the table (rewrite its "
                    "data files) and load again")
                continue
            path = data["file_path"]
            uri = s3_uri(path) if re.match(r"^s3[an]?://", path) else local_path(path)
            out.files.append(DataFile(uri, int(data["file_size_in_bytes"]),
                                      str(data.get("file_format", "parquet")).lower()))
    return out


def _removals(by_id: dict[int, dict[str, Any]], snap: dict[str, Any]) -> list[tuple[str, str]]:
    """The snapshots from the first to `snap` (its ancestors) whose operation was not an
    append, oldest first."""
    chain: list[dict[str, Any]] = []
    at: dict[str, Any] | None = snap
    while at is not None and len(chain) <= len(by_id):
        chain.append(at)
        parent = at.get("parent-snapshot-id")
        at = by_id.get(parent) if parent is not None else None
    out = []
    for s in reversed(chain):
        op = str((s.get("summary") or {}).get("operation", ""))
        if op and op != "append":
            out.append((str(s["snapshot-id"]), op))
    return out


def _renamed(meta: dict[str, Any]) -> str:
    """Why the files' columns are not the table's: a column renamed in the schema's
    history (its older files name it otherwise; the engine reads columns by name)."""
    names: dict[int, set[str]] = {}
    for schema in meta.get("schemas") or [meta.get("schema") or {}]:
        for fld in schema.get("fields") or []:
            names.setdefault(fld["id"], set()).add(fld["name"])
    renamed = sorted("/".join(sorted(n)) for n in names.values() if len(n) > 1)
    if not renamed:
        return ""
    return (f"the table renamed column(s) {', '.join(renamed)}, so its older data files "
            "name them otherwise; chload reads files' columns by name and cannot load it")


class IcebergSource(TableSource):
    """iceberg+s3://, iceberg+file://, iceberg+sqlite:// (a SQL catalog): an Iceberg
    table's data files (table.py)."""

    kind = "iceberg"
    format = "iceberg"
    pin = "snapshot"
    schemes: tuple[str, ...] = ("iceberg+s3", "iceberg+file", "iceberg+sqlite")

    def read(self, table: TableUri, context: SourceContext) -> Snapshot:
        return read(table, context)


SOURCE = IcebergSource()
