#!/usr/bin/env python3
"""Where one `chload load` spends its time, by phase of core/load.py's load_table.

    python3 bench/load_phases.py [--files 100000] [--json OUT]

The first load of bench/many_files.py's files (written once, cached) into a fresh
embedded target, in this process, with the planning steps and the loading wrapped by
timers: for each, when it started and ended (seconds from the start of this process)
and its wall time summed over its calls (over the loader's threads for load_batch and
Committer.commit, so that sum can exceed the run's wall). Nothing in chload changes:
the wrappers call the functions as they are. One run; say the load average with it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from many_files import dataset  # noqa: E402

STARTED = time.monotonic()
Calls = dict[str, list[float]]  # label -> [first start, last end, summed wall, calls]


def _timed(owner: Any, name: str, label: str, calls: Calls) -> None:
    fn: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            ended = time.monotonic()
            seen = calls.setdefault(label, [began - STARTED, 0.0, 0.0, 0])
            seen[1] = max(seen[1], ended - STARTED)
            seen[2] += ended - began
            seen[3] += 1
    setattr(owner, name, timed)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    root = dataset(args.files)
    from chload.cli.main import main as chload
    from chload.commit import committer
    from chload.core import load, plan, run
    from chload.sources import run as sources
    from chload.targets.embedded import target as embedded
    calls: Calls = {}
    for owner, name, label in [
            (plan, "decide", "listing + ledger keys (plan.decide)"),
            (sources.RunSources, "described", "described (sources)"),
            (plan, "resolve_format", "format sniffing (resolve_format)"),
            (load, "_prepare", "schema inferred, table made (_prepare)"),
            (plan, "check_headers", "headers check (check_headers)"),
            (sources.RunSources, "stored", "values check (sources.stored)"),
            (load, "_groups", "batching (_groups)"),
            (run, "run", "loading (runner.run)"),
            (embedded.EmbeddedTarget, "load_batch", "  a batch loaded (summed)"),
            (committer.Committer, "commit", "  a batch committed (summed)")]:
        _timed(owner, name, label, calls)
    with tempfile.TemporaryDirectory(prefix="chload-phases-") as work, \
            open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            chload(["load", f"{root}/f/**/*.csv", "--table", "t", "--target",
                    f"{work}/t", "--json"])
        finally:
            sys.stdout = stdout
    total = time.monotonic() - STARTED
    print(f"# first load of {root}/f/**/*.csv: {total:.2f} s wall, "
          f"{time.process_time():.2f} s CPU, load average {os.getloadavg()[0]:.1f}")
    for label, (began, ended, wall, n) in calls.items():
        print(f"{label:<42} x{n:<4} {began:7.2f} -> {ended:7.2f} s  wall {wall:7.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"wall": total, "cpu": time.process_time(), "load": os.getloadavg()[0],
             "phases": {k: dict(zip(["start", "end", "wall", "calls"], v, strict=True))
                        for k, v in calls.items()}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
