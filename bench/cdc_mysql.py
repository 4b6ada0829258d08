"""MySQL change capture: changes per second applied by chload against the read of the same
binlog by the fastest bare reader, and the lag under a steady write rate.

    python3 bench/cdc_mysql.py [--changes 1000000] [--base TREE] [--profile OUT]
                               [--pyrep] [--rate 5000] [--lag-seconds 30]

Starts its own MariaDB 10.11 (ROW binlog) and ClickHouse 18.16 server (scripts/services),
copies a 10,000-row table into each target with --follow (stopped at once), then makes
`--changes` changes (inserts, updates, deletes in transactions of 100 rows) and measures,
in this run, the same binlog read to /dev/null by each reader at hand, rows decoded:
  mariadb_binlog  the server's own C client (mariadb-binlog --read-from-remote-server
                  --base64-output=decode-rows --verbose): each row as text; read before
                  and after chload's runs, the faster read kept
  pyrep           mysql-replication's reader (a dict per row; slow: only with --pyrep)
  reader          chload's reader alone (mysql_binlog.BinlogReader: each row its TSV line)
`bare` is the fastest of them (named in `bare_reader`), and against it (and against
the C client, `*_vs_mariadb_binlog`):
  embedded    chload load (no --follow: up to the position at its start) into chDB
  server      the same into the 18.16 server
each a whole `chload load` process of this tree (PYTHONPATH), its start included. The
fixed start is measured apart: the same load run again with nothing left to
apply (the process, imports, the engine, the ledger's questions, the binlog connection):
`*_start_s`; `*_past_start` is the rate with that subtracted (a derived figure: the whole run's rate
is the measured one). With --base TREE the same runs of another tree (its own target
tables), alternated with this tree's: `base_*`. With --profile OUT the server run is
recorded by py-spy (OUT: collapsed stacks, threads apart). Then the lag (skipped with
--lag-seconds 0): `--rate` changes a second for `--lag-seconds`, chload --follow into
the 18.16 server, the newest source time seen in the table polled every 0.1 s (lag =
poll time - that row's write time; p50 and p99), and the rate the writer reached. Prints
one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    at `rate` a second if given. Returns the changes made. Without a rate each insert
    is a statement (a rows event) of its own, the hard case for a binlog reader; at a
    rate the inserts of a transaction are one statement (so one writer on these cores
    can keep the rate)."""
    conn = connect(db)
    made, top, started = 0, 10 * SEED, time.monotonic()
    with conn.cursor() as cur:
        while made < count and not (stop and stop.is_set()):
            cur.execute("BEGIN")
            rows = [(top + i, i % 7, "2.50", f"x{i}") for i in range(TXN // 2)]
            if rate:
                cur.execute(f"INSERT INTO {table} VALUES " + ", ".join(
                    ["(%s, %s, %s, %s, NOW(6))"] * len(rows)), [v for r in rows for v in r])
            else:
                cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, NOW(6))",
                                rows)
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


def chload(*args: str, env: dict[str, str], timeout: float = 3600,
           tree: Path = ROOT, profile: str | None = None) -> float:
    argv = [sys.executable, "-m", "chload", "load", *args]
    if profile:
        argv = ["py-spy", "record", "--format", "raw", "--threads", "--rate", "50", "-o", profile,
                "--", *argv]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tree,  # (-m: cwd first)
                          env={**os.environ, **env, "PYTHONPATH": str(tree)},
                          timeout=timeout)
    if done.returncode:
        raise RuntimeError(done.stdout + done.stderr)
    return time.monotonic() - started


def follow_briefly(url: str, table: str, target: str, env: dict[str, str],
                   tree: Path = ROOT) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "chload", "load", url, "--table", table,
                             "--target", target, "--follow"],
                            env={**os.environ, **env, "PYTHONPATH": str(tree)}, cwd=tree,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    if proc.returncode:
        raise RuntimeError(out + err)


