"""The large tier: a billion trips rows from S3 (MinIO) into each target, end to end.

    python3 bench/large.py --large                 # 1,000,000,000 rows, ~1,000 objects
    python3 bench/large.py --rows 20000000         # any size: objects of --rows-per-object
        [--targets embedded,server,cluster] [--parallel N] [--cache DIR] [--work DIR]
        [--json OUT]

Data: the trips rows (common.trips_select) as gzip CSV objects of about 1M rows in a
MinIO whose data directory lives in --cache: made once (by chDB, straight into MinIO)
and kept; a later run makes only the objects missing. The rows' count and checksum are
computed from the generator itself, not read back.

For each target (large_targets.py: embedded chDB, one 18.16 server, the 3-shard 18.16
cluster), each on a fresh empty table:

1. the fastest hand-made way (embedded: one chDB INSERT ... SELECT FROM s3(glob);
   server: curl posting the objects N at a time; cluster: the same into the
   Distributed table), checked exact (count and checksum);
2. `chload load s3://...` on a terminal: wall time, rows/s, its peak RSS, the servers'
   CPU seconds and bytes written and stored, and the ETA its progress bar showed when
   10% and 50% of the rows were read, against the time that was in fact left;
3. `chload load` killed (SIGKILL) when its bar reaches half the rows, then run again:
   the table must end exact.

Prints a table and, with --json, writes every figure. Services are started on
127.0.0.1 and stopped by PID; the targets' data lives in --work (default: a temporary
directory under /tmp, removed at the end).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TREE, "scripts", "services"))
import services  # noqa: E402
from common import CACHE, TRIPS_SCHEMA, compile_chload, trips_select  # noqa: E402
from large_targets import CHECKSUM, TARGETS  # noqa: E402
from large_watch import Watched, run_plain, watch  # noqa: E402

BUCKET = "bench"
BILLION = 1_000_000_000
_MAKE = r"""
import sys, chdb
url, key, secret, schema = sys.argv[1:5]
for item in sys.argv[5:]:
    name, select = item.split('\t')
    chdb.query(f"INSERT INTO FUNCTION s3('{url}/{name}', '{key}', '{secret}', 'CSVWithNames', "
               f"'{schema}', 'gzip') {select}")
