"""Two hand-rolled Python loaders, as users write them today (the methods chload is
measured against; run as their own processes by the suite).

    python loaders.py post  URL TABLE FORMAT PARALLEL FILE...
    python loaders.py audit URL TABLE FORMAT PARALLEL FILE...

`post` sends each file as is with `requests` (`Content-Encoding: gzip` for .gz files):
the server does all the parsing. Parallel: a thread pool (the work is the server's).

`audit` is the common way to add audit columns: read each JSON line, add
`_source_filename` and `_file_ts` (the file's mtime), re-serialise with orjson (the
fastest JSON library for Python), gzip (level 6, zlib's default, kinder than
gzip.compress's 9) and post. Parallel: a process pool, since the work is Python's and
threads would share one GIL.
"""

from __future__ import annotations

import gzip
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

import orjson
import requests


def _insert(url: str, table: str, fmt: str, body: bytes | object, gz: bool) -> None:
    headers = {"Content-Encoding": "gzip"} if gz else {}
    response = requests.post(url, params={"query": f"INSERT INTO {table} FORMAT {fmt}"},
                             data=body, headers=headers, timeout=600)
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code}: {response.text[:500]}")


def post_file(url: str, table: str, fmt: str, path: str) -> None:
    with open(path, "rb") as body:
        _insert(url, table, fmt, body, path.endswith(".gz"))


def audit_file(url: str, table: str, fmt: str, path: str) -> None:
    name = os.path.basename(path)
    file_ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(path)))
    opener = gzip.open if path.endswith(".gz") else open
    out = bytearray()
    with opener(path, "rb") as lines:
        for line in lines:
            row = orjson.loads(line)
            row["_source_filename"] = name
            row["_file_ts"] = file_ts
            out += orjson.dumps(row)
            out += b"\n"
    _insert(url, table, fmt, gzip.compress(bytes(out), compresslevel=6), True)


def run(kind: str, url: str, table: str, fmt: str, parallel: int, files: list[str]) -> None:
    work: Callable[[str, str, str, str], None] = post_file if kind == "post" else audit_file
    if parallel <= 1:
        for path in files:
            work(url, table, fmt, path)
        return
    pool: Executor = (ThreadPoolExecutor if kind == "post" else ProcessPoolExecutor)(parallel)
    with pool:
        for future in [pool.submit(work, url, table, fmt, path) for path in files]:
            future.result()


if __name__ == "__main__":
    kind, url, table, fmt, parallel, *paths = sys.argv[1:]
    run(kind, url, table, fmt, int(parallel), paths)
