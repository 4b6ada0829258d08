#!/usr/bin/env python3
"""Many small files: what a rerun costs once a table holds a long history.

    python3 bench/many_files.py [--files 100000] [--new 10] [--repeat 3]
        [--vs CHECKOUT] [--json OUT] [--first [--vs CHECKOUT]] [--server FILES]

N files of 10 CSV rows each under `f/pNNNN/fNNNNNNN.csv` (1,000 a directory) are written
once (cached under $CHLOAD_BENCH_CACHE/many_files/N) and loaded once into an embedded
target (cached beside them, untimed: the first load is another benchmark's). Then, for
this chload and, with `--vs`, another checkout (e.g. /work/main), alternately and
`--repeat` times:

- `rerun`: `chload load 'DIR/**/*.csv'` again: every file skipped;
- `new`: `--new` more files written beside them (fresh names each time), then the same
  command: they load, the rest is skipped.

`--seed` writes the first load's ledger directly (seed_ledger), for a million files.

`--first` measures the first load itself instead: `chload load` into a fresh embedded
target against one chDB statement, `INSERT INTO t SELECT * FROM file('f/**/*.csv')`,
alternately, each a process of its own; it prints both times, files/s and chload's speed
against the statement (goal FIRST_GOAL), and each process's CPU seconds; with `--vs`,
the other checkout's first load runs in the same rounds. `--server N` does the same for the first N
files into a ClickHouse 18.16 server of its own, against curl posting each file,
POSTERS at a time: files/s of each and the speed ratio.

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
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from common import CACHE, compile_chload, query  # noqa: E402

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
    p.add_argument("--first", action="store_true", help="measure the first load against "
                   "one chDB statement over the same files (first_load)")
    p.add_argument("--server", type=int, metavar="FILES", help="measure the first load of "
                   "this many files into an 18.16 server against curl (server_load)")
    args = p.parse_args()
    checkouts = {"this": str(ROOT)} | ({"vs": args.vs} if args.vs else {})
    for checkout in checkouts.values():
        compile_chload(os.path.join(checkout, "chload"))
    root = dataset(args.files)
    if args.first or args.server:
        result = {"benchmark": "many_files", "files": args.files}
        if args.first:
            result["first"] = first_load(root, args.files, args.repeat, args.vs)
        if args.server:
            result["server"] = server_load(root, args.server, args.repeat)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return 0
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
                cell = figures.setdefault(f"{case} {label}", {
                    "seconds": [], "rss_mib": [], "cpu_seconds": [], "load_average": []})
                cell["seconds"].append(round(seconds, 3))
                cell["rss_mib"].append(rss)
                cell["cpu_seconds"].append(round(cpu, 3))
                cell["load_average"].append(round(os.getloadavg()[0], 1))
                print(f"round {round_ + 1} {case:<5} {label:<4} {seconds:7.2f} s "
                      f"{rss:5d} MiB {cpu:7.2f} CPU s  load {os.getloadavg()[0]:4.1f}  "
                      f"({summary})", file=sys.stderr)
    result = report(args.files, figures, bool(args.vs))
    result["commits"] = {label: _commit(checkout) for label, checkout in checkouts.items()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _commit(checkout: str) -> str:
    """The checkout's commit, as measured (with `+` when its tree had changes)."""
    head = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", checkout, "status", "--porcelain", "--", "chload"],
                           capture_output=True, text=True).stdout.strip()
    return head + ("+" if dirty else "")


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


# ---------------------------------------------------------------- the first load
FIRST_GOAL = 0.7  # chload's speed against one chDB statement over the same files, at least
SCHEMA = "id Int64, name String, value Float64"  # what chDB infers from the files
ONE_STATEMENT = ("import chdb.session, sys; s = chdb.session.Session(sys.argv[1]); "
                 "s.query('CREATE TABLE t (" + SCHEMA + ") ENGINE = MergeTree ORDER BY "
                 "tuple()'); s.query(\"INSERT INTO t SELECT * FROM file('\" + sys.argv[2] "
                 "+ \"')\"); print(s.query('SELECT count() FROM t', 'TSV'))")