def pyrep(db: services.Service, log: tuple[str, int], table: str) -> int:
    from pymysqlreplication import BinLogStreamReader, row_event as rev

    host, port = db.endpoint.split(":")
    stream = BinLogStreamReader({"host": host, "port": int(port), "user": "loader",
                                 "passwd": PASSWORD}, server_id=77, resume_stream=True,
                                log_file=log[0], log_pos=log[1], blocking=False,
                                enable_logging=False)
    rows = 0
    for e in stream:
        if isinstance(e, rev.RowsEvent) and e.table == table:
            rows += len(e.rows)
    stream.close()
    return rows


def reader(db: services.Service, log: tuple[str, int], table: str) -> int:
    from chload.sources.changes.mysql_binlog import BinlogReader, Layout

    host, port = db.endpoint.split(":")
    read = BinlogReader({"host": host, "port": int(port), "user": "loader",
                         "passwd": PASSWORD}, log[0], log[1], "shop", table, False)
    layout = Layout(["id", "qty", "price", "note", "ts"], ["id"])
    rows = 0
    with open(os.devnull, "wb") as out:
        while True:
            cut = read.unit(out, layout, 10**9, 1e9, None, lambda: False)
            rows += cut.rows
            if cut.exhausted or cut.ddl:
                break
    read.close()
    return rows


def mariadb_binlog(db: services.Service, log: tuple[str, int], table: str
                   ) -> tuple[int, float]:
    """(rows, seconds) of the C client reading the binlog to /dev/null; its rows are
    counted in a second read (to a file), not timed."""
    host, port = db.endpoint.split(":")
    argv = ["mariadb-binlog", "--read-from-remote-server", f"--host={host}", f"--port={port}",
            "--user=loader", f"--start-position={log[1]}", "--base64-output=decode-rows",
            "--verbose", log[0]]
    env = {**os.environ, "MYSQL_PWD": PASSWORD}
    started = time.monotonic()
    with open(os.devnull, "wb") as null:
        subprocess.run(argv, stdout=null, env=env, check=True)
    seconds = time.monotonic() - started
    with tempfile.TemporaryFile() as out:
        subprocess.run(argv, stdout=out, env=env, check=True)
        out.seek(0)
        mark = f"`shop`.`{table}`".encode()
        heads = (b"### INSERT INTO ", b"### UPDATE ", b"### DELETE FROM ")
        rows = sum(1 for line in out if line.startswith(heads) and mark in line)
    return rows, seconds


