"""Adaptive concurrency (`--workers auto`) against fixed `--workers 1, 2, 4, 8`, while
the machine is disturbed.

The same load (the trips rows in gzip CSV files with a header) into a ClickHouse 18.16
server on this machine, a fresh table each time, once per setting per round, settings
alternating (common.interleave). During every load, at the same moments from its start,
`stress-ng --cpu 2` takes the CPU (from STRESS_AT for STRESS_FOR seconds) and `fio`
writes to the disk the server writes to (from FIO_AT for FIO_FOR seconds); both are
stopped when the load ends, if still running.

Bar: auto within 1.1x of the best fixed setting's median, at least 1.25x faster than the
worst's; every load exact (row count) and none failed ("too many parts" included).

    python bench/adaptive.py [--files 40] [--rows 1500000] [--repeats 3] [--json OUT]
                             [--url http://127.0.0.1:8123]   # else a server of its own

Prints median seconds per setting, ratios, and each auto load's changes of the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                                "services"))
from common import CACHE, TRIPS_SCHEMA, compile_chload, interleave, make_trips, query

DB = "bench_adaptive"
SETTINGS = ("1", "2", "4", "8", "auto")
STRESS_AT, STRESS_FOR = 1.0, 4.0  # seconds from a load's start
FIO_AT, FIO_FOR = 6.0, 4.0



class Disturbance:
    """stress-ng and fio started at fixed moments of a load, stopped by their pids."""

    def __init__(self, scratch: str) -> None:
        self.scratch = scratch
        self._procs: list[subprocess.Popen[bytes]] = []
        self._timers: list[threading.Timer] = []

    def start(self) -> None:
        self._timers = [
            threading.Timer(STRESS_AT, self._spawn, [["stress-ng", "--cpu", "2", "--timeout",
                                                      f"{STRESS_FOR:.0f}s", "--quiet"]]),
            threading.Timer(FIO_AT, self._spawn, [[
                "fio", "--name=disturb", f"--directory={self.scratch}", "--rw=write",
                "--bs=1m", "--size=512m", "--time_based", f"--runtime={FIO_FOR:.0f}",
                "--fsync=16", "--output=/dev/null"]]),
        ]
        for timer in self._timers:
            timer.start()

    def _spawn(self, argv: list[str]) -> None:
        self._procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=30)
        self._procs = []
        for name in os.listdir(self.scratch):
            os.remove(os.path.join(self.scratch, name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--rows", type=int, default=1_500_000, help="rows per file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--url", help="an existing server (user default, no password)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    for tool in ("stress-ng", "fio"):
        if not shutil.which(tool):
            sys.exit(f"{tool} missing: python3 scripts/services/services.py install loadgen")
    csv = make_trips(os.path.join(CACHE, f"adaptive_{args.files}x{args.rows}"),
                     args.files, args.rows)
    compile_chload()
    work = tempfile.mkdtemp(prefix="chload-bench-adaptive-")
    server = None
    try:
        url = args.url
        if not url:
            import services

            server = services.start_clickhouse_server(Path(work))
            url = server.url
        scratch = os.path.join(work, "fio")
        os.makedirs(scratch)
        run(args, url, csv, Disturbance(scratch))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, url: str, csv: list[str], disturb: Disturbance) -> None:
    query(url, f"CREATE DATABASE IF NOT EXISTS {DB}")
    total, glob = args.files * args.rows, os.path.join(os.path.dirname(csv[0]), "*.csv.gz")
    streams: dict[str, list[dict]] = {s: [] for s in SETTINGS}

    def load(setting: str) -> float:
        table = f"{DB}.t_{setting}"
        query(url, f"DROP TABLE IF EXISTS {table}")
        query(url, f"CREATE TABLE {table} ({TRIPS_SCHEMA}) ENGINE = MergeTree ORDER BY id")
        argv = [sys.executable, "-m", "chload", "load", glob, "--table", table, "--target",
                url, "--workers", setting, "--json"]
        disturb.start()
        started = time.perf_counter()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        finally:
            seconds = time.perf_counter() - started
            disturb.stop()
        if done.returncode != 0:
            sys.exit(f"--workers {setting} failed: {done.stderr[-2000:]}")
        report = json.loads(done.stdout)
        rows = int(query(url, f"SELECT count() FROM {table}"))
        if rows != total or report["files_failed"]:
            sys.exit(f"--workers {setting}: {rows} rows of {total}, "
                     f"{report['files_failed']} files failed")
        streams[setting].append(report["concurrency"])
        query(url, f"DROP TABLE {table}")
        return seconds

    load_before = os.getloadavg()
    timings = interleave({s: (lambda s=s: load(s)) for s in SETTINGS}, args.repeats,
                         warmup=0)
    load_after = os.getloadavg()
    medians = {s: timings[s].median for s in SETTINGS}
    fixed = {s: m for s, m in medians.items() if s != "auto"}
    best, worst = min(fixed, key=fixed.__getitem__), max(fixed, key=fixed.__getitem__)
    auto = medians["auto"]
    print(f"data: {args.files} gzip CSV files x {args.rows:,} rows ({total:,} rows); server "
          f"ClickHouse {query(url, 'SELECT version()').strip()} on 127.0.0.1; stress-ng "
          f"--cpu 2 at {STRESS_AT}-{STRESS_AT + STRESS_FOR} s, fio writes at "
          f"{FIO_AT}-{FIO_AT + FIO_FOR} s of each load; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'--workers':<10} {'median s':>9} {'vs best fixed':>14}  runs")
    for s in SETTINGS:
        runs = " ".join(f"{x:.2f}" for x in timings[s].seconds)
        print(f"{s:<10} {medians[s]:>9.2f} {medians[s] / fixed[best]:>13.2f}x  {runs}")
    within, faster = auto / fixed[best], fixed[worst] / auto
    print(f"auto / best fixed ({best}): {within:.2f}x (bar <= 1.1: "
          f"{'met' if within <= 1.1 else 'not met'}); worst fixed ({worst}) / auto: "
          f"{faster:.2f}x (bar >= 1.25: {'met' if faster >= 1.25 else 'not met'})")
    for i, c in enumerate(streams["auto"]):
        moves = ", ".join(f"{x['at_s']:.1f}s {x['from']}->{x['to']} ({x['reason']})"
                          for x in c["changes"]) or "none"
        print(f"auto load {i + 1}: {c['start']} -> {c['final']} streams, bound: {c['bound']};"
              f" changes: {moves}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "adaptive concurrency under stress-ng and fio",
                       "files": args.files, "rows_per_file": args.rows,
                       "median_seconds": medians, "runs": {s: timings[s].seconds
                                                           for s in SETTINGS},
                       "auto_vs_best_fixed": within, "worst_fixed_vs_auto": faster,
                       "auto_streams": streams["auto"],
                       "load_average": [load_before[0], load_after[0]],
                       "spread": {s: statistics.pstdev(timings[s].seconds)
                                  for s in SETTINGS}}, fh, indent=2)


if __name__ == "__main__":
    main()
