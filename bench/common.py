"""Shared pieces of the benchmarks: deterministic datasets made by the engine, timing
of whole processes, interleaved repeats, and ratios against a baseline of the same run.

These machines are noisy (2 shared cores), so every figure is a ratio against a
baseline measured in the same run, alternating methods so that noise hits both.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

TRIPS_SCHEMA = "id UInt64, miles UInt32, duration UInt32, vehicle_id UInt8"
CACHE = os.environ.get("CHLOAD_BENCH_CACHE", os.path.expanduser("~/.cache/chload/bench"))


def trips_select(first_id: int, rows: int) -> str:
    """The trips rows [first_id, first_id + rows): miles from a fixed list, duration 6x."""
    return (
        f"SELECT {first_id} + number AS id, "
        "[1, 5, 10, 25, 50, 75, 100, 125, 150, 175][(cityHash64(id) % 10) + 1] AS miles, "
        "miles * 6 AS duration, toUInt8(cityHash64(id, 1) % 256) AS vehicle_id "
        f"FROM numbers({rows})"
    )


def make_trips(directory: str, files: int, rows_per_file: int, fmt: str = "CSVWithNames",
               ext: str = "csv.gz") -> list[str]:
    """Write the trips dataset (cached: skipped when the files exist) with chDB."""
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"trips_{i:03d}.{ext}") for i in range(files)]
    missing = [(i, p) for i, p in enumerate(paths) if not os.path.exists(p)]
    if missing:
        import chdb

        for i, path in missing:
            tmp = path + ".tmp"
            chdb.query(f"INSERT INTO FUNCTION file('{tmp}', '{fmt}', '{TRIPS_SCHEMA}', "
                       f"'{_compression(ext)}') {trips_select(i * rows_per_file, rows_per_file)}")
            os.replace(tmp, path)
    return paths


def _compression(ext: str) -> str:
    return {"gz": "gzip", "zst": "zstd"}.get(ext.rsplit(".", 1)[-1], "none")


@dataclass
class Timing:
    method: str
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def compile_chload(package: str = os.path.join(os.path.dirname(__file__), "..", "chload"),
                   ) -> None:
    """Byte-compile the chload package measured, as `pip install` does (untimed).

    An editable install or a copied package has no bytecode, and where
    PYTHONDONTWRITEBYTECODE is set (this workplace sets it) Python never writes any:
    every timed chload process would compile its modules again (60-90 ms here)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], check=True)


def time_process(argv: Sequence[str], env: dict[str, str] | None = None,
                 before: Callable[[], None] | None = None) -> float:
    """Wall time of one whole process (start-up included), which must succeed."""
    if before:
        before()
    started = time.perf_counter()
    done = subprocess.run(argv, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=900)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"benchmark step failed: {' '.join(argv)}\n{done.stderr[-2000:]}")
    return seconds


def rows_span(stdout: str) -> float | None:
    """From `chload load --json`'s report: the span in which the run's rows moved (its
    first data byte to the end of its last data request, LoadReport.costs `data_s`);
    None where the chload measured does not report it. A run's time beyond it is its
    fixed cost (start, commit tail): what separates it from a method of no bookkeeping."""
    lines = [line for line in stdout.strip().splitlines() if line.startswith("{")]
    try:
        span = (json.loads(lines[-1]).get("costs") or {}).get("data_s") if lines else None
    except ValueError:
        return None
    return float(span) if isinstance(span, (int, float)) else None


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def interleave(methods: dict[str, Callable[[], float]], repeats: int,
               warmup: int = 1) -> dict[str, Timing]:
    """Run each method `repeats` times, alternating, after `warmup` unmeasured rounds."""
    timings = {name: Timing(name) for name in methods}
    for round_ in range(warmup + repeats):
        order = list(methods.items())
        if round_ % 2:
            order.reverse()  # alternate who goes first
        for name, fn in order:
            seconds = fn()
            if round_ >= warmup:
                timings[name].seconds.append(seconds)
    return timings


class CpuTimer:
    """Times whole processes with `time_process` and keeps each one's CPU seconds (user +
    system) aside per method: on a shared machine CPU seconds move less with other
    people's load than wall seconds do."""

    def __init__(self, before: Callable[[], None] | None = None) -> None:
        self.before = before
        self.cpu: dict[str, list[float]] = {}

    def timed(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> float:
        start = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds = time_process(argv, env, before=self.before)
        end = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu.setdefault(name, []).append(end.ru_utime + end.ru_stime
                                             - start.ru_utime - start.ru_stime)
        return seconds

    def add_ratios(self, result: dict, baseline: str, repeats: int) -> None:
        """Print the median CPU seconds of the measured rounds (the last `repeats`) and
        the ratio to `baseline`'s, and add both to `result` from `print_ratios`."""
        base = statistics.median(self.cpu[baseline][-repeats:])
        print(f"{'CPU seconds (user+sys), median':<40} {'':>9} {'ratio':>7}")
        for name, values in self.cpu.items():
            median = statistics.median(values[-repeats:])
            print(f"{name:<40} {median:>9.3f} {median / base:>7.3f}")
            result["methods"][name]["median_cpu_seconds"] = median
            result["methods"][name]["cpu_ratio_vs_baseline"] = median / base


def print_ratios(title: str, timings: dict[str, Timing], baseline: str,
                 out: str | None = None) -> dict:
    """Print median seconds and ratio (method / baseline) per method; return as dict."""
    base = timings[baseline].median
    result = {"benchmark": title, "baseline": baseline, "methods": {}}
    print(f"# {title}")
    print(f"{'method':<40} {'median s':>9} {'ratio':>7}  runs")
    for name, t in timings.items():
        ratio = t.median / base
        runs = " ".join(f"{s:.2f}" for s in t.seconds)
        print(f"{name:<40} {t.median:>9.3f} {ratio:>7.3f}  {runs}")
        result["methods"][name] = {"median_seconds": t.median, "ratio_vs_baseline": ratio,
                                   "runs": t.seconds}
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=2)
    return result


def query(url: str, sql: str, timeout: float = 120) -> str:
    """One statement to a ClickHouse server over HTTP (POST), its answer as text."""
    request = urllib.request.Request(f"{url}/?{urllib.parse.urlencode({'query': sql})}",
                                     data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()
