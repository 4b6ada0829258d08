"""Delta Lake tables: `delta+s3://bucket/path/table` or `delta+file:///path/table` (the
folder holding `_delta_log/`), optionally `?version=<n>`.

The log is read with deltalake (delta-rs, the `delta` extra), imported only here: the
add actions of the version are its data files; its history names the versions that
removed or rewrote data. The files are read by the engine (table.py). A partitioned
table keeps its partition values in the files' paths, not in the files, and deletion
vectors hide rows the files still hold: both are refused until chload reads them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from chload.errors import NothingMatched, SourceError
from chload.sources.base import SourceContext
from chload.sources.files import aws
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

APPENDS = {"CREATE TABLE", "STREAMING UPDATE"}  # with WRITE in mode Append: adds files only


def storage_options(s3: aws.S3Settings | None) -> dict[str, str]:
    """delta-rs's object_store settings for the run's S3 settings (never shown)."""
    if s3 is None:
        return {}
    opts = {"AWS_REGION": s3.region}
    if s3.custom_endpoint:
        opts["AWS_ENDPOINT_URL"] = s3.endpoint
        opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
        if s3.endpoint.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    if s3.credentials is not None:
        opts["AWS_ACCESS_KEY_ID"] = s3.credentials.access_key
        opts["AWS_SECRET_ACCESS_KEY"] = s3.credentials.secret_key
        if s3.credentials.token:
            opts["AWS_SESSION_TOKEN"] = s3.credentials.token
    else:
        opts["AWS_SKIP_SIGNATURE"] = "true"
    if s3.ca_bundle:
        opts["AWS_CA_BUNDLE"] = s3.ca_bundle
    return opts


def read(table: TableUri, context: SourceContext) -> Snapshot:
    """The data files of the pinned (or latest) version, and the versions up to it that
    removed or rewrote data."""
    try:
        import deltalake
    except ImportError as exc:
        raise needs_library(table, "deltalake", "delta") from exc
    version = int(table.pinned) if table.pinned else None
    try:
        dt = deltalake.DeltaTable(table.root, version=version,
                                  storage_options=storage_options(context.s3))
    except deltalake.exceptions.TableNotFoundError as exc:
        raise NothingMatched(f"{table.pattern}: no Delta table there (no _delta_log/); "
                             "name the table's folder") from exc
    except Exception as exc:  # noqa: BLE001  # delta-rs's, at this one boundary
        raise unreachable(table, exc) from exc
    try:
        return _snapshot(table, dt)
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise unreachable(table, exc) from exc


def _snapshot(table: TableUri, dt: Any) -> Snapshot:
    out = Snapshot(id=str(dt.version()), unreadable=_unreadable(dt),
                   history=lambda: _removals(dt))
    actions = dt.get_add_actions(flatten=True)  # arro3's table: no pyarrow import needed
    for path, size in zip(actions.column("path").to_pylist(),
                          actions.column("size_bytes").to_pylist(), strict=True):
        out.files.append(DataFile(_located(table, path), int(size)))
    return out


def _located(table: TableUri, path: str) -> str:
    """An add action's path (relative to the table, URI-encoded; or a full URI) as a
    data file's location."""
    if "://" in path:
        return s3_uri(path) if path.startswith("s3") else local_path(path)
    relative = unquote(path)
    return f"{table.root}/{relative}" if table.storage == "s3" else local_path(
        f"{table.root}/{relative}")


def _removals(dt: Any) -> list[tuple[str, str]]:
    """The versions that removed or rewrote data, oldest first; none if the history
    cannot be read now (the refusal then says less, but still refuses)."""
    try:
        history = dt.history()
    except Exception:  # noqa: BLE001  # delta-rs's, asked only to word a refusal
        return []
    out = []
    for entry in reversed(history):  # the history comes latest first
        op = str(entry.get("operation", ""))
        mode = str((entry.get("operationParameters") or {}).get("mode", ""))
        if op in APPENDS or (op == "WRITE" and mode in ("Append", "ErrorIfExists", "")):
            continue
        named = f"{op.lower()} ({mode.lower()})" if op == "WRITE" else op.lower()
        out.append((str(entry.get("version", "")), named))
    return out


def _unreadable(dt: Any) -> str:
    meta, protocol = dt.metadata(), dt.protocol()
    if meta.partition_columns:
        return (f"the table is partitioned by {', '.join(meta.partition_columns)}, whose "
                "values Delta keeps out of the data files; chload does not load "
                "partitioned Delta tables yet")
    if "deletionVectors" in (protocol.reader_features or []):
        return ("the table may hide deleted rows in deletion vectors, which plain data "
                "files do not show; chload does not load such tables yet")
    mapping = (meta.configuration or {}).get("delta.columnMapping.mode", "none")
    if mapping != "none":
        return (f"the table maps columns by {mapping} (delta.columnMapping.mode), so its "
                "data files name columns otherwise; chload reads columns by name")
    return ""


class DeltaSource(TableSource):
    """delta+s3:// and delta+file://: a Delta table's data files (table.py)."""

    kind = "delta"
    format = "delta"
    pin = "version"
    schemes: tuple[str, ...] = ("delta+s3", "delta+file")

    def read(self, table: TableUri, context: SourceContext) -> Snapshot:
        return read(table, context)


SOURCE = DeltaSource()
