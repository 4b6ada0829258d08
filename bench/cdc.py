"""Change capture from PostgreSQL: changes applied per second by `chload load` of a
followed table against the decode rate of the same changes read with nothing else to do
(`pg_recvlogical` of a wal2json slot to /dev/null).

Same run, same changes: a table is followed into an embedded target (copy, then a first
unit), a second slot (the baseline's) is made beside the follow's, then each round writes
--changes changes (updates, inserts and deletes in transactions of 1,000) and times
- `pg_recvlogical --start --endpos <now> -f /dev/null` on the baseline slot, with the
  options chload gives wal2json (format 2, this table, each change's LSN);
- `chload load <table> --table T` (no --follow: every change up to now, then exit): a
  whole process, Python start, chDB import and the commit counted.
The rows changed are counted from the source (every change is one row of the unit).

    python bench/cdc.py [--rows 100000] [--changes 200000] [--repeats 3]
                        [--readers native|python|both] [--converts engine|psql|both]
                        [--json OUT] [--profile OUT]

Prints per round both rates and their ratio (chload / pg_recvlogical: 1.0 is as fast as
decoding alone), and the medians. --readers picks the replication stream's reader (the C
one, or the Python loop: CHLOAD_PG_STREAM_READER=python); `both` makes each repeat two
rounds, one a reader, their order alternated, and prints a median per reader. --converts
likewise picks how a unit's rows are made: by the engine from the spooled JSON where the
table's types allow (the default), or through psql (CHLOAD_PG_CONVERT=psql).

Lag under a steady rate (`--rate N`): --writers connections (1) commit N changes a
second between them for --seconds (transactions of 10: 7 updates, 2 inserts, 1 delete;
one round trip each, which also asks `pg_current_wal_lsn()` after the commit) while
`chload load ... --follow` runs into --target server (a ClickHouse 18.16 server,
scripts/services) or embedded. A
transaction's lag is the time of the ledger's `loaded` event of the first unit whose end
is at or past that position, minus the time its commit answered (an upper bound: the
position is read after the commit). Prints p50/p99/max and the load average.

    python bench/cdc.py --rate 5000 --seconds 60 [--writers 2] [--target server|embedded]
                        [--checkout DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "services"))
sys.path.insert(0, str(ROOT / "bench"))

import services  # noqa: E402

PG_BIN = Path("/usr/lib/postgresql/15/bin")
CREATE = """CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), at timestamptz,
    note text, n int NOT NULL);
INSERT INTO orders SELECT g, g * 0.25, now(), 'note ' || g, g % 10
    FROM generate_series(1, {rows}) g"""
# one round's changes: `count` of them, a transaction per 1,000 (an update of 800 rows,
# 150 inserts, 50 deletes), by a PL/pgSQL loop at the source
CHANGES = """DO $$ DECLARE base bigint := {base}; BEGIN
FOR i IN 0 .. {batches} - 1 LOOP
  UPDATE orders SET amount = amount + 1, n = n + 1 WHERE id > (base + i * 800) % {rows}
      AND id <= (base + i * 800) % {rows} + 800;
  INSERT INTO orders SELECT g, 1, now(), 'new', 0
      FROM generate_series({top} + i * 150 + 1, {top} + (i + 1) * 150) g;
  DELETE FROM orders WHERE id > {top} + i * 150 AND id <= {top} + i * 150 + 50;
  COMMIT;
