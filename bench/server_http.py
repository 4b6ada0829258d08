"""chload into a ClickHouse 18.16 server over HTTP vs the two classic hand-made loads.

The bar, same run, same data, same server (10M trips rows in 10 gzip CSV files
with a header):

- chload's wall time at least 0.95x as fast as the best hand-made method: POSTing the
  gzip files with `Content-Encoding: gzip`, two at a time (`xargs -P2 curl`);
- at least 1.5x as fast as `for f in *.gz; do gunzip -c $f | clickhouse-client
  --query 'INSERT ... FORMAT CSVWithNames'; done`;
- and rows/s of chload for Parquet (which 18.16 cannot parse: chDB converts and pushes
  Native) and for gzip JSON lines (the server parses them itself).

Every method is a whole process (start-up counts, as for users) and writes a fresh
table, created (untimed) with the same schema before every method but the last chload
variant, which creates its own from the inferred schema (timed; chDB infers Int64 for
every integer column, so that table is wider and slower to write: its twin baseline
POSTs into a table of those Int64 columns). Methods alternate (see common.interleave).

    python bench/server_http.py [--files 10] [--rows 1000000] [--repeats 9] [--json OUT]
                                [--url http://127.0.0.1:8123]   # else a server of its own

Prints median seconds and ratios; "speed x" is baseline time / method time (higher is
faster), the figure the bar is stated in, twice: as the ratio of the medians, and as
the median of the per-round ratios (a round runs every method once, back to back, so a
slow minute on a shared machine weighs on both sides of its ratio). chload runs three
ways: plain `chload load` into the table (the files' header names its columns), told
`--format` and `--schema` as the hand-made methods are, and creating the table (chDB
infers the columns). After each plain `chload load`, the same command runs again
(untimed in the ratios; every file is skipped): its time is chload's fixed cost
(interpreter start, imports, probing, reading the ledger), printed beside the load's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                                "services"))
from common import (
    CACHE,
    TRIPS_SCHEMA,
    compile_chload,
    interleave,
    make_trips,
    print_ratios,
    query,
    time_process,
)

POST = "POST gzip files, 2 at a time (curl)"
POST_WIDE = "POST, into the Int64 table (curl)"
CLIENT = "gunzip | clickhouse-client loop"
CHLOAD = "chload load (same table)"
CHLOAD_SPEC = "chload load --format --schema (same table)"
CHLOAD_NEW = "chload load (creates table: Int64 inferred)"
DB = "bench_http"
# The table `chload load` creates from these files: chDB infers Int64 for integers.
WIDE_SCHEMA = "id Int64, miles Int64, duration Int64, vehicle_id Int64"



class Tables:
    """A fresh table name per run, the previous one dropped (disk stays small)."""

    def __init__(self, url: str) -> None:
        self.url, self.n, self.current = url, 0, ""
        query(url, f"CREATE DATABASE IF NOT EXISTS {DB}")

    def fresh(self, create: bool, schema: str = TRIPS_SCHEMA) -> None:
        if self.current:
            query(self.url, f"DROP TABLE IF EXISTS {DB}.{self.current}")
        self.n += 1
        self.current = f"t{os.getpid()}_{self.n}"
        if create:
            query(self.url, f"CREATE TABLE {DB}.{self.current} ({schema}) "
                            "ENGINE = MergeTree ORDER BY id")

    def columns(self) -> str:
        return ", ".join(" ".join(line.split("\t")[:2]) for line in query(
            self.url, f"DESCRIBE TABLE {DB}.{self.current}").splitlines())

    def count(self) -> int:
        return int(query(self.url, f"SELECT count() FROM {DB}.{self.current}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per file")
    parser.add_argument("--repeats", type=int, default=9,
                        help="measured rounds (after one warm-up); this machine swings ±10%%")
    parser.add_argument("--url", help="an existing server (user default, no password)")
    parser.add_argument("--tcp-port", type=int, default=9000, help="its native port")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    base = os.path.join(CACHE, f"trips-%s-{args.files}x{args.rows}")
    csv = make_trips(base % "csvgz", args.files, args.rows)
    parquet = make_trips(base % "parquet", args.files, args.rows, "Parquet", "parquet")
    jsonl = make_trips(base % "jsonlgz", args.files, args.rows, "JSONEachRow", "jsonl.gz")
    compile_chload()
    work = tempfile.mkdtemp(prefix="chload-bench-http-")
    server = None
    try:
        url, tcp = args.url, args.tcp_port
        if not url:
            import services

            server = services.start_clickhouse_server(Path(work))
            url, tcp = server.url, server.ports["tcp"]
        run(args, url, tcp, csv, parquet, jsonl)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, url: str, tcp: int, csv: list[str], parquet: list[str],
        jsonl: list[str]) -> None:
    tables = Tables(url)
    total = args.files * args.rows
    target = f"{url}/{DB}"

    def chload(paths: list[str], *extra: str) -> list[str]:
        glob = os.path.join(os.path.dirname(paths[0]), "*" + paths[0].split("trips_000")[1])
        return [sys.executable, "-m", "chload", "load", glob, "--table",
                tables.current, "--target", target, "--quiet", *extra]

    def post() -> list[str]:
        insert = urllib.parse.quote_plus(f"INSERT INTO {DB}.{tables.current} FORMAT CSVWithNames")
        files = " ".join(shlex.quote(p) for p in csv)
        return ["sh", "-c", f"printf '%s\\n' {files} | xargs -P2 -I{{}} curl -sSf "
                f"-H 'Content-Encoding: gzip' --data-binary @{{}} '{url}/?query={insert}'"]

    def client() -> list[str]:
        files = " ".join(shlex.quote(p) for p in csv)
        insert = f"INSERT INTO {DB}.{tables.current} FORMAT CSVWithNames"
        return ["sh", "-c", f"set -e; for f in {files}; do gunzip -c \"$f\" | clickhouse-client "
                f"--port {tcp} --query '{insert}'; done"]

    def timed(build: object, create: bool, schema: str = TRIPS_SCHEMA) -> float:
        tables.fresh(create, schema)
        seconds = time_process(build())  # type: ignore[operator]
        if tables.count() != total:
            sys.exit(f"wrong row count in {tables.current}: {tables.count()} != {total}")
        if not create and tables.columns() != WIDE_SCHEMA:  # the baseline's table is its
            sys.exit(f"chload created ({tables.columns()}), not ({WIDE_SCHEMA}): "  # twin
                     "update WIDE_SCHEMA")
        return seconds

    again: list[float] = []  # the same chload load rerun: every file skipped

    def load_then_again() -> float:
        seconds = timed(lambda: chload(csv), True)
        again.append(time_process(chload(csv)))
        if tables.count() != total:
            sys.exit(f"a rerun changed {tables.current}: {tables.count()} != {total}")
        return seconds

    methods = {
        POST: lambda: timed(post, True),
        CLIENT: lambda: timed(client, True),
        CHLOAD: load_then_again,
        CHLOAD_SPEC: lambda: timed(lambda: chload(csv, "--format", "CSVWithNames", "--schema",
                                                  TRIPS_SCHEMA), True),
        POST_WIDE: lambda: timed(post, True, WIDE_SCHEMA),
        CHLOAD_NEW: lambda: timed(lambda: chload(csv), False),
    }
    timings = interleave(methods, args.repeats)
    formats = interleave({
        "chload Parquet (push: chDB -> Native)": lambda: timed(lambda: chload(parquet), True),
        "chload gzip JSON lines (raw)": lambda: timed(lambda: chload(jsonl), True),
    }, args.repeats, warmup=0)
    tables.fresh(False)
    print(f"data: {args.files} files x {args.rows:,} rows (trips: {TRIPS_SCHEMA}); "
          f"server: ClickHouse {query(url, 'SELECT version()').strip()} on 127.0.0.1")
    result = print_ratios("server target over HTTP, gzip CSV", {**timings, **formats}, POST,
                          None)
    speed = {}
    print("speed = baseline time / chload time (higher is faster): of the medians, and "
          "the median of the per-round ratios (each round runs every method once, "
          "back to back, so a slow minute on this shared machine hits both)")
    for name, post_base in ((CHLOAD, POST), (CHLOAD_SPEC, POST), (CHLOAD_NEW, POST_WIDE)):
        for base, key, bar in ((post_base, "post_2_at_a_time", 0.95),
                               (CLIENT, "clickhouse_client_loop", 1.5)):
            ratio = timings[base].median / timings[name].median
            rounds = sorted(b / c for b, c in zip(timings[base].seconds,
                                                  timings[name].seconds, strict=True))
            paired = statistics.median(rounds)
            speed[f"{name} vs {key}"] = ratio
            speed[f"{name} vs {key}, per round"] = paired
            verdict = "met" if min(ratio, paired) >= bar else (
                "not met" if max(ratio, paired) < bar else "met by one figure of two")
            print(f"speed of {name} vs {base}: {ratio:.2f}x, per round {paired:.2f}x "
                  f"({rounds[0]:.2f}-{rounds[-1]:.2f}); bar >= {bar}x: {verdict}")
    fixed = statistics.median(again[1:])  # (the first was the warm-up round's)
    speed["chload rerun seconds"] = fixed
    print(f"chload's fixed cost: the same load again, every file skipped (start-up, "
          f"probe, ledger): {fixed:.3f} s, beside {timings[CHLOAD].median:.3f} s for the "
          "load")
    rates = {name: total / t.median for name, t in {**timings, **formats}.items()}
    for name, rate in rates.items():
        print(f"rows/s {name:<40} {rate:>12,.0f}")
    if args.json:
        import json

        result.update(speed=speed, rows_per_second=rates)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