"""


def main() -> None:
    args = _args()
    os.makedirs(args.cache, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="chload-bench-large-")
    os.makedirs(work, exist_ok=True)
    compile_chload()
    minio = services.start_minio(Path(args.cache), name="minio-large")
    result: dict = {"rows": args.rows, "rows_per_object": args.rows_per_object,
                    "commit": _commit(), "cores": os.cpu_count(),
                    "load_average_start": os.getloadavg()[0], "targets": {}}
    try:
        services.minio_create_bucket(minio, BUCKET)
        data = ensure_data(args, minio)
        result["data"] = data
        print(f"data: {args.rows:,} rows in {data['objects']:,} gzip CSV objects, "
              f"{data['bytes']:,} bytes in MinIO; made at {data['rows_per_s']:,.0f} rows/s "
              f"({data['seconds']:.0f} s); checksum ({CHECKSUM}) = {data['checksum']}")
        for name in args.targets.split(","):
            load = os.getloadavg()[0]
            result["targets"][name] = run_target(args, name, minio, data, work)
            result["targets"][name]["load_average"] = [load, os.getloadavg()[0]]
            print(f"load average (1 min) at the start and the end: {load:.1f}, "
                  f"{os.getloadavg()[0]:.1f}")
            _save(args, result)
    finally:
        minio.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    result["load_average_end"] = os.getloadavg()[0]
    estimate(result)
    _save(args, result)


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--large", action="store_true",
                        help="the full tier: --rows defaults to 1,000,000,000")
    parser.add_argument("--rows", type=int, help="rows in all (default 2,000,000; "
                        "1,000,000,000 with --large)")
    parser.add_argument("--rows-per-object", type=int, default=1_000_000)
    parser.add_argument("--targets", default="embedded,server,cluster")
    parser.add_argument("--parallel", type=int, default=max(2, os.cpu_count() or 2),
                        help="the hand-made posts at a time (default: the cores, at least 2)")
    parser.add_argument("--kill-at", type=float, default=0.5,
                        help="fraction of the rows at which chload is killed (default 0.5)")
    parser.add_argument("--cache", default=os.path.join(CACHE, "large"),
                        help="where MinIO keeps the generated objects between runs")
    parser.add_argument("--work", help="the targets' data (default: a temporary directory)")
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    args.rows = args.rows or (BILLION if args.large else 2_000_000)
    return args


def _commit() -> str:
    return subprocess.run(["git", "-C", TREE, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def _save(args: argparse.Namespace, result: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


# ------------------------------------------------------------------ data


def ensure_data(args: argparse.Namespace, minio: services.Service) -> dict:
    """The objects of this size in MinIO, made where missing; their figures (cached)."""
    prefix = f"trips-{args.rows}x{args.rows_per_object}"
    count = math.ceil(args.rows / args.rows_per_object)
    names = [f"{prefix}/trips_{i:05d}.csv.gz" for i in range(count)]
    client = services.minio_client(minio)
    have = _listing(client, prefix)
    figures_path = Path(args.cache) / f"{prefix}.json"
    figures = json.loads(figures_path.read_text()) if figures_path.exists() else {}
    missing = [i for i, name in enumerate(names) if name not in have]
    if missing:
        print(f"making {len(missing):,} of {count:,} objects under {BUCKET}/{prefix}/ ...",
              flush=True)
        started = time.perf_counter()
        _make(args, minio, [(i, names[i]) for i in missing])
        seconds = time.perf_counter() - started
        made = sum(min(args.rows_per_object, args.rows - i * args.rows_per_object)
                   for i in missing)
        figures.update(seconds=seconds, rows_per_s=made / seconds, made_rows=made)
        have = _listing(client, prefix)
    if "checksum" not in figures:
        import chdb

        figures["checksum"] = [int(x) for x in chdb.query(
            f"SELECT {CHECKSUM} FROM ({trips_select(0, args.rows)})", "TSV").bytes().split()]
    figures.update(objects=count, bytes=sum(have[n] for n in names), prefix=prefix,
                   glob=f"s3://{BUCKET}/{prefix}/*.csv.gz",
                   glob_url=f"{minio.url}/{BUCKET}/{prefix}/*.csv.gz", names=names)
    figures_path.write_text(json.dumps({k: v for k, v in figures.items() if k != "names"}))
    return figures


def _listing(client: object, prefix: str) -> dict[str, int]:
    pages = client.get_paginator("list_objects_v2").paginate(  # type: ignore[attr-defined]
        Bucket=BUCKET, Prefix=prefix + "/")
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def _make(args: argparse.Namespace, minio: services.Service,
          todo: list[tuple[int, str]]) -> None:
    """Each object written by chDB straight into MinIO; `--parallel` processes."""
    per = args.rows_per_object
    items = [f"{name.split('/', 1)[1]}\t{trips_select(i * per, min(per, args.rows - i * per))}"
             for i, name in todo]
    url = f"{minio.url}/{BUCKET}/{todo[0][1].split('/', 1)[0]}"
    creds = [minio.credentials["access_key"], minio.credentials["secret_key"]]
    shares = [items[k::args.parallel] for k in range(args.parallel)]
    with ThreadPoolExecutor(args.parallel) as pool:
        for share in [s for s in shares if s]:
            pool.submit(_make_share, [sys.executable, "-c", _MAKE, url, *creds, TRIPS_SCHEMA,
                                      *share])


def _make_share(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        print(f"making objects failed: {done.stderr[-1500:]}", file=sys.stderr)


# ------------------------------------------------------------------ one target


def run_target(args: argparse.Namespace, name: str, minio: services.Service, data: dict,
               work: str) -> dict:
    s3 = {"glob_url": data["glob_url"], "key": minio.credentials["access_key"],
          "secret": minio.credentials["secret_key"]}
    target = TARGETS[name](work, s3)
    env = {"AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": s3["key"],
           "AWS_SECRET_ACCESS_KEY": s3["secret"], "PYTHONPATH": TREE, "PYTHONSAFEPATH": "1"}
    urls = os.path.join(work, "objects.urls")
    client = services.minio_client(minio)
    Path(urls).write_text("".join(client.generate_presigned_url(  # type: ignore[attr-defined]
        "get_object", Params={"Bucket": BUCKET, "Key": n}, ExpiresIn=7 * 86400) + "\n"
        for n in data["names"]))
    want = data["checksum"]
    out: dict = {}
    try:
        out["hand"] = _measured(target, lambda: run_plain(target.hand(urls, args.parallel),
                                                          env)[0], want, "hand-made")
        out["chload"] = _measured(target, lambda: watch(target.chload(data["glob"]), env,
                                                        args.rows), want, "chload")
        out["kill_rerun"] = _kill_rerun(args, target, data["glob"], env, want)
    finally:
        target.stop()
        os.remove(urls)
    _print_target(name, args.rows, out)
    return out


def _measured(target: object, run: object, want: list[int], what: str) -> dict:
    """One load on a fresh table: its process's figures, the servers', the table's."""
    target.fresh()  # type: ignore[attr-defined]
    before = target.counters()  # type: ignore[attr-defined]
    watched: Watched = run()  # type: ignore[operator]
    after = target.counters()  # type: ignore[attr-defined]
    if watched.returncode:
        sys.exit(f"{target.name} {what} failed ({watched.returncode}):\n"  # type: ignore
                 f"{watched.tail}")
    got = target.checksum()  # type: ignore[attr-defined]
    engine_cpu, engine_written = ((after[0] - before[0], after[1] - before[1])
                                  if target.has_server  # type: ignore[attr-defined]
                                  else (watched.cpu_s, watched.written_bytes))
    return {"seconds": watched.seconds, "peak_rss_bytes": watched.peak_rss_bytes,
            "loader_cpu_s": watched.cpu_s, "engine_cpu_s": engine_cpu,
            "engine_written_bytes": engine_written,
            "stored_bytes": target.stored_bytes(),  # type: ignore[attr-defined]
            "exact": got == want, "checksum": got, "eta": watched.eta_errors(),
            "summary": _summary(watched.tail)}


