"""chload from S3 (a real MinIO) into the embedded engine vs the hand-written chDB s3() INSERT.

The bar: `chload load 's3://bench/trips/*.csv.gz'` on 10 gzip CSV objects (10M trips
rows), endpoint and keys only in the AWS environment variables, as a whole process,
takes at most 1.10x the time of a process that runs

    INSERT INTO trips SELECT * FROM s3('http://.../bench/trips/*.csv.gz', key, secret,
                                        CSVWithNames, '<schema>')

in chDB into an equivalent MergeTree table, measured in the same run. Then files/s for
many small objects (default 5,000 objects of 20 rows), as chload loads them today, next to
one s3() glob query over the same objects (which has no per-file exactly-once).

    python bench/s3_minio.py [--files 10] [--rows 1000000] [--repeats 3]
                             [--small 5000] [--small-rows 20] [--only big|small] [--json OUT]

Starts its own MinIO (scripts/services) on 127.0.0.1 and stops it by PID at the end.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "services"))
import services  # noqa: E402
from common import (  # noqa: E402
    CACHE,
    TRIPS_SCHEMA,
    CpuTimer,
    compile_chload,
    interleave,
    make_trips,
    print_ratios,
    time_process,
)

BASELINE = r"""
import sys, chdb.session
s = chdb.session.Session(sys.argv[1])
s.query("CREATE TABLE trips ({schema}) ENGINE = MergeTree ORDER BY id")
s.query("INSERT INTO trips SELECT * FROM s3('{url}', '{key}', '{secret}', CSVWithNames, "
        "'{schema}')")
s.close()
"""
BUCKET = "bench"


def upload(minio: services.Service, files: list[tuple[str, str]], workers: int = 8) -> None:
    """Put (local path, key) pairs into the bench bucket, a few at a time."""
    client = services.minio_client(minio)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda pair: client.upload_file(  # type: ignore[attr-defined]
            pair[0], BUCKET, pair[1]), files))


def small_objects(minio: services.Service, count: int, rows: int) -> None:
    """`count` distinct tiny gzip CSV objects under small/, trips rows, made in memory.

    (The benchmark's own data making; chload never touches a row in Python.)
    """
    client = services.minio_client(minio)

    def put(i: int) -> None:
        first = i * rows
        lines = ["id,miles,duration,vehicle_id"] + [
            f"{n},{n % 150 + 1},{(n % 150 + 1) * 6},{n % 256}" for n in range(first, first + rows)]
        body = gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1)
        client.put_object(Bucket=BUCKET, Key=f"small/trips_{i:05d}.csv.gz",  # type: ignore[attr-defined]
                          Body=body)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(count)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per object")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", type=int, default=5000, help="small objects (0: skip)")
    parser.add_argument("--small-rows", type=int, default=20)
    parser.add_argument("--only", choices=["big", "small"], help="run one part only")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.only == "big":
        args.small = 0

    data = make_trips(os.path.join(CACHE, f"trips-csvgz-{args.files}x{args.rows}"),
                      args.files, args.rows)
    compile_chload()
    work = tempfile.mkdtemp(prefix="chload-bench-s3-")
    minio = services.start_minio(Path(work))
    try:
        services.minio_create_bucket(minio, BUCKET)
        result = {}
        if args.only != "small":
            upload(minio, [(p, f"trips/{os.path.basename(p)}") for p in data])
            result = big_objects(args, minio, work)
        if args.small:
            result["small_objects"] = small_figures(args, minio, work)
    finally:
        minio.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


def aws_env(minio: services.Service) -> dict[str, str]:
    """Endpoint and keys only as the AWS environment variables."""
    return {"AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": minio.credentials["access_key"],
            "AWS_SECRET_ACCESS_KEY": minio.credentials["secret_key"]}


def big_objects(args: argparse.Namespace, minio: services.Service, work: str) -> dict:
    db = os.path.join(work, "db")
    fresh = lambda: shutil.rmtree(db, ignore_errors=True)  # noqa: E731
    url = f"{minio.url}/{BUCKET}/trips/*.csv.gz"
    baseline = [sys.executable, "-c", BASELINE.format(
        url=url, key=minio.credentials["access_key"], secret=minio.credentials["secret_key"],
        schema=TRIPS_SCHEMA), db]
    chload = [sys.executable, "-m", "chload", "load", f"s3://{BUCKET}/trips/*.csv.gz",
              "--table", "trips", "--target", db, "--quiet"]
    env = aws_env(minio)
    cpu = CpuTimer(before=fresh)

    base = "hand-written INSERT ... FROM s3(glob)"
    inferred = "chload load s3:// (inferred schema)"
    typed = "chload load s3:// --schema (same types)"
    methods = {
        base: lambda: cpu.timed(base, baseline),
        inferred: lambda: cpu.timed(inferred, chload, env),
        typed: lambda: cpu.timed(typed, chload + ["--schema", TRIPS_SCHEMA], env),
    }
    timings = interleave(methods, args.repeats)
    print(f"data: {args.files} gzip CSV objects x {args.rows:,} rows in MinIO "
          f"({minio.url}), target: embedded chDB")
    result = print_ratios("embedded target, S3 (MinIO) gzip CSV", timings, base)
    cpu.add_ratios(result, base, args.repeats)
    return result


def small_figures(args: argparse.Namespace, minio: services.Service, work: str) -> dict:
    started = time.perf_counter()
    small_objects(minio, args.small, args.small_rows)
    print(f"\n# {args.small:,} small objects of {args.small_rows} rows "
          f"(uploaded in {time.perf_counter() - started:.0f} s)")
    db = os.path.join(work, "db-small")
    shutil.rmtree(db, ignore_errors=True)
    chload = [sys.executable, "-m", "chload", "load", f"s3://{BUCKET}/small/*.csv.gz",
              "--table", "trips", "--target", db, "--quiet", "--schema", TRIPS_SCHEMA]
    seconds = time_process(chload, aws_env(minio))
    rerun = time_process(chload, aws_env(minio))  # all skipped: listing + ledger only
    shutil.rmtree(db, ignore_errors=True)
    baseline = [sys.executable, "-c", BASELINE.format(
        url=f"{minio.url}/{BUCKET}/small/*.csv.gz", key=minio.credentials["access_key"],
        secret=minio.credentials["secret_key"], schema=TRIPS_SCHEMA), db]
    glob_seconds = time_process(baseline)
    figures = {"objects": args.small, "rows_per_object": args.small_rows,
               "chload_seconds": seconds, "chload_files_per_second": args.small / seconds,
               "chload_rerun_seconds": rerun, "s3_glob_seconds": glob_seconds,
               "s3_glob_files_per_second": args.small / glob_seconds}
    print(f"chload load (exactly once per object)   {seconds:8.2f} s  "
          f"{args.small / seconds:8.1f} files/s")
    print(f"chload rerun (all skipped)              {rerun:8.2f} s")
    print(f"one INSERT ... FROM s3(glob) (no ledger) {glob_seconds:7.2f} s  "
          f"{args.small / glob_seconds:8.1f} files/s")
    return figures


if __name__ == "__main__":
    main()
