"""chload from PostgreSQL and MariaDB vs the single-stream ways to copy a table.

Same run, same data (an `orders` table: bigint pk, int, numeric(10,2), timestamp,
nullable text, text), each method a whole process (Python start and chDB import
counted wherever Python runs), methods alternating round by round, each into a fresh
table:

- into an embedded target (a chDB directory of its own per method):
  `chDB INSERT ... SELECT FROM postgresql()` / `mysql()` (the engine reads on one
  connection, no shared snapshot); `psql COPY > file; chDB file()` / `mariadb --batch >
  file; chDB file()`; `chload --workers N`;
- into a ClickHouse 18.16 server (`--server`): `psql COPY | clickhouse-client INSERT
  FORMAT TSV` / the same with `mariadb --batch`; for MariaDB the server's own
  `INSERT ... SELECT FROM mysql()` (18.16 has no `postgresql()` and no MySQL database
  engine); `chload --workers N --target http://...`.

`--limit-connection F` gives each source connection at most F of a core (a cgroup v1
cpu quota per PostgreSQL backend process / MariaDB connection thread, as they appear),
like a database on a busy host: a single stream is then source-bound, and ranges read
on several connections can scale.

    python bench/databases.py [--rows 2000000] [--repeats 3] [--workers 1,2,4]
        [--server] [--no-embedded] [--limit-connection 0.5] [--json OUT]
        [--variant 'onepart=--setting max_insert_block_size=4000000' ...]

`--variant NAME=ARGS` adds `chload NAME --workers N` (N from `--variant-workers`) with
ARGS appended to its command line, timed in the same rounds: a lever measured against
the same baselines. An ARGS word starting with `?` is appended to the server target's
URL instead (`push=?path=push`: the loader's engine parses and posts Native); such a
variant is timed into the server only. A word starting with `@` names another chload
tree to run instead of this one (its PYTHONPATH: `base=@/tmp/chload-base`, a checkout
of the commit before a change): an A/B of two commits in the same rounds.

Prints per method the median seconds, "speed x" = the fastest single-stream method's
median (same target) / the method's (higher is faster), and the CPU seconds spent by
the source database, the loader process tree and the ClickHouse server, which say what
bounds each run (a side near its core count x seconds is the bound). For chload also its
"rows span" (its own report: first data byte to the end of the last data request) and
the fastest single stream's time over it: at or above 1x, chload moves the rows as fast,
and what it takes beyond them (start, commit) is its fixed cost.
"""

from __future__ import annotations

import argparse
import compileall
import itertools
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts" / "services"))
sys.path.insert(0, str(HERE))
import db_throttle  # noqa: E402
import services  # noqa: E402
from common import rows_span  # noqa: E402

PASSWORD = "bench-Db-pw-91x"
COLUMNS = ("id Int64, qty Int32, price Decimal(10, 2), created DateTime('UTC'), "
           "note Nullable(String), status String")
PG_FILL = """CREATE TABLE orders (id bigint PRIMARY KEY, qty int NOT NULL,
    price numeric(10,2) NOT NULL, created timestamp(0) NOT NULL, note text, status text NOT NULL);
INSERT INTO orders SELECT g, g % 1000, (g % 100000) / 100.0,
    timestamp '2020-01-01' + g * interval '1 second',
    CASE WHEN g % 7 = 0 THEN NULL ELSE 'note ' || g END,
    (ARRAY['new', 'paid', 'shipped'])[g % 3 + 1] FROM generate_series(1, {rows}) g;
ANALYZE orders"""
MY_FILL = """CREATE TABLE orders (id bigint PRIMARY KEY, qty int NOT NULL,
    price decimal(10,2) NOT NULL, created datetime NOT NULL, note text NULL,
    status varchar(20) NOT NULL) ENGINE=InnoDB;
INSERT INTO orders SELECT seq, seq % 1000, (seq % 100000) / 100.0,
    TIMESTAMP '2020-01-01 00:00:00' + INTERVAL seq SECOND,
    IF(seq % 7 = 0, NULL, CONCAT('note ', seq)), ELT(seq % 3 + 1, 'new', 'paid', 'shipped')
    FROM seq_1_to_{rows};
ANALYZE TABLE orders"""
CHDB = ("import sys, chdb.session as s; e = s.Session(sys.argv[1]); "
        "e.query('CREATE TABLE t (' + sys.argv[3] + ') ENGINE = MergeTree ORDER BY id'); "
        "e.query(sys.argv[2])")
