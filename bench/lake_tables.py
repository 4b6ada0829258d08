"""Iceberg and Delta Lake tables written by the libraries people use (pyiceberg with a SQL
catalog in SQLite; deltalake, i.e. delta-rs), on local disk or on S3 (MinIO), for the
tests of the table sources and for bench/lakehouse.py.

`LakeTables(root)` keeps one Iceberg table and one Delta table of the same rows side by
side; each change (append, overwrite, delete, a new column) is made to both. Row `i`
is `(id=i, amount=i/100 as Decimal(18,2), at=2026-01-01 + i seconds, name='n<i%1000>')`,
so a table of ids [lo, hi) has known count and sums.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

EPOCH = dt.datetime(2026, 1, 1)


def rows(lo: int, hi: int, extra: bool = False) -> pa.Table:
    """Rows lo..hi-1 (see the module docstring); with `extra`, a column `score` more."""
    ids = pa.array(range(lo, hi), pa.int64())
    cols: dict[str, Any] = {
        "id": ids,
        "amount": pc.multiply(ids.cast(pa.decimal128(19, 0)),
                              pa.scalar(decimal.Decimal("0.01"), pa.decimal128(3, 2)))
        .cast(pa.decimal128(18, 2)),
        "at": pc.add(pa.scalar(EPOCH, pa.timestamp("us")),
                     pc.multiply(ids, 1_000_000).cast(pa.duration("us"))),
        "name": pc.binary_join_element_wise("n", pc.cast(pc.bit_wise_and(ids, 1023),
                                                         pa.string()), ""),
    }
    if extra:
        cols["score"] = pc.multiply(ids.cast(pa.float64()), 0.5)
    return pa.table(cols)


@dataclass
class S3Access:
    """Where the tables' S3 is and its keys (MinIO in tests and the bench)."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def iceberg(self) -> dict[str, str]:
        return {"s3.endpoint": self.endpoint, "s3.access-key-id": self.access_key,
                "s3.secret-access-key": self.secret_key, "s3.region": self.region}

    def delta(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}


@dataclass
class LakeTables:
    """An Iceberg table `db.<name>` (SQL catalog in SQLite under `catalog_dir`, warehouse
    at `root`) and a Delta table at `root/delta/<name>`: `root` is a local directory or
    `s3://bucket/prefix` (then `s3` says how to reach it)."""

    root: str
    name: str = "events"
    s3: S3Access | None = None
    formats: tuple[str, ...] = ("iceberg", "delta")  # the tables kept (both by default)
    catalog_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="lake-catalog-"))
    _iceberg: Any = None

    def __post_init__(self) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        warehouse = self.root if self.root.startswith("s3://") else f"file://{self.root}"
        if not self.root.startswith("s3://"):
            os.makedirs(self.root, exist_ok=True)
        props = {"uri": f"sqlite:///{self.catalog_dir}/catalog.db", "warehouse": warehouse}
        self.catalog = SqlCatalog("lake", **props, **(self.s3.iceberg() if self.s3 else {}))
        self.catalog.create_namespace_if_not_exists("db")

    @property
    def iceberg_location(self) -> str:
        return f"{self.root.rstrip('/')}/db/{self.name}"

    @property
    def delta_location(self) -> str:
        return f"{self.root.rstrip('/')}/delta/{self.name}"

    def uri(self, fmt: str) -> str:
        """The table as chload names it: iceberg+s3://..., delta+file:///..."""
        where = self.iceberg_location if fmt == "iceberg" else self.delta_location
        return f"{fmt}+{where}" if where.startswith("s3://") else f"{fmt}+file://{where}"

    def _table(self) -> Any:
        if self._iceberg is None:
            self._iceberg = self.catalog.create_table(f"db.{self.name}",
                                                      schema=rows(0, 1).schema)
        return self._iceberg

    def _delta(self, data: pa.Table, mode: str, **kw: Any) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.delta_location, data, mode=mode,  # type: ignore[arg-type]
                        storage_options=self.s3.delta() if self.s3 else None, **kw)

    def append(self, lo: int, hi: int, extra: bool = False) -> None:
        """Append rows lo..hi-1 to both tables (one snapshot, one version)."""
        data = rows(lo, hi, extra)
        if "iceberg" in self.formats:
            table = self._table()
            if extra and "score" not in table.schema().column_names:
                with table.update_schema() as update:
                    update.union_by_name(data.schema)
            table.append(data)
        if "delta" in self.formats:
            self._delta(data, "append", **({"schema_mode": "merge"} if extra else {}))

    def overwrite(self, lo: int, hi: int) -> None:
        """Both tables become rows lo..hi-1."""
        if "iceberg" in self.formats:
            self._table().overwrite(rows(lo, hi))
        if "delta" in self.formats:
            self._delta(rows(lo, hi), "overwrite", schema_mode="overwrite")

    def delete_below(self, bound: int) -> None:
        """Delete rows with id < bound from both (copy-on-write: files rewritten)."""
        from deltalake import DeltaTable

        if "iceberg" in self.formats:
            self._table().delete(f"id < {bound}")
        if "delta" in self.formats:
            DeltaTable(self.delta_location, storage_options=self.s3.delta() if self.s3 else None,
                       ).delete(f"id < {bound}")
