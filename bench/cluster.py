"""chload into a sharded cluster against the ways people load one by hand.

Three ClickHouse 18.16 servers on 127.0.0.1 (scripts/services/clusters.py), shards
weighted 1/2/1, a Distributed(c, default, t_local, cityHash64(id)) table over them; the
trips data (10 gzip CSV files of 1M rows by default). Every method starts from empty
tables and is checked after: every row there once, none on a shard its key does not
name. Methods, alternated round by round (this machine is shared and noisy):

- curl sync 2 / 4: `xargs -P2|-P4 curl` posting each file into the Distributed table
  with insert_distributed_sync=1 (the server parses and sends each shard its rows);
- curl async 2: the same with insert_distributed_sync=0, timed until every row has
  reached its shard (the inserts return before that);
- hand per-shard: a script splitting each file in chDB by the key (the slots of each
  shard) and pushing Native straight into each shard's local table (url()), 2 at a time;
- chload: `chload load` into the Distributed table (routed per file into per-shard
  stages, committed per shard with its ledger entry).

    python3 bench/cluster.py [--files 10] [--rows 1000000] [--repeats 3] [--json out]
        [--base DIR] [--methods sync2,sync4,async2,hand,chload,base]

`--base DIR` adds `chload` run from another tree (a `git worktree add --detach` checkout of
the base commit; PYTHONPATH=DIR, PYTHONSAFEPATH=1), alternated with this one in the same
rounds: the paired ratio (this tree's time / the base's, per round) is printed. Every
method's CPU is measured too: the three servers' (/proc) plus the loader's own processes
(the children's rusage), per run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "services"))
from common import (  # noqa: E402
    CACHE,
    TRIPS_SCHEMA,
    compile_chload,
    interleave,
    make_trips,
    median_or_none,
    print_ratios,
    rows_span,
)

KEY = "cityHash64(id)"
WEIGHTS = (1, 2, 1)
SLOTS = {1: [0], 2: [1, 2], 3: [3]}
CHLOAD = "chload (route per file into per-shard stages, commit per shard)"
SYNC2, SYNC4 = "curl -> Distributed, sync, 2 at a time", "curl -> Distributed, sync, 4 at a time"
ASYNC2 = "curl -> Distributed, async, 2 at a time (until on shards)"
HAND = "hand per-shard (chDB split by key, Native to each shard, 2 at a time)"
BASE = "chload at the base tree (--base)"
METHODS = {"sync2": SYNC2, "sync4": SYNC4, "async2": ASYNC2, "hand": HAND, "chload": CHLOAD,
           "base": BASE}

_HAND_SCRIPT = r"""
import sys, urllib.parse, threading, chdb.session
files, urls = sys.argv[1].split(','), sys.argv[2].split(',')
table, schema, key = sys.argv[3:6]
slots = ['(0)', '(1, 2)', '(3)']
local = threading.local()
def one(path):
    s = getattr(local, 's', None) or chdb.session.Session()
    local.s = s
    for url, mine in zip(urls, slots):
        q = urllib.parse.urlencode({'query': f'INSERT INTO default.{table}_local FORMAT Native'})
        s.query(f"INSERT INTO FUNCTION url('{url}/?{q}', 'Native', '{schema}') SELECT * FROM "
                f"file('{path}', 'CSVWithNames', '{schema}') WHERE {key} % 4 IN {mine} "
                "SETTINGS max_threads = 1")
def worker(items):
    for p in items:
        one(p)
