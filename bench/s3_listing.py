#!/usr/bin/env python3
"""Many objects in S3 (a real MinIO): what a rerun lists, with and without --after-last-key.

    python3 bench/s3_listing.py [--objects 100000] [--new 10] [--repeat 3] [--json OUT]

N tiny CSV objects `k/NNNNNNN.csv` are put once into a MinIO kept under
$CHLOAD_BENCH_CACHE/s3_listing/N (32 PUTs at a time), and loaded once into an embedded
target beside it: the first 1,000 by chload, the ledger events of the others written as a
load writes them (`loaded`, identity ETag:size, from one listing), since a rerun reads only
the ledger and the listing. Then, alternately and `--repeat` times, `--new` more objects
are put after the last key (keys grow in order) and loaded by a whole `chload load
s3://bench/k/` process:

- `full`: the whole prefix listed (the default): every page of 1,000 keys;
- `after`: with `--after-last-key`: listed from after the last key loaded.

Each: wall time, peak RSS (wait4), and the report's `listing_calls`; `after` as a ratio
to `full` of the same round. MinIO is started on 127.0.0.1 and stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "scripts" / "services"))
import services  # noqa: E402
from common import CACHE, compile_chload  # noqa: E402

BUCKET = "bench"
FIRST = 1000  # objects the first load takes through chload; the rest are seeded


def put(minio: services.Service, first: int, count: int) -> None:
    """Objects [first, first + count), each a header and one row, 32 PUTs at a time."""
    client = services.minio_client(minio)

    def one(i: int) -> None:
        client.put_object(Bucket=BUCKET, Key=f"k/{i:07d}.csv",  # type: ignore[attr-defined]
                          Body=f"id\n{i}\n".encode())
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, range(first, first + count)))


def seed(minio: services.Service, root: Path, target: Path, env: dict[str, str]) -> None:
    """The first load, short-cut: the first FIRST objects by chload, then a `loaded`
    event for each other object, inserted straight into `chload.files`."""
    run(root, target, env, f"s3://{BUCKET}/k/{{{0:07d}..{FIRST - 1:07d}}}.csv")
    client = services.minio_client(minio)
    rows = root / "seed.tsv"
    with rows.open("w") as out:
        pages = client.get_paginator("list_objects_v2").paginate(  # type: ignore[attr-defined]
            Bucket=BUCKET, Prefix="k/", StartAfter=f"k/{FIRST - 1:07d}.csv")
        for n, obj in enumerate(o for page in pages for o in page.get("Contents", [])):
            etag, size = obj["ETag"].strip('"'), obj["Size"]
            ns = int(obj["LastModified"].timestamp()) * 10**9
            out.write(f"s3://{BUCKET}/{obj['Key']}\t{etag}:{size}\t{size}\t{ns}\t{n}\n")
    sql = (f"INSERT INTO chload.files (target_table, uri, identity, size, mtime_ns, state, "
           f"rows, bytes, run_id, seq, table_uuid) SELECT 'default.t', uri, identity, size, "
           f"mtime, 'loaded', 1, size, 'seed', toUInt64({time.time_ns()}) + n, (SELECT "
           f"any(table_uuid) FROM chload.files WHERE target_table = 'default.t') FROM "
           f"file('{rows}', 'TSV', 'uri String, identity String, size UInt64, mtime UInt64, "
           f"n UInt64')")
    subprocess.run([sys.executable, "-c", "import chdb.session, sys; chdb.session.Session("
                    "sys.argv[1]).query(sys.argv[2])", str(target), sql], check=True)
    rows.unlink()


def run(root: Path, target: Path, env: dict[str, str], source: str = "",
        *flags: str) -> tuple[float, int, dict]:
    """One `chload load`: (wall seconds, peak RSS MiB, its JSON report)."""
    argv = [sys.executable, "-m", "chload", "load", source or f"s3://{BUCKET}/k/",
            "--table", "t", "--target", str(target), "--json", *flags]
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env={**os.environ, **env, "PYTHONPATH": str(HERE.parent)},
                                stdout=out, stderr=err, cwd=str(HERE.parent))
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        text, problem = out.read().decode(), err.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"chload failed: {problem[-2000:]}")
    return seconds, usage.ru_maxrss // 1024, json.loads(text.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=100_000)
    p.add_argument("--new", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    compile_chload(str(HERE.parent / "chload"))
    root = Path(CACHE) / "s3_listing" / str(args.objects)
    root.mkdir(parents=True, exist_ok=True)
    minio = services.start_minio(root)
    try:
        env = {"AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": minio.credentials[
            "access_key"], "AWS_SECRET_ACCESS_KEY": minio.credentials["secret_key"]}
        target = root / "target"
        if not (root / "put").exists():
            print(f"putting {args.objects:,} objects (once)", file=sys.stderr)
            services.minio_create_bucket(minio, BUCKET)
            began = time.monotonic()
            put(minio, 0, args.objects)
            print(f"put in {time.monotonic() - began:.1f} s", file=sys.stderr)
            (root / "put").write_text(str(args.objects))
        if not (root / "loaded").exists():
            subprocess.run(["rm", "-rf", str(target)], check=True)
            seed(minio, root, target, env)
            (root / "loaded").write_text("")
        figures = rounds(args, root, target, minio, env)
    finally:
        minio.stop()
    result = report(args.objects, figures)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def rounds(args: argparse.Namespace, root: Path, target: Path, minio: services.Service,
           env: dict[str, str]) -> dict[str, dict[str, list]]:
    added_file = root / "added"
    added = int(added_file.read_text()) if added_file.exists() else 0
    figures: dict[str, dict[str, list]] = {}
    for round_ in range(args.repeat):
        order = ["full", "after"] if round_ % 2 == 0 else ["after", "full"]
        for case in order:
            put(minio, args.objects + added, args.new)
            added += args.new
            added_file.write_text(str(added))
            flags = ["--after-last-key"] if case == "after" else []
            seconds, rss, done = run(root, target, env, "", *flags)
            if done["files_loaded"] != args.new:
                sys.exit(f"{case}: expected {args.new} loaded, got {done['files_loaded']}")
            cell = figures.setdefault(case, {"seconds": [], "rss_mib": [], "listing_calls": []})
            cell["seconds"].append(round(seconds, 3))
            cell["rss_mib"].append(rss)
            cell["listing_calls"].append(done["listing_calls"])
            print(f"round {round_ + 1} {case:<5} {seconds:7.2f} s {rss:5d} MiB "
                  f"{done['listing_calls']:4d} listing calls ({done['files_loaded']} loaded, "
                  f"{done['files_skipped']} skipped)", file=sys.stderr)
    return figures


def report(objects: int, figures: dict[str, dict[str, list]]) -> dict:
    """Medians, `after` against `full`; printed and returned."""
    result: dict = {"benchmark": "s3_listing", "objects": objects, "cases": {}}
    base = statistics.median(figures["full"]["seconds"])
    print(f"# {objects:,} objects in MinIO, {len(figures['full']['seconds'])} rounds")
    print(f"{'case':<6} {'wall s':>8} {'RSS MiB':>8} {'calls':>6} {'wall/full':>10}")
    for case, cell in figures.items():
        wall, rss = statistics.median(cell["seconds"]), statistics.median(cell["rss_mib"])
        calls = statistics.median(cell["listing_calls"])
        print(f"{case:<6} {wall:>8.2f} {rss:>8.0f} {calls:>6.0f} {wall / base:>10.3f}")
        result["cases"][case] = {**cell, "median_seconds": wall, "median_rss_mib": rss,
                                 "median_listing_calls": calls, "wall_vs_full": wall / base}
    return result


if __name__ == "__main__":
    sys.exit(main())
