"""chload on Iceberg and Delta Lake tables vs the hand-written chDB INSERT over the engine's
own table functions, into the embedded engine, same run.

The tables (bench/lake_tables.py: written by pyiceberg and delta-rs, the same rows in
both) hold --rows rows over --appends appends, on local disk (`--where file`) or in a
local MinIO (`--where s3`, started here and stopped by PID). For each format, one whole
process of

    chload load iceberg+file:///.../db/events --table t --target <fresh dir>

against one of

    INSERT INTO t SELECT * FROM icebergLocal('...')      -- or deltaLakeLocal,
                                                          -- icebergS3 / deltaLake on S3

in chDB into a MergeTree table created from the same data, alternated, --repeats times;
median seconds and the ratio (chload / hand query) printed, --json writes them.

    python3 bench/lakehouse.py [--rows 5000000] [--appends 3] [--where file|s3]
                               [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "services"))
import services  # noqa: E402
from common import interleave, print_ratios, time_process  # noqa: E402
from lake_tables import LakeTables, S3Access  # noqa: E402

BASELINE = r"""
import os, sys, chdb.session
os.chdir("/")  # the engine's local table functions read only below the working directory
s = chdb.session.Session(sys.argv[1])
source = sys.argv[2]
s.query(f"CREATE TABLE t ENGINE = MergeTree ORDER BY tuple() EMPTY AS SELECT * FROM {source}")
s.query(f"INSERT INTO t SELECT * FROM {source}")
s.close()
"""


def table_function(tables: LakeTables, fmt: str, s3: S3Access | None) -> str:
    """The engine's own reader of the table, as a user writes it by hand."""
    if s3 is None:
        where = tables.iceberg_location if fmt == "iceberg" else tables.delta_location
        return f"{'icebergLocal' if fmt == 'iceberg' else 'deltaLakeLocal'}('{where}')"
    where = tables.iceberg_location if fmt == "iceberg" else tables.delta_location
    url = f"{s3.endpoint}/{where.removeprefix('s3://')}/"
    name = "icebergS3" if fmt == "iceberg" else "deltaLake"
    return f"{name}('{url}', '{s3.access_key}', '{s3.secret_key}')"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--appends", type=int, default=3)
    parser.add_argument("--where", choices=["file", "s3"], default="file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="chload-lakehouse-")
    minio = None
    try:
        s3, env = None, {}
        if args.where == "s3":
            minio = services.start_minio(Path(work))
            services.minio_create_bucket(minio, "lake")
            s3 = S3Access(minio.url, minio.credentials["access_key"],
                          minio.credentials["secret_key"])
            env = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": s3.access_key,
                   "AWS_SECRET_ACCESS_KEY": s3.secret_key, "AWS_PROFILE": ""}
            tables = LakeTables(f"s3://lake/{uuid.uuid4().hex[:8]}", s3=s3)
        else:
            tables = LakeTables(os.path.join(work, "lake"))
        per = args.rows // args.appends
        for i in range(args.appends):
            tables.append(i * per, (i + 1) * per)
        results = [measure(tables, fmt, s3, env, work, args) for fmt in ("iceberg", "delta")]
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        if minio is not None:
            minio.stop()
        shutil.rmtree(work, ignore_errors=True)


def measure(tables: LakeTables, fmt: str, s3: S3Access | None, env: dict[str, str],
            work: str, args: argparse.Namespace) -> dict:
    target = os.path.join(work, f"target-{fmt}")

    def fresh() -> None:
        shutil.rmtree(target, ignore_errors=True)

    chload = [sys.executable, "-m", "chload", "load", tables.uri(fmt), "--table", "t",
              "--target", target]
    hand = [sys.executable, "-c", BASELINE, target, table_function(tables, fmt, s3)]
    methods = {
        f"chload load {fmt}+{args.where}://": lambda: time_process(chload, env, before=fresh),
        f"chDB INSERT ... FROM {fmt} table function": lambda: time_process(
            hand, env, before=fresh),
    }
    timings = interleave(methods, args.repeats)
    title = f"embedded, {fmt} table on {args.where}: {args.rows:,} rows in {args.appends} appends"
    return print_ratios(title, timings, f"chDB INSERT ... FROM {fmt} table function")


if __name__ == "__main__":
    main()
