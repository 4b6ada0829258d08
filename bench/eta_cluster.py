"""The progress bar's ETA into the 3-shard cluster, two trees alternated.

    python3 bench/eta_cluster.py [--rows 100000000] [--rounds 2] --trees A,B [--out F]

The large tier's data (bench/large.py: gzip CSV objects of 1M trips rows in a MinIO kept
in its cache) loaded by `chload load` of each tree in turn (PYTHONPATH=the tree) into a
fresh Distributed table over the 3-shard 18.16 cluster, on a terminal; the ETA the bar
shows when its rows reach 10%, 20% ... 90%, against the time the load in fact still took
(positive: it said too long; -100%: the bar passed the mark after its last ETA). Each
load is checked exact. Services on 127.0.0.1, stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "services"))
import large  # noqa: E402
import services  # noqa: E402
from large_targets import TARGETS  # noqa: E402
from large_watch import watch  # noqa: E402

MARKS = tuple(i / 10 for i in range(1, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--trees", required=True, help="checkouts, comma-separated")
    p.add_argument("--out", help="also write the figures here (JSON)")
    a = p.parse_args()
    args = argparse.Namespace(rows=a.rows, rows_per_object=1_000_000, parallel=2,
                              cache=os.path.join(large.CACHE, "large"))
    work = os.path.join("/tmp", f"chload-bench-eta-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    minio = services.start_minio(Path(args.cache), name="minio-large")
    results: list[dict] = []
    try:
        services.minio_create_bucket(minio, large.BUCKET)
        data = large.ensure_data(args, minio)
        s3 = {"glob_url": data["glob_url"], "key": minio.credentials["access_key"],
              "secret": minio.credentials["secret_key"]}
        target = TARGETS["cluster"](work, s3)
        try:
            for r in range(a.rounds):
                for tree in a.trees.split(","):
                    results.append(_one(target, tree, r, a.rows, data, minio, s3))
                    print(json.dumps(results[-1]), flush=True)
        finally:
            target.stop()  # type: ignore[attr-defined]
    finally:
        minio.stop()
        if a.out:
            Path(a.out).write_text(json.dumps(results, indent=1))


def _one(target: object, tree: str, round_: int, rows: int, data: dict,
         minio: services.Service, s3: dict) -> dict:
    env = {"AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": s3["key"],
           "AWS_SECRET_ACCESS_KEY": s3["secret"], "PYTHONPATH": tree, "PYTHONSAFEPATH": "1"}
    for _ in range(5):  # (a DROP of the last table may still hold the server a moment)
        try:
            target.fresh()  # type: ignore[attr-defined]
            break
        except OSError:
            time.sleep(5)
    load = os.getloadavg()[0]
    watched = watch(target.chload(data["glob"]), env, rows, marks=MARKS)  # type: ignore
    errors = {k: None if v["error"] is None else round(v["error"], 3)
              for k, v in watched.eta_errors().items()}
    return {"round": round_, "tree": tree, "seconds": round(watched.seconds, 2),
            "rc": watched.returncode,
            "exact": target.checksum() == data["checksum"],  # type: ignore[attr-defined]
            "load": [round(load, 1), round(os.getloadavg()[0], 1)], "eta_error": errors}


if __name__ == "__main__":
    main()
