"""Where the 3-shard cluster's servers spend their CPU: the hand posts against chload trees.

    python3 bench/cluster_costs.py [--objects 100] [--rounds 2] --trees A[:ARGS],B ...
        [--json OUT]

The large tier's objects (bench/large.py: gzip CSV objects of 1M trips rows in a MinIO
kept in its cache; `--objects` of the 100M set, 10 to 100, made first by
`python3 bench/large.py --rows 100000000`) loaded, alternately, by curl into the
Distributed table two at a time (insert_distributed_sync=1) and by `chload load` of each
tree (PYTHONPATH=the tree; `:ARGS` adds arguments, e.g. `/tmp/t:--workers 4`), each into a
fresh table over three 18.16 servers (shards weighted 1/2/1) started with their query and
part logs on. For every run: wall seconds, the loader's CPU, the servers' CPU (from /proc),
and per shard the CPU of its queries by kind (chload's route inserts, ledger writes, stage
DDL, seals, attaches, surveys; the hand's inserts) and its parts written and merged by
table. Checked exact. Services on 127.0.0.1, stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "services"))
import clusters  # noqa: E402
import services  # noqa: E402
from common import CACHE, trips_select  # noqa: E402
from large_targets import CHECKSUM, Cluster, _proc_counters  # noqa: E402
from large_watch import run_plain, watch  # noqa: E402

PREFIX = "trips-100000000x1000000"
_LOGS = {"database": "system", "flush_interval_milliseconds": 500}
_CPU = ("ProfileEvents.Values[indexOf(ProfileEvents.Names, 'UserTimeMicroseconds')] + "
        "ProfileEvents.Values[indexOf(ProfileEvents.Names, 'SystemTimeMicroseconds')]")
_KIND = ("multiIf(query LIKE 'INSERT INTO chload.files%', 'ledger write', query LIKE "
         "'INSERT INTO chload.stage%', 'route insert', query LIKE 'INSERT INTO %', 'insert', "
         "query LIKE '% chload.lock%', 'lock', query LIKE 'CREATE%', 'create', query LIKE "
         "'DROP%', 'drop', query LIKE 'ALTER%', 'attach', query LIKE 'OPTIMIZE%', 'seal', "
         "query LIKE '%system.parts%', 'seal check', query LIKE '%chload.files%', "
         "'ledger read', 'other')")


def _logged_servers() -> None:
    """The cluster's servers log every query and part (for this process only)."""
    users, service = services._users_xml, clusters.clickhouse_service

    def users_xml(password: str) -> ET.Element:
        root = users(password)
        ET.SubElement(root.find("profiles/default"), "log_queries").text = "1"  # type: ignore[arg-type]
        return root

    def logged(*args: object, **kwargs: object) -> services.Service:
        kwargs["extra_config"] = {**(kwargs.get("extra_config") or {}),  # type: ignore[dict-item]
                                  "query_log": {**_LOGS, "table": "query_log"},
                                  "part_log": {**_LOGS, "table": "part_log"}}
        return service(*args, **kwargs)  # type: ignore[arg-type]

    services._users_xml, clusters.clickhouse_service = users_xml, logged  # type: ignore[assignment]


def _sql(url: str, sql: str) -> list[list[str]]:
    with urllib.request.urlopen(url + "/", data=sql.encode(), timeout=600) as answer:
        return [line.split("\t") for line in answer.read().decode().splitlines()]


def _shard(url: str, since: int, until: int) -> dict:
    _sql(url, "SYSTEM FLUSH LOGS")
    queries = _sql(url, f"SELECT {_KIND} AS kind, count(), round(sum({_CPU}) / 1e6, 3) FROM "
                        "system.query_log WHERE type = 2 AND event_time BETWEEN "
                        f"{since} AND {until} GROUP BY kind ORDER BY kind FORMAT TSV")
    parts = _sql(url, "SELECT event_type, if(table LIKE 'stage%', 'stage', table) AS t, "
                      "count(), sum(rows) FROM system.part_log WHERE event_time BETWEEN "
                      f"{since} AND {until} GROUP BY event_type, t ORDER BY t FORMAT TSV")
    return {"queries": {k: {"count": int(n), "cpu_s": float(c)} for k, n, c in queries},
            "parts": {f"{e} {t}": {"count": int(n), "rows": int(r)} for e, t, n, r in parts}}


