#!/usr/bin/env python3
"""Bounded memory: the loader's peak RSS loading one big Parquet file and one big gzip
CSV file (the bar: a 2 GB Parquet file and a 5 GB gzip CSV under 1 GB of loader
RSS), into the embedded engine and into an 18.16 server.

    python3 bench/memory.py [--parquet-gb 2] [--csv-gb 5] [--target both] [--json OUT]
        [--only parquet|csv.gz] [--repeat N] [--vs CHECKOUT] [--variant LABEL:NAME=VALUE,...]

The files are generated once by the engine (cached under $CHLOAD_BENCH_CACHE/memory):
rows of an id, two numbers and a ~100-character random text, so they compress little and
their size on disk is close to the bytes the engine parses. Each load runs `chload load`
as a child process; its peak RSS is the kernel's (`wait4` ru_maxrss), and the server's is
its VmHWM, reset before each load (`/proc/PID/clear_refs` 5). The rows loaded are
checked. Alone it is a measurement, not a race: it prints the figures and whether each
is under the bound. A setting that bounds memory must not cost speed, so it can also
A/B: `--vs CHECKOUT` (another chload, e.g. /work/main) and `--variant LABEL:NAME=VALUE,...`
(this chload with `--setting`s) run alternately on the same files, `--repeat` times, and
each line gives wall and CPU seconds (the child's user + system) as ratios to the first.
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
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "services"))
sys.path.insert(0, str(ROOT / "bench"))

from common import CACHE, compile_chload  # noqa: E402

SCHEMA = "id UInt64, amount UInt32, score Float64, note String"
BOUND_MIB = 1024
_SELECT = ("SELECT number AS id, toUInt32(cityHash64(number) % 100000) AS amount, "
           "(cityHash64(number, 1) % 1000000) / 1000 AS score, "
           "randomPrintableASCII(70 + cityHash64(number, 2) % 60) AS note FROM numbers({rows})")
_FORMATS = {"parquet": ("Parquet", "none"), "csv.gz": ("CSVWithNames", "gzip")}


def ensure_file(ext: str, gigabytes: float) -> tuple[str, int]:
    """One file of about `gigabytes` GB (path, rows), generated once."""
    fmt, compression = _FORMATS[ext]
    directory = Path(CACHE) / "memory"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"big-{gigabytes:g}gb.{ext}"
    rows_file = path.with_suffix(path.suffix + ".rows")
    if path.exists() and rows_file.exists():
        return str(path), int(rows_file.read_text())
    sample = directory / f"sample.{ext}"
    _write(sample, fmt, compression, 200_000)
    rows = int(gigabytes * 1e9 / (sample.stat().st_size / 200_000))
    sample.unlink()
    started = time.monotonic()
    _write(path, fmt, compression, rows)
    rows_file.write_text(str(rows))
    print(f"generated {path.name}: {rows:,} rows, {path.stat().st_size / 1e9:.2f} GB in "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    return str(path), rows


def _write(path: Path, fmt: str, compression: str, rows: int) -> None:
    """In a child process: a parent holding chDB's ~400 MB would lend every later child
    that RSS between fork and exec, and wait4's peak would count it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    sql = (f"INSERT INTO FUNCTION file('{tmp}', '{fmt}', '{SCHEMA}', '{compression}') "
           f"{_SELECT.format(rows=rows)} SETTINGS output_format_parquet_compression_method"
           " = 'zstd'")
    subprocess.run([sys.executable, "-c", "import chdb, sys; chdb.query(sys.argv[1])", sql],
                   check=True)
    os.replace(tmp, path)


class Variant(NamedTuple):
    """One chload measured: its checkout and the `--setting`s it loads with."""

    label: str
    root: str
    settings: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": self.root}


def parse_variant(text: str) -> Variant:
    """`LABEL:NAME=VALUE,NAME=VALUE` (this checkout with those settings)."""
    label, _, pairs = text.partition(":")
    settings = tuple(p for p in pairs.split(",") if p)
    if not label or any("=" not in p for p in settings):
        raise argparse.ArgumentTypeError(f"--variant {text}: expected LABEL:NAME=VALUE,...")
    return Variant(label, str(ROOT), settings)