def first_load(root: Path, files: int, repeat: int, versus: str | None = None) -> dict:
    """The first load of every file into a fresh embedded target, against one chDB
    statement (`INSERT INTO t SELECT * FROM file('f/**/*.csv')`, a process of its own
    too) into a fresh directory, alternately: its seconds, and the speed ratio. Every
    file under f/ counts, the reruns' new ones too. `versus`: another checkout's chload
    too (`--vs`), in the same rounds, its speed against the same statement beside."""
    pattern = f"{root}/f/**/*.csv"
    files = sum(1 for _ in (root / "f").glob("**/*.csv"))
    checkouts = {"chload": str(ROOT)} | ({"vs": versus} if versus else {})
    seconds: dict[str, list[float]] = {m: [] for m in [*checkouts, "chdb"]}
    cpu: dict[str, list[float]] = {m: [] for m in seconds}
    load: dict[str, list[float]] = {m: [] for m in seconds}
    with tempfile.TemporaryDirectory(prefix="chload-first-") as work:
        for round_ in range(repeat):
            order = list(seconds)
            order = order[round_ % len(order):] + order[:round_ % len(order)]  # each first in turn
            for method in order:
                target = Path(work) / f"{method}{round_}"
                if method in checkouts:
                    wall, _, summary, used = run(checkouts[method], root, target, pattern)
                    if not summary.startswith(f"{files} loaded"):
                        sys.exit(f"{method} first load: expected {files} loaded, got {summary}")
                    cpu[method].append(round(used, 2))
                else:
                    wall, used = _one_statement(target, pattern, files * 10)
                    cpu[method].append(round(used, 2))
                seconds[method].append(round(wall, 3))
                load[method].append(round(os.getloadavg()[0], 1))
                subprocess.run(["rm", "-rf", str(target)], check=True)
                print(f"round {round_ + 1} first {method:<6} {wall:7.2f} s "
                      f"{cpu[method][-1]:7.2f} CPU s  load {os.getloadavg()[0]:4.1f}",
                      file=sys.stderr)
    if versus:
        print(f"vs ({versus}): {_ratios(seconds['chdb'], seconds['vs'])}")
    return {**speed_report(f"first load of {files:,} files into a fresh embedded target", seconds,
                        "chdb", "one chDB statement over the same files", FIRST_GOAL, files),
            "cpu_seconds": cpu, "load_average": load,
            "commits": {m: _commit(c) for m, c in checkouts.items()}}


def _ratios(base: list[float], chload: list[float]) -> str:
    """The statement's seconds over chload's, per round."""
    return " ".join(f"{b / c:.2f}" for b, c in zip(base, chload, strict=True))


def _one_statement(target: Path, pattern: str, rows: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user and system) of the one statement's process."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, "-c", ONE_STATEMENT, str(target), pattern],
                                stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        out.seek(0)
        counted = out.read().decode().strip()
    if os.waitstatus_to_exitcode(status) != 0 or counted != str(rows):
        sys.exit(f"one chDB statement loaded {counted or 'nothing'}, not {rows} rows")
    return wall, usage.ru_utime + usage.ru_stime


def speed_report(title: str, seconds: dict[str, list[float]], base: str, what: str,
                 goal: float | None, files: int) -> dict:
    """Medians, files/s and the speed ratio (base seconds / chload seconds: higher is
    faster), of the medians and per round (a round runs both back to back)."""
    wall = {m: statistics.median(s) for m, s in seconds.items()}
    rounds = sorted(b / c for b, c in zip(seconds[base], seconds["chload"], strict=True))
    ratio, paired = wall[base] / wall["chload"], statistics.median(rounds)
    print(f"# {title}: medians of {len(rounds)}")
    for method, s in seconds.items():
        print(f"{method:<8} {wall[method]:8.2f} s {files / wall[method]:10,.0f} files/s  "
              f"({' '.join(f'{x:.2f}' for x in s)})")
    verdict = "" if goal is None else (
        f"; goal >= {goal}: {'met' if min(ratio, paired) >= goal else 'NOT met'}")
    print(f"speed of chload vs {what}: {ratio:.2f}x, per round {paired:.2f}x "
          f"({rounds[0]:.2f}-{rounds[-1]:.2f}){verdict}")
    return {"title": title, "seconds": seconds, "median_seconds": wall,
            "files_per_second": {m: files / w for m, w in wall.items()},
            "speed_vs_baseline": ratio, "speed_vs_baseline_per_round": paired, "goal": goal}