threads = [threading.Thread(target=worker, args=(files[i::2],)) for i in range(2)]
[t.start() for t in threads]; [t.join() for t in threads]
"""


def query(url: str, sql: str) -> str:
    req = urllib.request.Request(f"{url}/?{urllib.parse.urlencode({'query': sql})}",
                                 data=b"", method="POST")
    return urllib.request.urlopen(req, timeout=300).read().decode()


class Cluster:
    def __init__(self, urls: list[str], endpoints: list[str], name: str,
                 pids: list[int]) -> None:
        self.urls, self.endpoints, self.name, self.pids = urls, endpoints, name, pids
        self.table = ""
        self.n = 0

    def fresh(self) -> None:
        if self.table:
            self.drop()
        self.n += 1
        self.table = f"bench_{os.getpid()}_{self.n}"
        for url in self.urls:
            query(url, f"CREATE TABLE default.{self.table}_local ({TRIPS_SCHEMA}) "
                       "ENGINE = MergeTree ORDER BY id")
        query(self.urls[0], f"CREATE TABLE default.{self.table} AS default.{self.table}_local "
                            f"ENGINE = Distributed({self.name}, default, {self.table}_local, "
                            f"{KEY})")

    def drop(self) -> None:
        query(self.urls[0], f"DROP TABLE IF EXISTS default.{self.table}")
        for url in self.urls:
            query(url, f"DROP TABLE IF EXISTS default.{self.table}_local")

    def counts(self) -> list[tuple[int, int]]:
        """Per shard: (rows, rows whose key is not of that shard)."""
        out = []
        for url, slots in zip(self.urls, SLOTS.values(), strict=True):
            row = query(url, f"SELECT count(), countIf(NOT has({slots}, {KEY} % 4)) FROM "
                             f"default.{self.table}_local").split()
            out.append((int(row[0]), int(row[1])))
        return out

    def check(self, total: int, method: str) -> None:
        counts = self.counts()
        if sum(c for c, _ in counts) != total or any(bad for _, bad in counts):
            sys.exit(f"{method}: wrong rows per shard {counts} (want {total} in all, none "
                     "misplaced)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--base", help="a checkout of the base tree: chload from it as well")
    parser.add_argument("--methods", default="sync2,sync4,async2,hand,chload,base",
                        help="which methods to run (comma-separated: %(default)s)")
    args = parser.parse_args()
    csv = make_trips(os.path.join(CACHE, f"trips-csvgz-{args.files}x{args.rows}"), args.files,
                     args.rows)
    compile_chload()
    if args.base:
        compile_chload(os.path.join(args.base, "chload"))
    import services

    with tempfile.TemporaryDirectory(prefix="chload-bench-cluster-") as work:
        cluster = services.start_weighted_cluster(Path(work), WEIGHTS)
        try:
            run(args, Cluster(cluster.urls, cluster.endpoints, cluster.name,
                              [server.pid for server in cluster.servers]), csv)
        finally:
            cluster.stop()


def run(args: argparse.Namespace, c: Cluster, csv: list[str]) -> None:
    total = args.files * args.rows
    files = " ".join(shlex.quote(p) for p in csv)
    shards = [a for e, u in zip(c.endpoints, c.urls, strict=True) for a in ("--shard", f"{e}={u}")]

    def curl(parallel: int, sync: int) -> list[str]:
        insert = urllib.parse.quote_plus(f"INSERT INTO default.{c.table} FORMAT CSVWithNames")
        return ["sh", "-c", f"printf '%s\\n' {files} | xargs -P{parallel} -I{{}} curl -sS "
                "--fail-with-body "
                f"-H 'Content-Encoding: gzip' --data-binary @{{}} "
                f"'{c.urls[0]}/?query={insert}&insert_distributed_sync={sync}'"]

    cpu: dict[str, list[float]] = {}
    spans: dict[str, list[float | None]] = {}  # chload's rows span per run (rows_span)

    def timed(build, settle: bool = False, env: dict[str, str] | None = None,  # noqa: ANN001
              name: str = "") -> float:
        tries = 1 if build is chload else 4  # chload: no second try
        for attempt in range(tries):
            c.fresh()
            used = _cpu(c.pids)
            started = time.perf_counter()
            done = subprocess.run(build(), capture_output=True, text=True, timeout=900,
                                  env={**os.environ, **(env or {})})
            if done.returncode == 0:
                break
            # a classic way's server error is shown and that run tried again (up to 3
            # times), not the whole bench lost: 18.16's async Distributed INSERTs, two at
            # once into a fresh table, race to create its spool directory ("File
            # exists", HTTP 500), seen 3 times in one run on a busy machine
            again = attempt + 1 < tries
            print(f"{' '.join(build()[:3])[:80]}...: failed ({done.stdout[-300:]}"
                  f"{done.stderr[-300:]}); {'again' if again else 'giving up'}",
                  file=sys.stderr)
        else:
            sys.exit("benchmark step failed (every try)")
        while settle and sum(n for n, _ in c.counts()) < total:
            time.sleep(0.01)
        seconds = time.perf_counter() - started
        cpu.setdefault(name, []).append(_cpu(c.pids) - used)
        if build is chload:
            spans.setdefault(name, []).append(rows_span(done.stdout))
        c.check(total, " ".join(build()[:3]))
        return seconds

    def chload() -> list[str]:
        glob = os.path.join(os.path.dirname(csv[0]), "*.csv.gz")
        return [sys.executable, "-m", "chload", "load", glob, "--table", c.table, "--target",
                f"{c.urls[0]}/default", *shards, "--json"]

    def hand() -> list[str]:
        return [sys.executable, "-c", _HAND_SCRIPT, ",".join(csv), ",".join(c.urls), c.table,
                TRIPS_SCHEMA, KEY]

    load_start = os.getloadavg()[0]
    base_env = {"PYTHONPATH": args.base or "", "PYTHONSAFEPATH": "1"}
    everything = {
        SYNC2: lambda: timed(lambda: curl(2, 1), name=SYNC2),
        SYNC4: lambda: timed(lambda: curl(4, 1), name=SYNC4),
        ASYNC2: lambda: timed(lambda: curl(2, 0), settle=True, name=ASYNC2),
        HAND: lambda: timed(hand, name=HAND),
        CHLOAD: lambda: timed(chload, name=CHLOAD,
                              env={"PYTHONSAFEPATH": "1", "PYTHONPATH": _tree()}),
        BASE: lambda: timed(chload, env=base_env, name=BASE),
    }
    wanted = {METHODS[m] for m in args.methods.split(",")} | {CHLOAD}
    if not args.base:
        wanted.discard(BASE)
    timings = interleave({k: f for k, f in everything.items() if k in wanted}, args.repeats)
    extra = _cpu_and_pairs(timings, {n: runs[-args.repeats:] for n, runs in cpu.items()})
    c.drop()
    load = (round(load_start, 2), round(os.getloadavg()[0], 2))
    print(f"load average (1 min) at the start and the end: {load[0]}, {load[1]}")
    print(f"data: {args.files} files x {args.rows:,} rows (trips: {TRIPS_SCHEMA}), gzip CSV; "
          f"3 ClickHouse {query(c.urls[0], 'SELECT version()').strip()} servers on 127.0.0.1, "
          f"shards weighted 1/2/1, Distributed(..., {KEY}); {os.cpu_count()} cores shared")
    baseline = SYNC2 if SYNC2 in timings else CHLOAD
    result = print_ratios("cluster target: 3 shards weighted 1/2/1", timings, baseline, None)
    others = [(t.median, name) for name, t in timings.items() if name not in (CHLOAD, BASE)]
    if others:
        fastest = min(others)
        speed = fastest[0] / timings[CHLOAD].median
        print(f"chload speed vs the fastest other method ({fastest[1]}): {speed:.2f}x "
              "(that method's median time / chload's)")
        result["chload_vs_fastest"] = {"fastest": fastest[1], "speed": speed}
        span = median_or_none([x for x in spans.get(CHLOAD, [])[-args.repeats:] if x])
        if span:
            print(f"chload's rows span (first data byte to the end of the last data request, "
                  f"median) {span:.3f} s: the fastest other method's time / it "
                  f"{fastest[0] / span:.2f}x; chload's time beyond it (start, commit tail) "
                  f"{timings[CHLOAD].median - span:.3f} s")
            result["chload_rows_span"] = {"seconds": span, "speed": fastest[0] / span}
    result["load_average"] = {"start": load[0], "end": load[1]}
    result.update(extra)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


def _cpu_and_pairs(timings: dict, cpu: dict[str, list[float]]) -> dict:
    """Print each method's CPU per run and, with a base tree, the paired ratios (this
    tree's run / the base's in the same round); return them for the JSON."""
    for name, runs in cpu.items():
        print(f"CPU (3 servers + loader) {name}: median {statistics.median(runs):.3f} s "
              f"({' '.join(f'{x:.2f}' for x in runs)})")
    extra: dict = {"cpu_seconds": cpu}
    if BASE in timings:
        wall = [a / b for a, b in zip(timings[CHLOAD].seconds, timings[BASE].seconds,
                                      strict=True)]
        used = [a / b for a, b in zip(cpu[CHLOAD], cpu[BASE], strict=True)]
        print(f"this tree / base, paired by round: wall median {statistics.median(wall):.3f} "
              f"({' '.join(f'{x:.3f}' for x in wall)}); CPU median "
              f"{statistics.median(used):.3f} ({' '.join(f'{x:.3f}' for x in used)})")
        extra["paired_vs_base"] = {"wall": wall, "cpu": used}
    return extra


def _cpu(pids: list[int]) -> float:
    """CPU seconds so far of the servers `pids` and of this process's waited children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + children.ru_utime + children.ru_stime


def _tree() -> str:
    """The tree this bench is in (its chload is the one measured as CHLOAD)."""
    return os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


if __name__ == "__main__":
    main()
