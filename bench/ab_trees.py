"""Same-run A/B of two trees of chload: one `chload load` timed from this tree and from a
base tree, in turn (A B A B ...), as paired ratios, so a drift of the machine's speed
falls on both sides of every pair.

    python3 bench/ab_trees.py --base DIR --files 'data/*.csv.gz' [--target URL] [--repeats N]

`--base DIR`: a checkout of the base commit (`git worktree add --detach DIR COMMIT`); its
chload runs with PYTHONPATH=DIR and PYTHONSAFEPATH=1, this tree's likewise. Without
--target each run loads into a fresh embedded directory; with a server URL, into a fresh
table (CLICKHOUSE_PASSWORD from the environment). Prints each side's wall and CPU
seconds (median, min, max) and this tree / base per pair; --json writes them too.
bench/cluster.py --base does the same for the cluster target.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(tree: str, files: str, target: str | None) -> tuple[float, float]:
    """Wall and CPU seconds (user + sys of the child) of one load from `tree`, into a
    fresh embedded directory or a fresh table (nothing it loads is skipped)."""
    work = tempfile.mkdtemp(prefix="chload-ab-")
    where = target or os.path.join(work, "target")
    table = f"ab_{os.path.basename(work).replace('-', '_')}" if target else "t"
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONSAFEPATH": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "chload", "load", files, "--table", table,
                           "--target", where], env=env, capture_output=True, text=True,
                          timeout=900)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0:
        sys.exit(f"{tree}: chload load failed: {done.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.3f} (min {min(values):.3f}, "
            f"max {max(values):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="a checkout of the base tree")
    parser.add_argument("--files", required=True, help="what `chload load` is given")
    parser.add_argument("--target", help="a server URL (default: a fresh embedded directory)")
    parser.add_argument("--repeats", type=int, default=15, help="pairs after one warm-up pair")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    trees = {"this tree": str(ROOT), "base": os.path.abspath(args.base)}
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(tree, "chload")],
                       check=True)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for n in range(args.repeats + 1):
        for name, tree in trees.items():
            figures = one_run(tree, args.files, args.target)
            if n:  # the first pair warms the page cache and the bytecode
                runs[name].append(figures)
    wall = [a[0] / b[0] for a, b in zip(runs["this tree"], runs["base"], strict=True)]
    cpu = [a[1] / b[1] for a, b in zip(runs["this tree"], runs["base"], strict=True)]
    print(f"load {args.files} into {args.target or 'a fresh embedded directory'}, "
          f"{args.repeats} pairs; load average {os.getloadavg()[0]:.2f}")
    for name in trees:
        print(f"{name:10} wall {spread([w for w, _ in runs[name]])}  "
              f"cpu {spread([c for _, c in runs[name]])}")
    print(f"this tree / base, paired: wall {spread(wall)}; cpu {spread(cpu)}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "files": args.files, "target": args.target or "embedded", "pairs": args.repeats,
            "runs": runs, "paired_wall": wall, "paired_cpu": cpu}, indent=1))


if __name__ == "__main__":
    main()