# ---------------------------------------------------------------- into an 18.16 server
POSTERS = 4  # curl processes posting files at once, the baseline into a server


def server_load(root: Path, files: int, repeat: int) -> dict:
    """The first load of the first `files` files into a ClickHouse 18.16 server (one of
    its own, scripts/services), a fresh table each time (none dropped: 18.16's DROP waits
    for the merges of curl's part a file): chload against curl posting each file
    (`INSERT ... FORMAT CSVWithNames`), POSTERS at a time."""
    sys.path.insert(0, str(ROOT / "scripts" / "services"))
    import services

    directories = -(-files // PER_DIRECTORY)
    pattern = f"{root}/f/p{{{0:04d}..{directories - 1:04d}}}/*.csv"
    listed = sorted(str(p) for d in range(directories)
                    for p in (root / "f" / f"p{d:04d}").glob("*.csv"))[:files]
    if files % PER_DIRECTORY or len(listed) != files:
        sys.exit(f"--server: a multiple of {PER_DIRECTORY} files, at most the data set's")
    seconds: dict[str, list[float]] = {"chload": [], "curl": []}
    with tempfile.TemporaryDirectory(prefix="chload-server-") as work:
        server = services.start_clickhouse_server(Path(work))
        try:
            url = server.url
            for round_ in range(repeat):
                order = ["chload", "curl"] if round_ % 2 == 0 else ["curl", "chload"]
                for method in order:
                    table = f"t_{method}_{round_}"
                    query(url, f"CREATE TABLE default.{table} ({SCHEMA}) ENGINE = MergeTree "
                               "ORDER BY tuple()")
                    started = time.monotonic()
                    if method == "chload":
                        _chload_server(url, table, pattern, files)
                    else:
                        _curl(url, table, listed)
                    wall = time.monotonic() - started
                    count = int(query(url, f"SELECT count() FROM default.{table}"))
                    if count != files * 10:
                        sys.exit(f"{method} into the server: {count} rows, not {files * 10}")
                    seconds[method].append(round(wall, 3))
                    print(f"round {round_ + 1} server {method:<6} {wall:7.2f} s",
                          file=sys.stderr)
        finally:
            server.stop()
    return speed_report(f"first load of {files:,} files into a ClickHouse 18.16 server",
                        seconds, "curl", f"curl posting the files {POSTERS} at a time", None,
                        files)


def _chload_server(url: str, table: str, pattern: str, files: int) -> None:
    done = subprocess.run([sys.executable, "-m", "chload", "load", pattern, "--table", table,
                           "--target", url, "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    if done.returncode != 0:
        sys.exit(f"chload into the server failed: {done.stderr[-2000:]}")
    loaded = json.loads(done.stdout.strip().splitlines()[-1])["files_loaded"]
    if loaded != files:
        sys.exit(f"chload into the server loaded {loaded} files, not {files}")


def _curl(url: str, table: str, paths: list[str]) -> None:
    insert = urllib.parse.quote_plus(f"INSERT INTO default.{table} FORMAT CSVWithNames")
    subprocess.run(["xargs", "-0", f"-P{POSTERS}", "-I{}", "curl", "-sSf", "--data-binary",
                    "@{}", f"{url}/?query={insert}"], input="\0".join(paths).encode(),
                   check=True)


if __name__ == "__main__":
    sys.exit(main())
