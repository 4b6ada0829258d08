"""Relay against push into one 18.16 server, alternated, in one run.

20 gzip CSV objects (20M trips rows) of the large tier's MinIO cache (made once by
`python3 bench/large.py --large`), loaded as stored (the relay) and through
`?path=push` (the loader's engine parses and sends Native), `--rounds` times each; per
load: wall seconds, the loader's CPU seconds and the server's.

    python3 bench/relay_ab.py [--rounds 3] [--json OUT]

Starts the cache's MinIO and its own 18.16 server (temporary directory) on 127.0.0.1,
stops both by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TREE, "scripts", "services"))
import services  # noqa: E402

SOURCE = "s3://bench/trips-1000000000x1000000/trips_000{0,1}?.csv.gz"
SCHEMA = "id UInt64, miles UInt32, duration UInt32, vehicle_id UInt8"
CACHE = os.path.expanduser("~/.cache/chload/bench/large")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chload-relay-ab-"))
    minio = services.start_minio(Path(CACHE), name="minio-large")
    server = services.start_clickhouse_server(work, name="ch")
    env = {**os.environ, "AWS_ENDPOINT_URL": minio.url, "PYTHONPATH": TREE,
           "AWS_ACCESS_KEY_ID": minio.credentials["access_key"],
           "AWS_SECRET_ACCESS_KEY": minio.credentials["secret_key"],
           "CLICKHOUSE_PASSWORD": server.credentials["password"]}
    rows = []
    try:
        for n in range(args.rounds):
            for path in ("relay", "push"):
                rows.append(one(server, env, path, f"t_{path}_{n}"))
                print(rows[-1], flush=True)
    finally:
        server.stop()
        minio.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def one(server: services.Service, env: dict[str, str], path: str, table: str) -> dict:
    url = f"http://loader@127.0.0.1:{server.ports['http']}/default"
    url += "?path=push" if path == "push" else ""
    server_before, began = _cpu(server.pid), time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "chload", "load", SOURCE, "--table", table,
                           "--target", url, "--format", "CSVWithNames", "--schema", SCHEMA],
                          env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    seconds = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    count = services.clickhouse_query(server, f"SELECT count() FROM {table}").strip()
    services.clickhouse_query(server, f"DROP TABLE {table}")
    return {"path": path, "seconds": round(seconds, 2), "rows": int(count or 0),
            "loader_cpu_s": round(after.ru_utime + after.ru_stime
                                  - before.ru_utime - before.ru_stime, 1),
            "server_cpu_s": round(_cpu(server.pid) - server_before, 1),
            "load_average": round(os.getloadavg()[0], 1), "exit": done.returncode}


def _cpu(pid: int | None) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
