"""The PostgreSQL replication stream's reader alone: the C reader (stream_reader.c, the
GIL released) against the Python loop (CHLOAD_PG_STREAM_READER=python), each draining a
slot of the same changes into spool segments, nothing else in the process.

Each repeat makes two wal2json slots at the same instant, writes --changes changes
(transactions of 1,000, as bench/cdc.py), then reads one slot with each reader (their
order alternated between repeats), a segment taken every 0.25 s (as a follow takes one
per unit), until a segment reaches the position after the last change; prints per
reader the wall time, the process's CPU time (this process only: the server's decoding
is another) and the changes per second, and the medians.

    python bench/cdc_stream.py [--rows 100000] [--changes 200000] [--repeats 3]
                               [--readers native|python|both] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "services"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import services  # noqa: E402
from cdc import CHANGES, CREATE  # noqa: E402

from chload.sources.changes.postgres import replication  # noqa: E402
from chload.sources.changes.postgres.slot import lsn_int  # noqa: E402
from chload.sources.databases.table import parse_url  # noqa: E402

TAKE_EVERY = 0.25  # s between takes (a unit's load meanwhile): not a seal per round trip


def _drain(url: str, slot: str, start: int, end: int, spool: Path, reader: str
           ) -> tuple[float, float, int, bool]:
    """(wall s, CPU s, changes, whether the C reader read them) of one slot read."""
    if reader == "python":
        os.environ["CHLOAD_PG_STREAM_READER"] = "python"
    else:
        os.environ.pop("CHLOAD_PG_STREAM_READER", None)
    spool.mkdir()
    wall, cpu = time.monotonic(), time.process_time()
    stream = replication.Stream(parse_url(url, None), slot, ("public", "orders"), start,
                                str(spool))
    changes, upto = 0, start
    try:
        while upto < end:
            segment = stream.take(5.0)
            if segment is not None:
                upto, changes = segment.upto, changes + segment.changes
                os.remove(segment.path)
                time.sleep(TAKE_EVERY)
    finally:
        native = stream.native is not None
        stream.close()
    return time.monotonic() - wall, time.process_time() - cpu, changes, native


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--readers", choices=("native", "python", "both"), default="both")
    ap.add_argument("--json")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-cdc-stream-"))
    server = services.start_postgres(base)
    try:
        sql = lambda text: services.postgres_sql(server, text)  # noqa: E731
        url = (f"postgresql://loader:{server.credentials['password']}@{server.endpoint}"
               "/shop/public.orders")
        sql(CREATE.format(rows=args.rows))
        batches, top, rounds = max(1, args.changes // 1000), args.rows, []
        for r in range(args.repeats):
            slots = {reader: f"bench_{reader}_{r}" for reader in ("native", "python")}
            for slot in slots.values():
                sql(f"SELECT pg_create_logical_replication_slot('{slot}', 'wal2json')")
            start = max(lsn_int(sql(f"SELECT confirmed_flush_lsn FROM pg_replication_slots "
                                    f"WHERE slot_name = '{slot}'").strip())
                        for slot in slots.values())
            sql(CHANGES.format(base=(r * batches * 800) % args.rows, batches=batches,
                               rows=args.rows, top=top))
            top += batches * 150
            end = lsn_int(sql("SELECT pg_current_wal_lsn()").strip())
            order = (["native", "python"] if r % 2 == 0 else ["python", "native"]) \
                if args.readers == "both" else [args.readers]
            for reader in order:
                load = os.getloadavg()[0]
                wall, cpu, changes, native = _drain(url, slots[reader], start, end,
                                                    base / f"spool-{reader}-{r}", reader)
                assert native == (reader == "native"), "the C reader could not be had"
                rounds.append({"reader": reader, "changes": changes, "wall_s": wall,
                               "cpu_s": cpu, "load_average": [load, os.getloadavg()[0]]})
                print(f"repeat {r + 1} {reader}: {changes:,} changes in {wall:.2f} s "
                      f"({changes / wall:,.0f}/s), CPU {cpu:.2f} s, load {load:.2f}-"
                      f"{os.getloadavg()[0]:.2f}", flush=True)
            for slot in slots.values():
                sql(f"SELECT pg_drop_replication_slot('{slot}')")
        for reader in sorted({r["reader"] for r in rounds}):
            mine = [r for r in rounds if r["reader"] == reader]
            rate = statistics.median(r["changes"] / r["wall_s"] for r in mine)
            print(f"median {reader}: {rate:,.0f} changes/s, CPU "
                  f"{statistics.median(r['cpu_s'] for r in mine):.2f} s")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": rounds}))
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
