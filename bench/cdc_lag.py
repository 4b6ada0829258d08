"""bench/cdc.py --rate: the lag of `chload load ... --follow` of a PostgreSQL table under a
steady rate of changes (see bench/cdc.py's docstring for what is measured and how)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "services"))

import services  # noqa: E402

ROWS = 20_000
SERVER_SCHEMA = ("id Int64, amount Nullable(Decimal(12, 2)), at Nullable(String), "
                 "note Nullable(String), n Int32, seq Int64")
PER_TXN = 10  # 7 updates, 2 inserts, 1 delete
CREATE = f"""CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), at timestamptz,
    note text, n int NOT NULL, seq bigint NOT NULL DEFAULT 0);
INSERT INTO orders SELECT g, g * 0.25, now(), 'note ' || g, g % 10, 0
    FROM generate_series(1, {ROWS}) g"""


def _txn(i: int, writers: int = 1) -> str:
    """Transaction `i`: 7 updates, 2 inserts, 1 delete (of a row transaction i - writers,
    of the same writer, inserted), each row it writes carrying `seq` i; then the WAL
    position."""
    low = (i * 7) % (ROWS - 7)
    top = ROWS + 2 * i
    gone = ROWS + 2 * (i - writers) + 2
    return (f"BEGIN; UPDATE orders SET amount = amount + 1, n = n + 1, seq = {i} WHERE id > "
            f"{low} AND id <= {low + 7}; INSERT INTO orders VALUES ({top + 1}, 1, now(), 'new',"
            f" 0, {i}), ({top + 2}, 2, now(), 'new', 0, {i}); DELETE FROM orders WHERE id = "
            f"{gone}; COMMIT; SELECT pg_current_wal_lsn()::text")


def _lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


class Writer(threading.Thread):
    """Commits transactions at `rate` changes a second for `seconds`; per transaction the
    time (ns) its commit answered and the WAL position after it."""

    def __init__(self, dsn: str, rate: int, seconds: float, first: int = 0,
                 writers: int = 1) -> None:
        super().__init__(daemon=True)
        self.dsn, self.every, self.seconds = dsn, PER_TXN * writers / rate, seconds
        self.first, self.writers = first, writers
        self.done: list[tuple[int, int]] = []
        self.behind = 0.0  # the most the writer fell behind its schedule (s)

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            start = time.monotonic()
            i = 0
            while time.monotonic() - start < self.seconds:
                due = start + i * self.every
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                else:
                    self.behind = max(self.behind, now - due)
                cur = conn.execute(_txn(i * self.writers + self.first + 1,  # type: ignore[arg-type]
                                        self.writers))
                while cur.nextset():
                    pass
                row = cur.fetchone()
                self.done.append((time.time_ns(), _lsn(row[0])))
                i += 1


def _units(target: str, clickhouse: object | None) -> list[tuple[int, int]]:
    """(end position, time of its `loaded` event) of every unit of changes, by end."""
    sql = ("SELECT uri, seq FROM chload.files WHERE state = 'loaded' AND uri LIKE "
           "'pgchanges://%' ORDER BY seq FORMAT TSV")
    if clickhouse is not None:
        text = services.clickhouse_query(clickhouse, sql)  # type: ignore[arg-type]
    else:
        import chdb.session

        session = chdb.session.Session(target)
        text = str(session.query(sql.replace(" FORMAT TSV", ""), "TSV"))
        session.close()
    units = []
    for line in text.splitlines():
        if not line.strip():
            continue
        uri, seq = line.split("\t")
        units.append((int(uri.rpartition("-")[2]) + 1, int(seq)))
    return sorted(units)


def _lags(done: list[tuple[int, int]], units: list[tuple[int, int]]) -> tuple[list[float], int]:
    lags, u, missing = [], 0, 0
    for committed, lsn in done:  # (by position)
        while u < len(units) and units[u][0] < lsn:
            u += 1
        if u == len(units):
            missing += 1
            continue
        lags.append((units[u][1] - committed) / 1e9)
    return lags, missing


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def steady(args: argparse.Namespace) -> None:
    base = Path(tempfile.mkdtemp(prefix="bench-cdc-lag-"))
    server = services.start_postgres(base)
    clickhouse = services.start_clickhouse_server(base) if args.target == "server" else None
    follow = None
    loads: list[float] = []
    try:
        services.postgres_sql(server, CREATE)
        url = f"postgresql://loader@{server.endpoint}/shop/public.orders"
        target = clickhouse.url if clickhouse is not None else str(base / "target")
        env = {**os.environ, "PGPASSWORD": server.credentials["password"],
               "PYTHONPATH": args.checkout}
        argv = [sys.executable, "-m", "chload", "load", url, "--table", "orders", "--target",
                target, "--follow", "--json", *shlex.split(args.follow_args)]
        if clickhouse is not None:  # (18.16 has no DateTime64)
            argv += ["--schema", SERVER_SCHEMA]
        # (run in the checkout: `python -m` puts the working directory before PYTHONPATH,
        # so a bench started in another checkout ran that one's code)
        follow = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, cwd=args.checkout)
        time.sleep(10)  # the copy, then an idle round or two
        if follow.poll() is not None:
            raise SystemExit(f"the follow exited: {follow.stderr.read() if follow.stderr else ''}")
        dsn = (f"host=127.0.0.1 port={server.ports['pg']} dbname=shop user=loader "
               f"password={server.credentials['password']}")
        writers = [Writer(dsn, args.rate, args.seconds, w, args.writers)
                   for w in range(args.writers)]
        load_start = os.getloadavg()
        for writer in writers:
            writer.start()
        while any(w.is_alive() for w in writers):
            loads.append(os.getloadavg()[0])
            writers[0].join(timeout=1.0)
        wrote = time.monotonic()
        time.sleep(10)  # the follow catches up (a lag above this counts as not applied)
        follow.send_signal(signal.SIGTERM)
        code = follow.wait(timeout=300)
        if code:
            raise SystemExit(f"the follow exited {code}: {follow.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        follow = None
        units = _units(target, clickhouse)
        done = sorted((d for w in writers for d in w.done), key=lambda d: d[1])
        lags, missing = _lags(done, units)
        changes = len(done) * PER_TXN
        result = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "target": args.target, "rate": args.rate, "seconds": args.seconds,
            "follow_args": args.follow_args, "checkout": args.checkout, "changes": changes,
            "achieved_rate": round(changes / args.seconds),
            "writers": args.writers, "writer_behind_s": round(max(w.behind for w in writers), 3),
            "units": len(units),
            "not_applied_within_10s": missing,
            "lag_p50_s": round(statistics.median(lags), 3) if lags else None,
            "lag_p99_s": round(_pct(lags, 0.99), 3) if lags else None,
            "lag_max_s": round(max(lags), 3) if lags else None,
            "load_average_start": load_start,
            "load_average_during_max": max(loads, default=0.0),
            "load_average_during_mean": round(statistics.mean(loads), 2) if loads else None,
            "wrote_at": wrote,
        }
        result.pop("wrote_at")
        print(json.dumps(result, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        if follow is not None:
            follow.kill()
            follow.wait()
        if clickhouse is not None:
            clickhouse.stop()
        server.stop()
        shutil.rmtree(base, ignore_errors=True)  # (the servers' data: GBs a run)