TABLES = itertools.count(1)  # server tables, one per timed command
Method = Callable[[str], list[str]]  # a fresh work dir -> the command (argv) to time


@dataclass(frozen=True)
class Variant:
    """`--variant NAME=ARGS`: chload with ARGS appended (a word starting with `?`: the
    server target URL's suffix instead), timed with each of `workers`."""

    name: str
    args: tuple[str, ...]
    url_suffix: str
    workers: tuple[int, ...]
    tree: str = ""  # another chload checkout to run (PYTHONPATH), '' : this one


def parse_variant(text: str, workers: tuple[int, ...]) -> Variant:
    name, sep, rest = text.partition("=")
    if not sep or not name.strip() or " " in name.strip():
        raise SystemExit(f"--variant {text!r}: write NAME=ARGS (e.g. 'push=?path=push')")
    words = shlex.split(rest)
    suffix = "".join(w for w in words if w.startswith("?"))
    tree = "".join(w[1:] for w in words if w.startswith("@"))
    if tree:
        compileall.compile_dir(str(Path(tree) / "chload"), quiet=1)
    return Variant(name.strip(), tuple(w for w in words if w[:1] not in "?@"), suffix,
                   workers, tree)


class Bench:
    """One database, one target kind: the methods and how to run them."""

    def __init__(self, kind: str, db: services.Service, server: services.Service | None):
        self.kind, self.db, self.server = kind, db, server
        self.host, self.port = db.endpoint.split(":")
        # PYTHONSAFEPATH: `python -m chload` puts the working directory first on
        # sys.path, before PYTHONPATH, so a variant's other tree (`@DIR`) ran this
        # directory's chload when the bench was started from a checkout
        self.env = {**os.environ, "PGPASSWORD": PASSWORD, "MYSQL_PWD": PASSWORD,
                    "PYTHONPATH": str(HERE.parent), "PYTHONSAFEPATH": "1"}
        self.url = (f"postgresql://loader@{db.endpoint}/shop/public.orders"
                    if kind == "postgresql" else f"mysql://loader@{db.endpoint}/shop/orders")

    def client(self) -> str:
        """The database's client printing the table as TSV (shell words)."""
        if self.kind == "postgresql":
            return (f"psql -X -q -h {self.host} -p {self.port} -U loader -d shop "
                    "-c 'COPY orders TO STDOUT'")
        return (f"mariadb --no-defaults -h {self.host} -P {self.port} -u loader --batch --raw "
                "--skip-column-names --quick shop -e \"SELECT id, qty, price, created, "
                "IFNULL(note, '\\\\\\\\N'), status FROM orders\"")

    def chload(self, workers: int, target: Callable[[str], list[str]],
               extra: tuple[str, ...] = (), tree: str = "") -> Method:
        """`chload load` of the table (`tree`: another checkout's, by its PYTHONPATH)."""
        where = ["env", f"PYTHONPATH={tree}"] if tree else []
        return lambda work: [*where, sys.executable, "-m", "chload", "load", self.url,
                             "--table", "orders", "--workers", str(workers), "--json",
                             *target(work), *extra]

    def variants(self, variants: list[Variant], target: Callable[[str, str], list[str]],
                 server: bool) -> dict[str, Method]:
        """`chload NAME --workers N` for each variant (see --variant); `target(work,
        url_suffix)` the target's arguments. A URL suffix only means something for a
        server, so such a variant is left out of the embedded target's methods."""
        methods: dict[str, Method] = {}
        for v in variants:
            if v.url_suffix and not server:
                continue
            for n in v.workers:
                methods[f"chload {v.name} --workers {n}"] = self.chload(
                    n, lambda work, v=v: target(work, v.url_suffix), v.args, v.tree)
        return methods

    def embedded(self, workers: list[int], variants: list[Variant]) -> dict[str, Method]:
        fn = "postgresql" if self.kind == "postgresql" else "mysql"
        reads = (f"INSERT INTO t SELECT * FROM {fn}('{self.db.endpoint}', 'shop', 'orders', "
                 f"'loader', '{PASSWORD}')")
        structure = COLUMNS.replace("'", "\\'")
        from_file = "INSERT INTO t SELECT * FROM file('{spool}', 'TSV', '" + structure + "')"
        name = "psql COPY" if self.kind == "postgresql" else "mariadb --batch"
        methods: dict[str, Method] = {
            f"chDB INSERT SELECT FROM {fn}()": lambda work: [
                sys.executable, "-c", CHDB, work, reads, COLUMNS],
            f"{name} > file; chDB file()": lambda work: [
                "bash", "-o", "pipefail", "-c",
                f"{self.client()} > {work}/spool.tsv && {sys.executable} -c \"$0\" \"$1\" "
                f"\"$2\" \"$3\"", CHDB, work, from_file.format(spool=f"{work}/spool.tsv"),
                COLUMNS]}
        for n in workers:
            methods[f"chload --workers {n}"] = self.chload(n, lambda work: ["--target", work])
        methods.update(self.variants(variants, lambda work, _: ["--target", work], False))
        return methods

    def into_server(self, workers: list[int], variants: list[Variant]) -> dict[str, Method]:
        assert self.server is not None
        server = self.server
        client = f"clickhouse-client --port {server.ports['tcp']}"

        def table(work: str) -> str:
            name = f"orders_{os.getpid()}_{next(TABLES)}"
            services.clickhouse_query(server, f"CREATE TABLE {name} ({COLUMNS}) ENGINE = "
                                      "MergeTree ORDER BY id")
            Path(work, "table").write_text(name)
            return name

        name = "psql COPY" if self.kind == "postgresql" else "mariadb --batch"
        methods: dict[str, Method] = {
            f"{name} | clickhouse-client": lambda work: [
                "bash", "-o", "pipefail", "-c", f"{self.client()} | {client} --query "
                f"'INSERT INTO {table(work)} FORMAT TSV'"]}
        if self.kind == "mysql":
            methods["server INSERT SELECT FROM mysql()"] = lambda work: [
                "bash", "-c", f"{client} --query \"INSERT INTO {table(work)} SELECT * FROM "
                f"mysql('{self.db.endpoint}', 'shop', 'orders', 'loader', '{PASSWORD}')\""]
        url = f"http://default@127.0.0.1:{server.ports['http']}/default"
        for n in workers:
            methods[f"chload --workers {n}"] = self.chload(
                n, lambda work: ["--target", url, "--table", table(work)])
        methods.update(self.variants(
            variants, lambda work, suffix: ["--target", url + suffix, "--table", table(work)],
            True))
        return methods


