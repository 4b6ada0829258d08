"""chload from PostgreSQL and MariaDB vs the single-stream ways to copy a table (issue 16).

Same run, same data (an `orders` table: bigint pk, int, numeric(10,2), timestamp,
nullable text, text), each method a whole process writing a fresh MergeTree table in
an embedded engine (chDB) of its own, methods alternating round by round:

- `chDB INSERT ... SELECT FROM postgresql()` / `mysql()`: the engine reads the table on
  one connection (the fastest single stream here, and no shared snapshot);
- `psql COPY > file; chDB INSERT FROM file()` (PostgreSQL) / `mariadb --batch > file;
  chDB INSERT FROM file()` (MariaDB): the client's bytes, then the engine;
- `chload load ... --workers N` for N in 1, 2, 4.

    python bench/databases.py [--rows 2000000] [--repeats 3] [--json OUT]

Prints median seconds per method and "speed x" = the fastest single-stream method's
median / the method's (higher is faster). Not measured here: `psql COPY |
clickhouse-client` into a server and the MySQL database engine (18.16 has neither
postgresql() nor a usable MySQL database engine for this comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts" / "services"))
import services  # noqa: E402

PASSWORD = "bench-Db-pw-91x"
DDL = ("(id Int64, qty Int32, price Decimal(10, 2), created DateTime64(6, 'UTC'), "
       "note Nullable(String), status String) ENGINE = MergeTree ORDER BY id")
STRUCTURE = ("id Int64, qty Int32, price Decimal(10, 2), created DateTime64(6, 'UTC'), "
             "note Nullable(String), status String")
PG_FILL = """CREATE TABLE orders (id bigint PRIMARY KEY, qty int NOT NULL,
    price numeric(10,2) NOT NULL, created timestamp NOT NULL, note text, status text NOT NULL);
INSERT INTO orders SELECT g, g % 1000, (g % 100000) / 100.0,
    timestamp '2020-01-01' + g * interval '1 second',
    CASE WHEN g % 7 = 0 THEN NULL ELSE 'note ' || g END,
    (ARRAY['new', 'paid', 'shipped'])[g % 3 + 1] FROM generate_series(1, {rows}) g;
ANALYZE orders"""
MY_FILL = """CREATE TABLE orders (id bigint PRIMARY KEY, qty int NOT NULL,
    price decimal(10,2) NOT NULL, created datetime(6) NOT NULL, note text NULL,
    status varchar(20) NOT NULL) ENGINE=InnoDB;
SET SESSION max_recursive_iterations = 100000000;
INSERT INTO orders WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g
    WHERE n < {rows}) SELECT n, n % 1000, (n % 100000) / 100.0,
    TIMESTAMP '2020-01-01 00:00:00' + INTERVAL n SECOND,
    IF(n % 7 = 0, NULL, CONCAT('note ', n)), ELT(n % 3 + 1, 'new', 'paid', 'shipped') FROM g;
ANALYZE TABLE orders"""


def _chdb(work: str, sql: str) -> None:
    """Run `sql` in a fresh chDB process whose engine lives in `work`."""
    code = ("import sys, chdb.session as s; e = s.Session(sys.argv[1]); "
            "e.query(sys.argv[3]); e.query(sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, work, sql, f"CREATE TABLE t {DDL}"],
                   check=True)


def methods(kind: str, endpoint: str) -> dict[str, callable]:  # type: ignore[valid-type]
    host, port = endpoint.split(":")
    env = {**os.environ, "PGPASSWORD": PASSWORD, "MYSQL_PWD": PASSWORD,
           "PYTHONPATH": str(HERE.parent)}
    fn = "postgresql" if kind == "postgresql" else "mysql"
    url = (f"postgresql://loader@{endpoint}/shop/public.orders" if kind == "postgresql"
           else f"mysql://loader@{endpoint}/shop/orders")

    def engine_reads(work: str) -> None:
        _chdb(work, f"INSERT INTO t SELECT * FROM {fn}('{endpoint}', 'shop', 'orders', "
                    f"'loader', '{PASSWORD}')")

    def client_then_engine(work: str) -> None:
        spool = os.path.join(work, "spool.tsv")
        with open(spool, "wb") as out:
            if kind == "postgresql":
                argv = ["psql", "-X", "-q", "-h", host, "-p", port, "-U", "loader", "-d", "shop",
                        "-c", "COPY orders TO STDOUT"]
            else:
                argv = ["mariadb", "--no-defaults", "-h", host, "-P", port, "-u", "loader",
                        "--batch", "--raw", "--skip-column-names", "--quick", "shop", "-e",
                        "SELECT id, qty, price, created, IFNULL(note, '\\\\N'), status "
                        "FROM orders"]
            subprocess.run(argv, stdout=out, env=env, check=True)
        structure = STRUCTURE.replace("'", "\\'")
        _chdb(work, f"INSERT INTO t SELECT * FROM file('{spool}', 'TSV', '{structure}')")

    def chload(workers: int):  # type: ignore[no-untyped-def]
        def run(work: str) -> None:
            subprocess.run([sys.executable, "-m", "chload", "load", url, "--table", "orders",
                            "--target", work, "--workers", str(workers), "-q"], env=env,
                           check=True)
        return run

    client = "psql COPY > file; chDB file()" if kind == "postgresql" else (
        "mariadb --batch > file; chDB file()")
    return {f"chDB INSERT SELECT FROM {fn}()": engine_reads, client: client_then_engine,
            "chload --workers 1": chload(1), "chload --workers 2": chload(2),
            "chload --workers 4": chload(4)}


def measure(kind: str, endpoint: str, repeats: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, method in methods(kind, endpoint).items():
            work = tempfile.mkdtemp(prefix="chload-bench-db-")
            try:
                start = time.monotonic()
                method(work)
                runs.setdefault(name, []).append(time.monotonic() - start)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return {name: statistics.median(times) for name, times in runs.items()}


def report(kind: str, rows: int, medians: dict[str, float]) -> dict:
    single = min(t for name, t in medians.items() if not name.startswith("chload"))
    print(f"\n{kind}: {rows:,} rows; speed x = fastest single stream ({single:.2f} s) / method")
    for name, seconds in medians.items():
        print(f"  {name:<38} {seconds:6.2f} s  {rows / seconds / 1e6:5.2f} M rows/s  "
              f"speed x {single / seconds:4.2f}")
    return {"rows": rows, "seconds": medians, "single_stream_best": single}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="chload-bench-services-"))
    results = {}
    pg = services.start_postgres(base, password=PASSWORD)
    try:
        services.postgres_sql(pg, PG_FILL.format(rows=args.rows))
        results["postgresql"] = report("postgresql", args.rows,
                                       measure("postgresql", pg.endpoint, args.repeats))
    finally:
        pg.stop()
    my = services.start_mariadb(base, password=PASSWORD)
    try:
        services.mariadb_sql(my, MY_FILL.format(rows=args.rows))
        results["mariadb"] = report("mariadb", args.rows,
                                    measure("mariadb", my.endpoint, args.repeats))
    finally:
        my.stop()
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
