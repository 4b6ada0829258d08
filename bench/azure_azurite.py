"""chload from Azure Blob Storage (a real Azurite) into the embedded engine vs the
hand-written chDB azureBlobStorage() INSERT.

`chload load 'az://bench/trips/*.csv.gz'` on 10 gzip CSV blobs (10M trips rows by
default), the account only in AZURE_STORAGE_CONNECTION_STRING, as a whole process, next
to a process that runs

    INSERT INTO trips SELECT * FROM azureBlobStorage('<connection string>', 'bench',
                                     'trips/*.csv.gz', 'CSVWithNames', 'auto', '<schema>')

in chDB into an equivalent MergeTree table, measured in the same run (interleaved).

    python bench/azure_azurite.py [--files 10] [--rows 1000000] [--repeats 3] [--json OUT]

Starts its own Azurite (scripts/services) on 127.0.0.1 and stops it by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "services"))
import services  # noqa: E402
from common import (  # noqa: E402
    CACHE,
    TRIPS_SCHEMA,
    CpuTimer,
    compile_chload,
    interleave,
    make_trips,
    print_ratios,
)

BASELINE = r"""
import sys, chdb.session
s = chdb.session.Session(sys.argv[1])
s.query("CREATE TABLE trips ({schema}) ENGINE = MergeTree ORDER BY id")
s.query("INSERT INTO trips SELECT * FROM azureBlobStorage('{conn}', '{container}', "
        "'trips/*.csv.gz', 'CSVWithNames', 'auto', '{schema}')")
s.close()
"""
CONTAINER = "bench"


def upload(azurite: services.Service, paths: list[str]) -> None:
    container = services.azure_create_container(azurite, CONTAINER)

    def put(path: str) -> None:
        with open(path, "rb") as fh:
            container.upload_blob(f"trips/{os.path.basename(path)}", fh,  # type: ignore[attr-defined]
                                  max_concurrency=4)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(put, paths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per blob")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    data = make_trips(os.path.join(CACHE, f"trips-csvgz-{args.files}x{args.rows}"),
                      args.files, args.rows)
    compile_chload()
    work = tempfile.mkdtemp(prefix="chload-bench-azure-")
    azurite = services.start_azurite(Path(work))
    try:
        upload(azurite, data)
        db = os.path.join(work, "db")
        fresh = lambda: shutil.rmtree(db, ignore_errors=True)  # noqa: E731
        conn = azurite.credentials["connection_string"]
        baseline = [sys.executable, "-c", BASELINE.format(
            conn=conn, container=CONTAINER, schema=TRIPS_SCHEMA), db]
        chload = [sys.executable, "-m", "chload", "load", f"az://{CONTAINER}/trips/*.csv.gz",
                  "--table", "trips", "--target", db, "--quiet"]
        env = {"AZURE_STORAGE_CONNECTION_STRING": conn}
        base = "hand-written INSERT ... azureBlobStorage()"
        cpu = CpuTimer(before=fresh)

        inferred, typed = "chload load az:// (inferred schema)", \
            "chload load az:// --schema (same types)"
        methods = {
            base: lambda: cpu.timed(base, baseline),
            inferred: lambda: cpu.timed(inferred, chload, env),
            typed: lambda: cpu.timed(typed, chload + ["--schema", TRIPS_SCHEMA], env),
        }
        timings = interleave(methods, args.repeats)
        print(f"data: {args.files} gzip CSV blobs x {args.rows:,} rows in Azurite "
              f"({azurite.url}), target: embedded chDB")
        result = print_ratios("embedded target, Azure (Azurite) gzip CSV", timings, base)
        cpu.add_ratios(result, base, args.repeats)
    finally:
        azurite.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