def timed(argv: list[str], env: dict[str, str], db: services.Service,
          server: services.Service | None) -> dict[str, float]:
    """Wall seconds and CPU seconds (the loader's process tree, the source, the
    server) of one command."""
    before = (db_throttle.cpu_seconds(db.pid),
              db_throttle.cpu_seconds(server.pid) if server else 0.0)
    with tempfile.TemporaryFile("w+") as out:  # (chload's --json report: its rows span)
        start = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        out.seek(0)
        span = rows_span(out.read())
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{argv[:6]}... failed ({proc.returncode})")
    time.sleep(0.3)  # a backend ends (and is reaped) a moment after its client
    return {"wall": wall, "loader_cpu": usage.ru_utime + usage.ru_stime,
            "source_cpu": db_throttle.cpu_seconds(db.pid) - before[0],
            "server_cpu": (db_throttle.cpu_seconds(server.pid) - before[1]) if server else 0.0,
            "rows_span": span or 0.0}


def measure(bench: Bench, methods: dict[str, Method], repeats: int) -> dict[str, dict]:
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):
        for name, method in methods.items():
            work = tempfile.mkdtemp(prefix="chload-bench-db-")
            try:
                argv = method(work)
                runs.setdefault(name, []).append(timed(argv, bench.env, bench.db, bench.server))
            finally:
                shutil.rmtree(work, ignore_errors=True)
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
               for name, rs in runs.items()}
    for name, rs in runs.items():  # a variant against chload in the same rounds
        words = name.split()
        if len(words) == 4 and words[0] == "chload" and words[2] == "--workers":
            paired = runs.get(f"chload --workers {words[3]}", [])
            ratios = [v["wall"] / b["wall"] for v, b in zip(rs, paired, strict=False)]
            if ratios:
                medians[name]["paired"] = statistics.median(ratios)
                print(f"  {name}: wall / chload's, round by round: "
                      + " ".join(f"{r:.3f}" for r in ratios), flush=True)
    return medians