def lag(db: services.Service, server: services.Service, url: str, table: str,
        env: dict[str, str], rate: float, seconds: float) -> dict[str, float | int]:
    target = f"http://loader@127.0.0.1:{server.ports['http']}/default"
    follow_briefly(url, table, target, env)
    proc = subprocess.Popen([sys.executable, "-m", "chload", "load", url, "--table", table,
                             "--target", target, "--follow", "--batch-seconds", "0.2"],
                            env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    made: list[int] = []
    writer = threading.Thread(target=lambda: made.append(changes(db, table, 10**9, rate,
                                                                 stop)))
    time.sleep(3)
    wrote = time.monotonic()
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
        wrote = time.monotonic() - wrote
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=300)
    samples.sort()
    return {"lag_p50_s": round(samples[len(samples) // 2], 3),
            "lag_p99_s": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 3),
            "lag_samples": len(samples), "lag_rate_asked": rate,
            "lag_rate_written": round(made[0] / wrote) if made else 0}


def measure(url: str, targets: dict[str, str], trees: dict[str, Path], changes: int,
            env: dict[str, str], profile: str | None) -> dict[str, Any]:
    """Each tree's embedded and server runs, alternated (this tree's first), then each
    run's fixed start: the same run again with nothing left to apply."""
    result: dict[str, Any] = {}
    for kind in ("embedded", "server"):
        for prefix, tree in trees.items():
            table = "orders" + ("_base" if prefix else "")
            seconds = chload(url, "--table", table, "--target", targets[f"{prefix}{kind}"],
                             env=env, tree=tree,
                             profile=profile if kind == "server" and not prefix else None)
            result[f"{prefix}{kind}_s"] = round(seconds, 2)
            result[f"{prefix}{kind}_changes_per_s"] = round(changes / seconds)
    for kind in ("embedded", "server"):
        for prefix, tree in trees.items():
            table = "orders" + ("_base" if prefix else "")
            result[f"{prefix}{kind}_start_s"] = round(chload(
                url, "--table", table, "--target", targets[f"{prefix}{kind}"], env=env,
                tree=tree), 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--base", type=Path, help="another tree, measured alternately")
    parser.add_argument("--profile", help="py-spy's collapsed stacks of the server run")
    parser.add_argument("--pyrep", action="store_true", help="mysql-replication too (slow)")
    parser.add_argument("--rate", type=float, default=5000)
    parser.add_argument("--lag-seconds", type=float, default=30)
    args = parser.parse_args()
    trees = {"": ROOT, **({"base_": args.base.resolve()} if args.base else {})}
    base = Path(tempfile.mkdtemp(prefix="bench-cdc-"))
    db = services.start_mariadb(base, password=PASSWORD)
    server = services.start_clickhouse_server(base)
    env = {"MYSQL_PWD": PASSWORD, "CLICKHOUSE_PASSWORD": server.credentials["password"]}
    result: dict[str, Any] = {"changes": args.changes, "date": time.strftime(
        "%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
        text=True).stdout.strip(), "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    if args.base:
        result["base"] = subprocess.run(["git", "-C", str(args.base), "rev-parse", "--short",
                                         "HEAD"], capture_output=True, text=True).stdout.strip()
    try:
        seed(db, "orders")
        url = f"mysql://loader@{db.endpoint}/shop/orders"
        served = f"http://loader@127.0.0.1:{server.ports['http']}/default"
        targets = {}
        for prefix, tree in trees.items():
            table = "orders" + ("_base" if prefix else "")
            targets[f"{prefix}embedded"] = str(base / f"{prefix}embedded")
            targets[f"{prefix}server"] = served
            for kind in ("embedded", "server"):
                follow_briefly(url, table, targets[f"{prefix}{kind}"], env, tree)
        conn = connect(db)
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            log = cur.fetchone()
        conn.close()
        started = time.monotonic()
        changes(db, "orders", args.changes)
        result["write_s"] = round(time.monotonic() - started, 1)
        at = (str(log[0]), int(log[1]))
        rows, seconds = mariadb_binlog(db, at, "orders")
        result["rows"] = rows
        bare = {"mariadb_binlog": rows / seconds}
        for name, fn in (("pyrep", pyrep), ("reader", reader)):
            if name == "pyrep" and not args.pyrep:
                continue
            started = time.monotonic()
            bare[name] = fn(db, at, "orders") / (time.monotonic() - started)
        result.update(measure(url, targets, trees, args.changes, env, args.profile))
        rows, seconds = mariadb_binlog(db, at, "orders")  # again: the faster read kept
        bare["mariadb_binlog"] = max(bare["mariadb_binlog"], rows / seconds)
        for name, rate in bare.items():
            result[f"{name}_rows_per_s"] = round(rate)
        fastest = max(bare, key=lambda n: bare[n])
        result["bare_reader"] = fastest
        result["bare_rows_per_s"] = round(bare[fastest])
        for prefix in trees:
            for kind in ("embedded", "server"):
                rate = result[f"{prefix}{kind}_changes_per_s"]
                result[f"{prefix}{kind}_vs_bare"] = round(rate / bare[fastest], 2)
                result[f"{prefix}{kind}_vs_mariadb_binlog"] = round(
                    rate / bare["mariadb_binlog"], 2)
                past = result[f"{prefix}{kind}_s"] - result[f"{prefix}{kind}_start_s"]
                result[f"{prefix}{kind}_past_start_vs_bare"] = round(
                    args.changes / past / bare[fastest], 2) if past > 0 else None
        if args.lag_seconds:
            seed(db, "steady")
            result.update(lag(db, server, f"mysql://loader@{db.endpoint}/shop/steady",
                              "steady", env, args.rate, args.lag_seconds))
        result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        server.stop()
        db.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
