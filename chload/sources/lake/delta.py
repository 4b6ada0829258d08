"""Delta Lake tables: `delta+s3://bucket/path/table` or `delta+file:///path/table` (the
folder holding `_delta_log/`), optionally `?version=<n>`.

The log is read with deltalake (delta-rs, the `delta` extra), imported only here: the
add actions of the version are its data files; its history names the versions that
removed or rewrote data. The files are read by the engine (table.py). A partitioned
table keeps its partition values out of the data files: each add action carries its
file's, which come with the file as typed constants (`CAST('EU' AS Nullable(String))`),
typed as the table's schema types the column and added by every read of the file; the
values come from the log, never from the path (the protocol lets a writer name files as
it likes). Deletion vectors hide rows the files still hold: refused until chload reads
them.
"""

from __future__ import annotations

import datetime
import decimal
import os
import re
from typing import Any
from urllib.parse import unquote

from chload.errors import NothingMatched, SourceError
from chload.schema import quote_str
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
    constants = _constants(dt, actions) if not out.unreadable else None
    for i, (path, size) in enumerate(zip(actions.column("path").to_pylist(),
                                         actions.column("size_bytes").to_pylist(),
                                         strict=True)):
        out.files.append(DataFile(_located(table, path), int(size),
                                  constants=constants[i] if constants else ()))
    return out


# Delta's primitive types as chDB reads them from Parquet (so a partition column has the
# type the same column would have in the files)
TYPES = {"string": "String", "binary": "String", "long": "Int64", "integer": "Int32",
         "short": "Int16", "byte": "Int8", "float": "Float32", "double": "Float64",
         "boolean": "Bool", "date": "Date32", "timestamp": "DateTime64(6, 'UTC')",
         "timestamp_ntz": "DateTime64(6, 'UTC')"}  # (its wall clock, as UTC)


def _type(delta_type: str) -> str:
    """A Delta primitive type's ClickHouse type; '' for one a partition cannot have."""
    scaled = re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", delta_type)
    return f"Decimal({scaled[1]}, {scaled[2]})" if scaled else TYPES.get(delta_type, "")


def _constants(dt: Any, actions: Any) -> list[tuple[tuple[str, str, str], ...]] | None:
    """Each add action's partition values as (column, type, SQL of the value); None for
    a table not partitioned. delta-rs parses the log's strings by the schema's types."""
    columns = dt.metadata().partition_columns
    if not columns:
        return None
    fields = {f.name: f for f in dt.schema().fields}
    typed = []
    for name in columns:
        ch_type = _type(str(getattr(fields[name].type, "type", "")))
        typed.append((name, f"Nullable({ch_type})" if fields[name].nullable else ch_type,
                      actions.column(f"partition.{name}").to_pylist()))
    return [tuple((name, ch_type, _literal(values[i]))
                  for name, ch_type, values in typed) for i in range(actions.num_rows)]


def _literal(value: Any) -> str:
    """A partition value (as delta-rs parsed it) as SQL the engine casts to its type."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"unhex({quote_str(value.hex())})"
    if isinstance(value, bool):
        return quote_str("true" if value else "false")
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return quote_str(value.strftime("%Y-%m-%d %H:%M:%S.%f"))
    if isinstance(value, decimal.Decimal):
        return quote_str(format(value, "f"))
    return quote_str(value.isoformat() if isinstance(value, datetime.date) else str(value))


def _located(table: TableUri, path: str) -> str:
    """An add action's path (relative to the table, URI-encoded; or a full URI) as a
    data file's location."""
    if "://" in path:
        return s3_uri(path) if path.startswith("s3") else local_path(path)
    relative = unquote(path)  # (once: a partition's folder may hold a `%`, `ts=...%3A00`)
    return f"{table.root}/{relative}" if table.storage == "s3" else os.path.realpath(
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
    fields = {f.name: str(getattr(f.type, "type", "")) for f in dt.schema().fields}
    odd = [f"{c} ({fields.get(c) or 'not a primitive type'})"
           for c in meta.partition_columns if not _type(fields.get(c, ""))]
    if odd:
        return (f"the table is partitioned by {', '.join(odd)}, a type chload gives no "
                "column (docs/table-formats.md lists those it does); rewrite the table "
                "partitioned by other columns")
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