def report(title: str, rows: int, medians: dict[str, dict]) -> dict:
    single = min(m["wall"] for name, m in medians.items() if not name.startswith("chload"))
    print(f"\n{title}: {rows:,} rows; speed x = fastest single stream ({single:.2f} s) / "
          f"method; CPU seconds: loader tree / source / server", flush=True)
    for name, m in medians.items():
        paired = f"   paired {m['paired']:.3f}" if "paired" in m else ""
        span = (f"   rows span {m['rows_span']:.2f} s (x {single / m['rows_span']:4.2f})"
                if m.get("rows_span") else "")
        print(f"  {name:<38} {m['wall']:6.2f} s  speed x {single / m['wall']:4.2f}   cpu "
              f"{m['loader_cpu']:5.2f} / {m['source_cpu']:5.2f} / {m['server_cpu']:5.2f}"
              f"{paired}{span}", flush=True)
    return {"rows": rows, "methods": medians, "single_stream_best": single}


def run_database(kind: str, base: Path, args: argparse.Namespace, workers: list[int],
                 variants: list[Variant], server: services.Service | None) -> dict:
    start, sql, fill = ((services.start_postgres, services.postgres_sql, PG_FILL)
                        if kind == "postgresql" else
                        (services.start_mariadb, services.mariadb_sql, MY_FILL))
    db = start(base, password=PASSWORD)
    results = {}
    try:
        sql(db, fill.format(rows=args.rows))
        bench = Bench(kind, db, server)
        limit = (db_throttle.Throttle(db, args.limit_connection) if args.limit_connection
                 else None)
        suffix = f", each source connection <= {args.limit_connection} core" if limit else ""
        with limit or db_throttle.nothing():
            if args.embedded:
                results["embedded"] = report(f"{kind} -> embedded{suffix}", args.rows,
                                             measure(bench, bench.embedded(workers, variants),
                                                     args.repeats))
            if server is not None:
                results["server"] = report(f"{kind} -> 18.16 server{suffix}", args.rows,
                                           measure(bench, bench.into_server(workers, variants),
                                                   args.repeats))
    finally:
        db.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--server", action="store_true", help="also into an 18.16 server")
    parser.add_argument("--no-embedded", dest="embedded", action="store_false")
    parser.add_argument("--limit-connection", type=float, default=0.0,
                        help="cores each source connection may use (cgroup quota)")
    parser.add_argument("--databases", default="postgresql,mysql")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=ARGS: also chload with ARGS (see the module's docstring)")
    parser.add_argument("--variant-workers", default="1",
                        help="the --workers values each variant is timed with")
    parser.add_argument("--json")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    variant_workers = tuple(int(w) for w in args.variant_workers.split(","))
    variants = [parse_variant(v, variant_workers) for v in args.variant]
    base = Path(tempfile.mkdtemp(prefix="chload-bench-services-"))
    # An installed chload has its bytecode compiled; a worktree under
    # PYTHONDONTWRITEBYTECODE would compile every module on each run (0.05-0.1 CPU-s).
    compileall.compile_dir(str(HERE.parent / "chload"), quiet=1)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    server = services.start_clickhouse_server(base) if args.server else None
    results = {}
    try:
        for kind in args.databases.split(","):
            results[kind] = run_database(kind, base, args, workers, variants, server)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(f"load average at end: {os.getloadavg()}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
