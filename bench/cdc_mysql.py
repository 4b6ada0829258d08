"""MySQL change capture: changes per second applied by chload against the decode rate of
the same binlog read with nothing else to do, and the lag under a steady write rate.

    python3 bench/cdc_mysql.py [--changes 200000] [--rate 5000] [--lag-seconds 30]

Starts its own MariaDB 10.11 (ROW binlog) and ClickHouse 18.16 server (scripts/services),
copies a 10,000-row table into each target with --follow (stopped at once), then makes
`--changes` changes (inserts, updates, deletes in transactions of 100 rows) and measures,
in this run:
  bare        mysql-replication's reader over those changes, rows decoded, to /dev/null
  lines       the same, each row also written as chload's TSV line (mysql_binlog.line)
  embedded    chload load (no --follow: up to the position at its start) into chDB
  server      the same into the 18.16 server
and the lag: `--rate` changes a second for `--lag-seconds`, chload --follow into the
18.16 server, the newest source time seen in the table polled every 0.1 s (lag = poll
time - that row's write time; p50 and p99). Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "services"))
sys.path.insert(0, str(ROOT))

import services  # noqa: E402

PASSWORD = "bench-pw"
SEED = 10_000
TXN = 100


def connect(db: services.Service) -> Any:
    import pymysql

    host, port = db.endpoint.split(":")
    return pymysql.connect(host=host, port=int(port), user="loader", password=PASSWORD,
                           database="shop", autocommit=True)


def seed(db: services.Service, table: str) -> None:
    conn = connect(db)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, qty INT, price "
                    "DECIMAL(12,2), note VARCHAR(64), ts DATETIME(6))")
        cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, NOW(6))",
                        [(i, i % 7, "1.50", f"n{i}") for i in range(1, SEED + 1)])
    conn.close()


def changes(db: services.Service, table: str, count: int, rate: float | None = None,
            stop: threading.Event | None = None) -> int:
    """`count` changes (1/2 inserts, 3/10 updates, 1/5 deletes), TXN a transaction;
    at `rate` a second if given. Returns the changes made."""
    conn = connect(db)
    made, top, started = 0, 10 * SEED, time.monotonic()
    with conn.cursor() as cur:
        while made < count and not (stop and stop.is_set()):
            cur.execute("BEGIN")
            rows = [(top + i, i % 7, "2.50", f"x{i}") for i in range(TXN // 2)]
            cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, NOW(6))", rows)
            cur.execute(f"UPDATE {table} SET qty = qty + 1, ts = NOW(6) WHERE id BETWEEN %s "
                        "AND %s", (top, top + TXN * 3 // 10 - 1))
            cur.execute(f"DELETE FROM {table} WHERE id BETWEEN %s AND %s",
                        (top + TXN // 2 - TXN // 5, top + TXN // 2 - 1))
            cur.execute("COMMIT")
            top += TXN
            made += TXN
            if rate:
                time.sleep(max(0.0, started + made / rate - time.monotonic()))
    conn.close()
    return made


def chload(*args: str, env: dict[str, str], timeout: float = 1800) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "chload", "load", *args],
                          capture_output=True, text=True, env={**os.environ, **env},
                          timeout=timeout)
    if done.returncode:
        raise RuntimeError(done.stdout + done.stderr)
    return time.monotonic() - started


def follow_briefly(url: str, table: str, target: str, env: dict[str, str]) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "chload", "load", url, "--table", table,
                             "--target", target, "--follow"], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    if proc.returncode:
        raise RuntimeError(out + err)


def bare(db: services.Service, log: tuple[str, int], table: str, lines: bool) -> int:
    from pymysqlreplication import BinLogStreamReader, row_event as rev

    from chload.sources.changes.mysql_binlog import layout_of, line

    host, port = db.endpoint.split(":")
    stream = BinLogStreamReader({"host": host, "port": int(port), "user": "loader",
                                 "passwd": PASSWORD}, server_id=77, resume_stream=True,
                                log_file=log[0], log_pos=log[1], blocking=False,
                                enable_logging=False)
    layout = layout_of([("id", "bigint"), ("qty", "int"), ("price", "decimal(12,2)"),
                        ("note", "varchar(64)"), ("ts", "datetime(6)")], ["id"])
    rows = 0
    with open(os.devnull, "wb") as out:
        for e in stream:
            if isinstance(e, rev.RowsEvent) and e.table == table:
                for row in e.rows:
                    rows += 1
                    if lines:
                        values = row.get("after_values", row.get("values"))
                        out.write(line(values, layout, 1, 0))
    stream.close()
    return rows


def lag(db: services.Service, server: services.Service, url: str, table: str,
        env: dict[str, str], rate: float, seconds: float) -> dict[str, float]:
    target = f"http://loader@127.0.0.1:{server.ports['http']}/default"
    follow_briefly(url, table, target, env)
    proc = subprocess.Popen([sys.executable, "-m", "chload", "load", url, "--table", table,
                             "--target", target, "--follow", "--batch-seconds", "0.2"],
                            env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    writer = threading.Thread(target=changes, args=(db, table, 10**9, rate, stop))
    time.sleep(3)
    writer.start()
    samples: list[float] = []
    until = time.monotonic() + seconds
    time.sleep(2)
    try:
        while time.monotonic() < until:
            newest = services.clickhouse_query(
                server, f"SELECT toString(max(ts)) FROM {table}", user="loader",
                password=server.credentials["password"]).strip()
            seen = time.time()
            # ts: the source's NOW(6) in the machine's zone, as text on 18.16
            samples.append(seen - datetime.strptime(newest, "%Y-%m-%d %H:%M:%S.%f").timestamp())
            time.sleep(0.1)
    finally:
        stop.set()
        writer.join()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=300)
    samples.sort()
    return {"lag_p50_s": round(samples[len(samples) // 2], 3),
            "lag_p99_s": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 3),
            "lag_samples": len(samples)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=5000)
    parser.add_argument("--lag-seconds", type=float, default=30)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-cdc-"))
    db = services.start_mariadb(base, password=PASSWORD)
    server = services.start_clickhouse_server(base)
    env = {"MYSQL_PWD": PASSWORD, "CLICKHOUSE_PASSWORD": server.credentials["password"]}
    result: dict[str, Any] = {"changes": args.changes}
    try:
        seed(db, "orders")
        url = f"mysql://loader@{db.endpoint}/shop/orders"
        embedded = str(base / "embedded")
        served = f"http://loader@127.0.0.1:{server.ports['http']}/default"
        follow_briefly(url, "orders", embedded, env)
        follow_briefly(url, "orders", served, env)
        conn = connect(db)
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            log = cur.fetchone()
        conn.close()
        changes(db, "orders", args.changes)
        for name, fn in (("bare", lambda: bare(db, (log[0], int(log[1])), "orders", False)),
                         ("lines", lambda: bare(db, (log[0], int(log[1])), "orders", True))):
            started = time.monotonic()
            rows = fn()
            result[f"{name}_rows_per_s"] = round(rows / (time.monotonic() - started))
        for name, target in (("embedded", embedded), ("server", served)):
            seconds = chload(url, "--table", "orders", "--target", target, env=env)
            result[f"{name}_changes_per_s"] = round(args.changes / seconds)
            result[f"{name}_vs_bare"] = round(result[f"{name}_changes_per_s"]
                                              / result["bare_rows_per_s"], 2)
        seed(db, "steady")
        result.update(lag(db, server, f"mysql://loader@{db.endpoint}/shop/steady", "steady",
                          env, args.rate, args.lag_seconds))
        result["load1"] = os.getloadavg()[0]
    finally:
        server.stop()
        db.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