def _run(target: Cluster, what: str, run: object) -> dict:
    target.fresh()
    time.sleep(1)
    since = int(time.time())
    before = _proc_counters(target.pids)[0]
    watched = run()  # type: ignore[operator]
    servers = _proc_counters(target.pids)[0] - before
    until = int(time.time())
    time.sleep(1.1)  # (the check below is not the run's: a second of its own in the logs)
    if watched.returncode:
        sys.exit(f"{what} failed ({watched.returncode}):\n{watched.tail}")
    out = {"run": what, "seconds": round(watched.seconds, 2),
           "loader_cpu_s": round(watched.cpu_s, 2), "servers_cpu_s": round(servers, 2),
           "load_average": round(os.getloadavg()[0], 1), "exact": target.checksum() == _want,
           "shards": [_shard(u, since, until) for u in target.urls]}
    queries = [round(sum(q["cpu_s"] for k, q in s["queries"].items() if k not in (
        "route insert", "insert")), 2) for s in out["shards"]]
    print(f"{what:40} {out['seconds']:7.1f} s  loader CPU {out['loader_cpu_s']:5.1f}  servers' "
          f"CPU {servers:6.1f}  beside the rows' inserts {queries}  load "
          f"{out['load_average']}  exact {out['exact']}", flush=True)
    return out


_want: list[int] = []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=100, choices=range(10, 101, 10))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--trees", nargs="+", required=True)
    p.add_argument("--json")
    a = p.parse_args()
    cache = os.path.join(CACHE, "large")
    names = [f"{PREFIX}/trips_{i:05d}.csv.gz" for i in range(a.objects)]
    glob = (f"s3://bench/{PREFIX}/*.csv.gz" if a.objects == 100 else
            f"s3://bench/{PREFIX}/trips_000[0-{a.objects // 10 - 1}]*.csv.gz")
    _logged_servers()
    minio = services.start_minio(Path(cache), name="minio-large")
    work = tempfile.mkdtemp(prefix="chload-cluster-costs-")
    target = None
    results: list[dict] = []
    try:
        key, secret = minio.credentials["access_key"], minio.credentials["secret_key"]
        target = Cluster(work, {"glob_url": "", "key": key, "secret": secret})
        client = services.minio_client(minio)
        urls = os.path.join(work, "objects.urls")
        Path(urls).write_text("".join(client.generate_presigned_url(  # type: ignore[attr-defined]
            "get_object", Params={"Bucket": "bench", "Key": n}, ExpiresIn=86400) + "\n"
            for n in names))
        import chdb  # the rows' figures from the generator itself, as bench/large.py

        _want[:] = [int(x) for x in chdb.query(f"SELECT {CHECKSUM} FROM ("
                                               f"{trips_select(0, a.objects * 1_000_000)})",
                                               "TSV").bytes().split()]
        print(f"{a.objects} objects, {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
        env = {"AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": key,
               "AWS_SECRET_ACCESS_KEY": secret, "PYTHONSAFEPATH": "1"}
        for _ in range(a.rounds):
            results.append(_run(target, "curl -> Distributed, 2 at a time",
                                lambda: run_plain(target.hand(urls, 2), env)[0]))
            for spec in a.trees:
                tree, _, extra = spec.partition(":")
                results.append(_run(target, f"chload {spec}", lambda tree=tree, extra=extra: watch(
                    [*target.chload(glob), *extra.split()], {**env, "PYTHONPATH": tree},
                    a.objects * 1_000_000)))
    finally:
        if target is not None:
            target.stop()
        minio.stop()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
