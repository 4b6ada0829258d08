"""chload into the embedded engine vs the hand-written chDB INSERT ... SELECT FROM file().

The bar: `chload load` on 20 gzip CSV files (20M trips rows), as a whole process,
takes at most 1.10x the time of a process that runs

    INSERT INTO trips SELECT * FROM file('dir/*.csv.gz', CSVWithNames, '<schema>')

in chDB into an equivalent MergeTree table, measured in the same run.

    python bench/embedded_local.py [--files 20] [--rows 1000000] [--repeats 3] [--json OUT]

Prints median seconds and the ratio chload/baseline per method (lower is better).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    CACHE,
    TRIPS_SCHEMA,
    compile_chload,
    interleave,
    make_trips,
    print_ratios,
    time_process,
)

BASELINE = r"""
import sys, chdb.session
s = chdb.session.Session(sys.argv[1])
s.query("CREATE TABLE trips ({schema}) ENGINE = MergeTree ORDER BY id")
s.query("INSERT INTO trips SELECT * FROM file('{glob}', CSVWithNames, '{schema}')")
s.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    data = os.path.join(CACHE, f"trips-csvgz-{args.files}x{args.rows}")
    make_trips(data, args.files, args.rows)
    glob = os.path.join(data, "*.csv.gz")
    compile_chload()
    work = tempfile.mkdtemp(prefix="chload-bench-")
    db = os.path.join(work, "db")
    fresh = lambda: shutil.rmtree(db, ignore_errors=True)  # noqa: E731
    chload = [sys.executable, "-m", "chload", "load", glob, "--table", "trips",
              "--target", db, "--quiet"]
    baseline = [sys.executable, "-c", BASELINE.format(glob=glob, schema=TRIPS_SCHEMA), db]
    methods = {
        "hand-written INSERT ... FROM file(glob)": lambda: time_process(baseline, before=fresh),
        "chload load (inferred schema)": lambda: time_process(chload, before=fresh),
        "chload load --schema (same types)": lambda: time_process(
            chload + ["--schema", TRIPS_SCHEMA], before=fresh),
    }
    try:
        timings = interleave(methods, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"data: {args.files} gzip CSV files x {args.rows:,} rows, target: embedded chDB")
    print_ratios("embedded target, local gzip CSV", timings,
                 "hand-written INSERT ... FROM file(glob)", args.json)


if __name__ == "__main__":
    main()
