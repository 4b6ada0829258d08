#!/usr/bin/env python3
"""Many small files: what a rerun costs once a table holds a long history.

    python3 bench/many_files.py [--files 100000] [--new 10] [--repeat 3]
        [--vs CHECKOUT] [--json OUT]

N files of 10 CSV rows each under `f/pNNNN/fNNNNNNN.csv` (1,000 a directory) are written
once (cached under $CHLOAD_BENCH_CACHE/many_files/N) and loaded once into an embedded
target (cached beside them, untimed: the first load is another benchmark's). Then, for
this chload and, with `--vs`, another checkout (e.g. /work/main), alternately and
`--repeat` times:

- `rerun`: `chload load 'DIR/**/*.csv'` again: every file skipped;
- `new`: `--new` more files written beside them (fresh names each time), then the same
  command: they load, the rest is skipped.

`--seed` writes the first load's ledger directly (seed_ledger), for a million files.

Each is a whole `chload load` process: its wall time, its peak RSS (the kernel's,
`wait4` ru_maxrss) and its CPU time (user and system: what busy neighbours move least).
The report prints the medians, each as a ratio to the same case of `--vs` when given,
and each against the bounds below (GOALS). Both checkouts share the one target (same
ledger); the files each run adds are loaded by the other's later runs
in the `rerun` case only as skips.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from common import CACHE, compile_chload  # noqa: E402

PER_DIRECTORY = 1000
# (files, case) -> (wall seconds, peak RSS MiB) a run must stay under
GOALS = {(100_000, "rerun"): (2.5, 300), (100_000, "new"): (2.0, 300),
         (1_000_000, "rerun"): (20.0, 300), (1_000_000, "new"): (5.0, 500)}


def write_files(root: Path, first: int, count: int, sub: str = "") -> None:
    """Files [first, first + count) of 10 rows each (`sub`: a directory of their own)."""
    for i in range(first, first + count):
        directory = root / "f" / (sub or f"p{i // PER_DIRECTORY:04d}")
        if sub or i % PER_DIRECTORY == 0 or i == first:
            directory.mkdir(parents=True, exist_ok=True)
        rows = "".join(f"{i}{r:02d},n{r},{r}.5\n" for r in range(10))
        (directory / f"f{i:07d}.csv").write_text("id,name,value\n" + rows)


def dataset(files: int) -> Path:
    root = Path(CACHE) / "many_files" / str(files)
    done = root / "written"
    if not done.exists():
        print(f"writing {files:,} files under {root} (once)", file=sys.stderr)
        write_files(root, 0, files)
        done.write_text(str(files))
    return root


def seed_ledger(root: Path, target: Path) -> None:
    """The first load, short-cut (--seed): the first directory's files loaded by chload,
    then the ledger events a load would write for every other file (`committing` and
    `loaded`, identities from a stat) inserted straight into `chload.files`. A rerun
    reads only the ledger and the listing, so it cannot tell; a real first load of a
    million files takes tens of minutes here."""
    run(str(ROOT), root, target, f"{root}/f/p0000/*.csv")
    seed = root / "seed.tsv"
    with seed.open("w") as out:
        n = 0
        for directory in sorted((root / "f").iterdir()):
            if directory.name == "p0000" or not directory.name.startswith("p"):
                continue
            for entry in sorted(os.scandir(directory), key=lambda e: e.name):
                st = entry.stat()
                out.write(f"{os.path.realpath(entry.path)}\t{st.st_size}\t{st.st_mtime_ns}\t{n}\n")
                n += 1
    sql = (f"INSERT INTO chload.files (target_table, uri, identity, size, mtime_ns, state, "
           f"rows, bytes, run_id, seq, table_uuid) SELECT 'default.t', uri, concat(toString("
           f"size), ':', toString(mtime)), size, mtime, st, 10, size, 'seed', toUInt64("
           f"{time.time_ns()}) + n * 2 + (st = 'loaded'), (SELECT any(table_uuid) FROM "
           f"chload.files WHERE target_table = 'default.t') FROM file('{seed}', 'TSV', "
           f"'uri String, size UInt64, mtime UInt64, n UInt64') ARRAY JOIN ['committing', "
           f"'loaded'] AS st")
    subprocess.run([sys.executable, "-c", "import chdb.session, sys; chdb.session.Session("
                    "sys.argv[1]).query(sys.argv[2])", str(target), sql], check=True)
    seed.unlink()


def run(checkout: str, root: Path, target: Path, pattern: str = "",
        ) -> tuple[float, int, str, float]:
    """One `chload load` of every file: (wall seconds, peak RSS MiB, its summary line,
    CPU seconds: user and system, what neighbours on a shared machine move least)."""
    argv = [sys.executable, "-m", "chload", "load", pattern or f"{root}/f/**/*.csv",
            "--table", "t", "--target", str(target), "--json"]
    env = {**os.environ, "PYTHONPATH": checkout}
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=checkout)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        text, problem = out.read().decode(), err.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"chload ({checkout}) failed: {problem[-2000:]}")
    report = json.loads(text.strip().splitlines()[-1])
    summary = (f"{report['files_loaded']} loaded, {report['files_skipped']} skipped, "
               f"{report['rows_loaded']} rows")
    return seconds, usage.ru_maxrss // 1024, summary, usage.ru_utime + usage.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--new", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--vs", help="another chload checkout to compare with (e.g. /work/main)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--seed", action="store_true", help="write the first load's ledger "
                   "directly, but for the first directory (seed_ledger)")
    p.add_argument("--only", choices=["rerun", "new"], help="measure one case only")
    args = p.parse_args()
    checkouts = {"this": str(ROOT)} | ({"vs": args.vs} if args.vs else {})
    for checkout in checkouts.values():
        compile_chload(os.path.join(checkout, "chload"))
    root = dataset(args.files)
    target = root / "target"
    if not (root / "loaded").exists():
        print(f"first load of {args.files:,} files (once, untimed)", file=sys.stderr)
        subprocess.run(["rm", "-rf", str(target)], check=True)
        if args.seed:
            seed_ledger(root, target)
        else:
            run(str(ROOT), root, target)
        (root / "loaded").write_text("")
    added = int((root / "added").read_text()) if (root / "added").exists() else 0
    figures: dict[str, dict[str, list]] = {}
    for round_ in range(args.repeat):
        order = list(checkouts.items())
        if round_ % 2:
            order.reverse()  # alternate who goes first
        for case in [args.only] if args.only else ["rerun", "new"]:
            for label, checkout in order:
                if case == "new":
                    write_files(root, args.files + added, args.new, sub=f"new{added:07d}")
                    added += args.new
                    (root / "added").write_text(str(added))
                seconds, rss, summary, cpu = run(checkout, root, target)
                expect = args.new if case == "new" else 0
                if not summary.startswith(f"{expect} loaded"):
                    sys.exit(f"{label} {case}: expected {expect} loaded, got {summary}")
                cell = figures.setdefault(f"{case} {label}",
                                          {"seconds": [], "rss_mib": [], "cpu_seconds": []})
                cell["seconds"].append(round(seconds, 3))
                cell["rss_mib"].append(rss)
                cell["cpu_seconds"].append(round(cpu, 3))
                print(f"round {round_ + 1} {case:<5} {label:<4} {seconds:7.2f} s "
                      f"{rss:5d} MiB {cpu:7.2f} CPU s  ({summary})", file=sys.stderr)
    result = report(args.files, figures, bool(args.vs))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def report(files: int, figures: dict[str, dict[str, list]], versus: bool) -> dict:
    """Medians, ratios to `vs`, and each against its goal; printed and returned."""
    result: dict = {"benchmark": "many_files", "files": files, "cases": {}}
    runs = len(next(iter(figures.values()))["seconds"])
    print(f"# {files:,} files of 10 rows: medians of {runs}")
    print(f"{'case':<12} {'wall s':>8} {'RSS MiB':>8} {'CPU s':>7} {'wall/vs':>8} "
          f"{'RSS/vs':>7}  goal")
    for name, cell in figures.items():
        case, label = name.split()
        wall, rss = statistics.median(cell["seconds"]), statistics.median(cell["rss_mib"])
        cpu = statistics.median(cell.get("cpu_seconds") or [0])
        base = figures.get(f"{case} vs") if versus else None
        ratio_wall = wall / statistics.median(base["seconds"]) if base else None
        ratio_rss = rss / statistics.median(base["rss_mib"]) if base else None
        goal = GOALS.get((files, case))
        met = "" if goal is None or label != "this" else (
            f"{'met' if wall < goal[0] and max(cell['rss_mib']) < goal[1] else 'NOT met'} "
            f"(< {goal[0]} s, < {goal[1]} MiB)")
        print(f"{name:<12} {wall:>8.2f} {rss:>8.0f} {cpu:>7.2f} "
              f"{(f'{ratio_wall:.3f}' if ratio_wall else '-'):>8} "
              f"{(f'{ratio_rss:.3f}' if ratio_rss else '-'):>7}  {met}")
        result["cases"][name] = {**cell, "median_seconds": wall, "median_rss_mib": rss,
                                 "median_cpu_seconds": cpu,
                                 "wall_vs": ratio_wall, "rss_vs": ratio_rss, "goal": goal,
                                 "spread_seconds": [min(cell["seconds"]),
                                                    max(cell["seconds"])]}
    return result


if __name__ == "__main__":
    sys.exit(main())