def _summary(drawn: str) -> list[str]:
    """The summary chload printed after its bar (its saturation and streams lines)."""
    lines = [line.strip() for line in drawn.replace("\r", "\n").splitlines()]
    return [line for line in lines if line and "ETA" not in line][-8:]


def _kill_rerun(args: argparse.Namespace, target: object, glob: str, env: dict[str, str],
                want: list[int]) -> dict:
    """chload killed half-way (SIGKILL), then the same command again: exact?"""
    target.fresh()  # type: ignore[attr-defined]
    argv = target.chload(glob)  # type: ignore[attr-defined]
    killed = watch(argv, env, args.rows, marks=(), kill_at=args.kill_at)
    at_kill = target.checksum()  # type: ignore[attr-defined]
    rerun, stdout = run_plain([*argv, "--json"], env)
    got = target.checksum()  # type: ignore[attr-defined]
    report = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    return {"killed": killed.killed, "killed_after_s": killed.seconds,
            "rows_committed_at_kill": at_kill[0], "rerun_seconds": rerun.seconds,
            "rerun_returncode": rerun.returncode, "rerun_rows_loaded": report.get("rows_loaded"),
            "rerun_files_skipped": report.get("files_skipped"),
            "rerun_peak_rss_bytes": rerun.peak_rss_bytes, "exact": got == want,
            "checksum": got, "tail": "" if got == want else rerun.tail}


# ------------------------------------------------------------------ report


def _print_target(name: str, rows: int, out: dict) -> None:
    hand, chload, kill = out["hand"], out["chload"], out["kill_rerun"]
    print(f"\n# {name}: {rows:,} rows")
    print(f"{'method':<10} {'seconds':>9} {'rows/s':>12} {'peak RSS MB':>12} "
          f"{'loader CPU s':>13} {'engine CPU s':>13} {'written MB':>11} {'stored MB':>10} "
          "exact")
    for label, m in (("hand", hand), ("chload", chload)):
        print(f"{label:<10} {m['seconds']:>9.1f} {rows / m['seconds']:>12,.0f} "
              f"{m['peak_rss_bytes'] / 1e6:>12,.0f} {m['loader_cpu_s']:>13.1f} "
              f"{m['engine_cpu_s']:>13.1f} "
              f"{m['engine_written_bytes'] / 1e6:>11,.0f} {m['stored_bytes'] / 1e6:>10,.0f} "
              f"{m['exact']}")
    ratio = chload["seconds"] / hand["seconds"]
    out["ratio_chload_to_hand"] = ratio
    print(f"chload time / hand time: {ratio:.2f} (speed {1 / ratio:.2f}x)")
    for mark, e in chload["eta"].items():
        shown = "-" if e["eta_s"] is None else f"{e['eta_s']:.0f} s"
        err = "-" if e["error"] is None else f"{e['error']:+.0%}"
        print(f"ETA at {mark}: shown {shown} at {e['at_s']:.1f} s, actually left "
              f"{e['actual_left_s']:.1f} s: error {err}")
    print(f"kill -9 after {kill['killed_after_s']:.1f} s ({kill['rows_committed_at_kill']:,} "
          f"rows committed), rerun {kill['rerun_seconds']:.1f} s "
          f"({kill['rerun_rows_loaded']} rows loaded, {kill['rerun_files_skipped']} objects "
          f"skipped): exact {kill['exact']}")
    if not kill["exact"]:
        print(kill["tail"])
    if not kill["killed"] or kill["rows_committed_at_kill"] >= rows:
        print("note: the kill came after every row was committed (the bar's rows reached "
              "half only at the end): this run tested no kill mid-load")


def estimate(result: dict) -> None:
    """At a smaller size: what a billion rows would take, at the rates measured here."""
    rows, data = result["rows"], result["data"]
    if rows >= BILLION:
        return
    scale = BILLION / rows
    est: dict = {"generate_s": BILLION / data["rows_per_s"],
                 "minio_bytes": data["bytes"] * scale, "targets": {}}
    print(f"\n# a billion rows at these rates: making the data "
          f"{est['generate_s'] / 3600:.1f} h, {est['minio_bytes'] / 1e9:.0f} GB in MinIO")
    for name, out in result["targets"].items():
        t = {"chload_s": out["chload"]["seconds"] * scale,
             "hand_s": out["hand"]["seconds"] * scale,
             "kill_rerun_s": (out["kill_rerun"]["killed_after_s"]
                              + out["kill_rerun"]["rerun_seconds"]) * scale,
             "stored_bytes": out["chload"]["stored_bytes"] * scale}
        est["targets"][name] = t
        print(f"{name}: chload {t['chload_s'] / 3600:.1f} h, hand {t['hand_s'] / 3600:.1f} h, "
              f"kill + rerun {t['kill_rerun_s'] / 3600:.1f} h; stored "
              f"{t['stored_bytes'] / 1e9:.0f} GB")
    result["billion_estimate"] = est


if __name__ == "__main__":
    main()