END LOOP; END $$"""


def _chload(url: str, target: str, env: dict[str, str], *args: str,
            profile: str = "") -> tuple[float, int, int]:
    """Seconds of a whole `chload load` process, the rows (changes) it applied and the
    units it loaded them in;
    `profile`: py-spy's record of it (native frames, every thread, idle too) to that file."""
    spy = ["py-spy", "record", "-r", "100", "--native", "--idle", "--threads", "-f", "raw", "-o",
           profile, "--"] if profile else []
    start = time.monotonic()
    done = subprocess.run([*spy, sys.executable, "-m", "chload", "load", url, "--table",
                           "orders", "--target", target, "--json", *args],
                          capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        raise SystemExit(f"chload failed: {done.stderr}")
    report = json.loads([x for x in done.stdout.splitlines() if x.startswith("{")][-1])
    return (time.monotonic() - start, int(report.get("rows_loaded", 0)),
            int(report.get("files_loaded", 0)))


def _recvlogical(server: services.Service, slot: str, endpos: str) -> float:
    argv = [str(PG_BIN / "pg_recvlogical"), "-h", "127.0.0.1", "-p", str(server.ports["pg"]),
            "-U", "loader", "-d", "shop", "-S", slot, "--start", "-f", "/dev/null",
            "-E", endpos, "--no-loop", "-o", "format-version=2", "-o", "include-lsn=1",
            "-o", "include-transaction=0", "-o", "add-tables=public.orders"]
    env = {**os.environ, "PGPASSWORD": server.credentials["password"]}
    start = time.monotonic()
    subprocess.run(argv, check=True, env=env, timeout=1800, capture_output=True)
    return time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, help="changes a second: the lag under a steady rate")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--target", choices=("server", "embedded"), default="server")
    ap.add_argument("--follow-args", default="", help="extra chload flags (--rate mode)")
    ap.add_argument("--writers", type=int, default=1, help="--rate mode: writer connections")
    ap.add_argument("--checkout", default=str(ROOT),
                    help="the chload checkout whose code follows (--rate mode; a baseline)")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--readers", choices=("native", "python", "both"), default="native")
    ap.add_argument("--converts", choices=("engine", "psql", "both"), default="engine")
    ap.add_argument("--json")
    ap.add_argument("--profile", help="a py-spy record of each chload round: OUT-<round>.txt")
    args = ap.parse_args()
    if args.rate:
        from cdc_lag import steady

        steady(args)
        return
    base = Path(tempfile.mkdtemp(prefix="bench-cdc-"))
    server = services.start_postgres(base)
    try:
        sql = lambda text: services.postgres_sql(server, text)  # noqa: E731
        url = f"postgresql://loader@{server.endpoint}/shop/public.orders"
        env = {**os.environ, "PGPASSWORD": server.credentials["password"],
               "PYTHONPATH": str(ROOT)}
        target = str(base / "target")
        sql(CREATE.format(rows=args.rows))
        follow = subprocess.Popen([sys.executable, "-m", "chload", "load", url, "--table",
                                   "orders", "--target", target, "--follow"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(8)  # the copy, then a round
        follow.send_signal(signal.SIGTERM)
        follow.wait(timeout=120)
        _chload(url, target, env)  # the follow's first unit of changes
        sql("SELECT pg_create_logical_replication_slot('bench_base', 'wal2json')")
        rounds, top = [], args.rows
        batches = max(1, args.changes // 1000)
        readers = ["native", "python"] if args.readers == "both" else [args.readers]
        converts = ["engine", "psql"] if args.converts == "both" else [args.converts]
        pair = [f"{r}/{c}" for r in readers for c in converts]
        schedule = [pair[::1 - 2 * (r % 2)] for r in range(args.repeats)]
        for r, variant in enumerate(name for names in schedule for name in names):
            reader, convert = variant.split("/")
            sql(CHANGES.format(base=(r * batches * 800) % max(1, args.rows), batches=batches,
                               rows=args.rows, top=top))
            top += batches * 150
            endpos = sql("SELECT pg_current_wal_lsn()").strip()
            decode = _recvlogical(server, "bench_base", endpos)
            load_before = os.getloadavg()
            chosen = {**env, "CHLOAD_PG_STREAM_READER": reader, "CHLOAD_PG_CONVERT": convert}
            spied = f"{args.profile}-{r + 1}.txt" if args.profile else ""
            applied, changes, units = _chload(url, target, chosen, profile=spied)
            rounds.append({"changes": changes, "recvlogical_s": decode, "chload_s": applied,
                           "ratio": decode / applied, "reader": variant, "units": units,
                           "load_average_before": load_before,
                           "load_average": os.getloadavg()})
            print(f"round {r + 1} ({reader} reader, {convert} rows): {changes:,} changes; "
                  f"pg_recvlogical {changes / decode:,.0f}/s ({decode:.2f} s), chload "
                  f"{changes / applied:,.0f}/s ({applied:.2f} s, {units} units), ratio "
                  f"{decode / applied:.2f}x, load {load_before[0]:.2f}-"
                  f"{os.getloadavg()[0]:.2f}", flush=True)
        for reader in sorted({r["reader"] for r in rounds}):
            median = statistics.median(r["ratio"] for r in rounds if r["reader"] == reader)
            print(f"median ratio chload ({reader}) / pg_recvlogical: {median:.2f}x")
        ratio = statistics.median(r["ratio"] for r in rounds)
        if args.json:
            Path(args.json).write_text(json.dumps({
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": rounds,
                "ratio": ratio}))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
