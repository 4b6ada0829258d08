#!/usr/bin/env python3
"""Planning's CPU: the first `chload load` of bench/many_files.py's files into a fresh
embedded target, from the process start to the first batch (core/run.py `run` entered),
in CPU seconds (user and system, the process's), for this checkout and another
(`--vs`), alternately, each in a process of its own.

    python3 bench/plan_cpu.py [--files 20000] [--repeat 3] [--vs /work/main]

CPU seconds move little with a neighbour's load where wall seconds follow it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

# Run in the child: chload's CLI, stopped where the plan is made and the loading starts.
_CHILD = r"""
import os, sys
from chload.core import run as runner
def stop(*args, **kwargs):
    t = os.times()
    sys.stdout.write(f"{t.user + t.system:.3f}\n")
    sys.stdout.flush()
    os._exit(0)
runner.run = stop
from chload.cli.main import main
main(["load", sys.argv[1], "--table", "t", "--target", sys.argv[2]])
"""


def planning_cpu(checkout: str, pattern: str) -> float:
    with tempfile.TemporaryDirectory(prefix="plan-cpu-") as target:
        out = subprocess.run([sys.executable, "-c", _CHILD, pattern, target + "/t"],
                             env={**os.environ, "PYTHONPATH": checkout}, cwd=checkout,
                             capture_output=True, text=True, check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        sys.exit(f"{checkout}: {out.stderr[-2000:]}")
    return float(lines[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--vs", help="another chload checkout (e.g. /work/main)")
    args = p.parse_args()
    from many_files import dataset
    pattern = f"{dataset(args.files)}/f/**/*.csv"
    runs: dict[str, list[float]] = {"this": [], "vs": []}
    for r in range(args.repeat):
        order = [("this", str(ROOT)), ("vs", args.vs)] if args.vs else [("this", str(ROOT))]
        for name, checkout in order if r % 2 == 0 else order[::-1]:
            cpu = planning_cpu(checkout, pattern)
            runs[name].append(cpu)
            print(f"round {r + 1} {name:5} {cpu:6.2f} CPU s  load {os.getloadavg()[0]:.1f}",
                  flush=True)
    for name, cpus in runs.items():
        if cpus:
            print(f"{name:5} median {statistics.median(cpus):.2f} CPU s "
                  f"({' '.join(f'{c:.2f}' for c in cpus)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