def peak_rss_of(argv: list[str], env: dict[str, str]) -> tuple[int, float, float, int, str]:
    """Run `argv`; (exit code, seconds, CPU seconds, peak RSS in MiB, last line of stderr)."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return (proc.returncode, time.monotonic() - started, usage.ru_utime + usage.ru_stime,
            usage.ru_maxrss // 1024, lines[-1] if lines else "")


def server_peak_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return 0


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := current RSS (Linux 4.0+)


def load_one(path: str, rows: int, target: str, variant: Variant,
             count: Callable[[str], int], server_pid: int | None) -> dict:
    table = "m_" + os.urandom(4).hex()
    argv = [sys.executable, "-m", "chload", "load", path, "--table", table, "--target",
            target, "--schema", SCHEMA, "--order-by", "id", "--quiet"]
    for setting in variant.settings:
        argv += ["--setting", setting]
    if server_pid:
        reset_peak(server_pid)
    code, seconds, cpu, rss, last = peak_rss_of(argv, variant.env())
    loaded = count(table) if code == 0 else 0
    result = {"variant": variant.label, "settings": list(variant.settings),
              "file": os.path.basename(path), "gigabytes": round(os.path.getsize(path) / 1e9, 2),
              "rows": rows, "rows_loaded": loaded, "exit": code, "seconds": round(seconds, 2),
              "cpu_seconds": round(cpu, 2), "loader_peak_rss_mib": rss,
              "under_bound": rss < BOUND_MIB and loaded == rows}
    if server_pid:
        result["server_peak_rss_mib"] = server_peak_mib(server_pid)
    if code:
        result["error"] = last
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parquet-gb", type=float, default=2.0)
    parser.add_argument("--csv-gb", type=float, default=5.0)
    parser.add_argument("--target", choices=["embedded", "server", "both"], default="both")
    parser.add_argument("--only", choices=list(_FORMATS), help="only this one file")
    parser.add_argument("--repeat", type=int, default=1, help="loads of each file per variant")
    parser.add_argument("--vs", metavar="CHECKOUT", action="append", default=[],
                        help="also another chload checkout (repeatable)")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                        metavar="LABEL:NAME=VALUE,...", help="also this chload with settings")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    sizes = {"parquet": args.parquet_gb, "csv.gz": args.csv_gb}
    files = [ensure_file(ext, gb) for ext, gb in sizes.items() if args.only in (None, ext)]
    variants = [Variant("this", str(ROOT))] + args.variant
    variants += [Variant(os.path.basename(os.path.abspath(vs)), os.path.abspath(vs))
                 for vs in args.vs]
    for variant in variants:
        compile_chload(os.path.join(variant.root, "chload"))
    results = []
    with tempfile.TemporaryDirectory(prefix="chload-memory-") as work:
        if args.target in ("embedded", "both"):
            results += _embedded(files, work, variants, args.repeat)
        if args.target in ("server", "both"):
            results += _server(files, work, variants, args.repeat)
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["under_bound"] for r in results) else 1


def report(results: list[dict]) -> None:
    """One line a load; with several variants, each's median wall and CPU seconds per
    target and file as a ratio to the first variant's (above 1: slower)."""
    for r in results:
        server = f", server {r['server_peak_rss_mib']} MiB" if "server_peak_rss_mib" in r \
            else ""
        print(f"{r['target']:8} {r['variant']:10} {r['file']:22} {r['gigabytes']:5.2f} GB "
              f"{r['rows']:>11,} rows {r['seconds']:7.1f} s {r['cpu_seconds']:7.1f} s CPU  "
              f"peak RSS {r['loader_peak_rss_mib']:5} MiB{server}"
              f"  {'under' if r['under_bound'] else 'NOT under'} {BOUND_MIB} MiB"
              + (f"  ({r['error']})" if r.get("error") else ""))
    cells: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for r in results:
        cells.setdefault((r["target"], r["file"]), {}).setdefault(r["variant"], []).append(r)
    for (target, file), by_variant in cells.items():
        if len(by_variant) < 2:
            continue
        base = _medians(next(iter(by_variant.values())))
        for label, runs in by_variant.items():
            wall, cpu, rss = _medians(runs)
            print(f"median {target:8} {file:22} {label:10} wall {wall:6.1f} s "
                  f"({wall / base[0]:.2f}x)  CPU {cpu:6.1f} s ({cpu / base[1]:.2f}x)  "
                  f"peak RSS {rss:5.0f} MiB")


def _medians(runs: list[dict]) -> tuple[float, float, float]:
    return (statistics.median(r["seconds"] for r in runs),
            statistics.median(r["cpu_seconds"] for r in runs),
            statistics.median(r["loader_peak_rss_mib"] for r in runs))


def _embedded(files: list[tuple[str, int]], work: str, variants: list[Variant],
              repeat: int) -> list[dict]:
    out = []
    for path, rows in files:
        for _ in range(repeat):
            for variant in variants:  # alternating, so a slow minute hits every variant
                target = os.path.join(work, "embedded-" + os.urandom(3).hex())

                def count(table: str, target: str = target, v: Variant = variant) -> int:
                    done = subprocess.run(
                        [sys.executable, "-m", "chload", "sql", f"SELECT count() FROM {table}",
                         "--target", target, "--format", "TSV"],
                        env=v.env(), capture_output=True, text=True)
                    return int(done.stdout.strip() or 0)

                out.append({"target": "embedded",
                            **load_one(path, rows, target, variant, count, None)})
                subprocess.run(["rm", "-rf", target])
    return out


def _server(files: list[tuple[str, int]], work: str, variants: list[Variant],
            repeat: int) -> list[dict]:
    import services

    server = services.start_clickhouse_server(Path(work) / "server")
    try:
        url = f"http://127.0.0.1:{server.ports['http']}/default"

        def count(table: str) -> int:
            got = services.clickhouse_query(server, f"SELECT count() FROM {table}").strip()
            services.clickhouse_query(server, f"DROP TABLE {table}")  # the disk, for the next
            return int(got)

        out = []
        for path, rows in files:
            for _ in range(repeat):
                for variant in variants:
                    out.append({"target": "server",
                                **load_one(path, rows, url, variant, count, server.pid)})
        return out
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
