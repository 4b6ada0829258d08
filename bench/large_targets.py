"""The three targets of the large tier, each with its fastest hand-made load beside chload.

- embedded: chload's embedded chDB target; hand: one chDB `INSERT INTO t SELECT * FROM
  s3(glob)` in a process of its own.
- server: one ClickHouse 18.16 server; hand: each object fetched from MinIO and posted
  (gzip, as stored) into the server, N at a time (`xargs -P N`, `curl | curl`).
- cluster: three 18.16 servers, shards weighted 1/2/1 (scripts/services/clusters.py),
  a Distributed(..., cityHash64(id)) table; hand: the same posts into the Distributed
  table with insert_distributed_sync=1 (the server splits the rows among the shards).

Each target makes a fresh empty table before every load (the previous one dropped, so
the disk holds one stored copy at a time), reads the table's count and checksum, and the
servers' own counters (CPU seconds, bytes written: /proc; bytes stored: system.parts).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

from common import TRIPS_SCHEMA, query

# The checksum of a trips table: the same figures from the generator's rows (large.py)
CHECKSUM = "count(), sum(cityHash64(id)), sum(miles), sum(duration), sum(vehicle_id)"
KEY = "cityHash64(id)"
WEIGHTS = (1, 2, 1)
DB = "bench_large"
# Parts merged away are removed after 30 s, not 18.16's 8 minutes: at a billion rows one
# server's directory held 43 GB for a table of 10 GB, and three shards filled the disk.
SERVER_TABLE_SETTINGS = "SETTINGS old_parts_lifetime = 30"

_CHDB = r"""
import sys, chdb.session
s = chdb.session.Session(sys.argv[1])
for sql in sys.argv[2:]:
    print(s.query(sql, 'TSV').bytes().decode(), end='')
s.close()
"""


def chdb_in(path: str, *sql: str) -> str:
    """Statements in a chDB session on `path`, in a process of its own (it ends before
    anything else opens that directory)."""
    done = subprocess.run([sys.executable, "-c", _CHDB, path, *sql], capture_output=True,
                          text=True, timeout=48 * 3600)
    if done.returncode:
        sys.exit(f"chDB at {path}: {done.stderr[-1500:]}")
    return done.stdout


def _proc_counters(pids: list[int]) -> tuple[float, int]:
    """CPU seconds (user + system) and bytes written to storage so far by `pids`."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu, written = 0.0, 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / tick
        with open(f"/proc/{pid}/io") as io:
            written += int(dict(line.split(": ") for line in io.read().splitlines())[
                "write_bytes"])
    return cpu, written


class Embedded:
    """chload's embedded target: the loader is the engine (its own CPU and writes are the
    engine's: read from wait4 by the watcher)."""

    name = "embedded"
    has_server = False

    def __init__(self, work: str, s3: dict[str, str]) -> None:
        self.work, self.s3, self.n, self.path = work, s3, 0, ""

    def fresh(self) -> None:
        self.drop()
        self.n += 1
        self.path = os.path.join(self.work, f"embedded-{self.n}")
        chdb_in(self.path, f"CREATE TABLE trips ({TRIPS_SCHEMA}) ENGINE = MergeTree ORDER BY id")

    def drop(self) -> None:
        if self.path:
            shutil.rmtree(self.path, ignore_errors=True)

    def chload(self, source: str) -> list[str]:
        return [sys.executable, "-m", "chload", "load", source, "--table", "trips",
                "--target", self.path, "--format", "CSVWithNames", "--schema", TRIPS_SCHEMA]

    def hand(self, urls_file: str, parallel: int) -> list[str]:
        url = self.s3["glob_url"]
        sql = (f"INSERT INTO trips SELECT * FROM s3('{url}', '{self.s3['key']}', "
               f"'{self.s3['secret']}', CSVWithNames, '{TRIPS_SCHEMA}')")
        return [sys.executable, "-c", _CHDB, self.path, sql]

    def checksum(self) -> list[int]:
        return [int(x) for x in chdb_in(self.path, f"SELECT {CHECKSUM} FROM trips").split()]

    def counters(self) -> tuple[float, int]:
        return 0.0, 0

    def stored_bytes(self) -> int:
        return int(chdb_in(self.path, "SELECT sum(bytes_on_disk) FROM system.parts WHERE "
                                      "active AND table = 'trips'") or 0)

    def stop(self) -> None:
        self.drop()


class Server:
    """One ClickHouse 18.16 server (its own, under the work directory)."""

    name = "server"
    has_server = True

    def __init__(self, work: str, s3: dict[str, str]) -> None:
        import services

        self.s3, self.n, self.table = s3, 0, ""
        self.service = services.start_clickhouse_server(Path(work), name="clickhouse-large")
        self.url, self.pids = self.service.url, [self.service.pid]
        query(self.url, f"CREATE DATABASE IF NOT EXISTS {DB}")

    def fresh(self) -> None:
        self.drop()
        self.n += 1
        self.table = f"trips_{self.n}"
        query(self.url, f"CREATE TABLE {DB}.{self.table} ({TRIPS_SCHEMA}) "
                        f"ENGINE = MergeTree ORDER BY id {SERVER_TABLE_SETTINGS}")

    def drop(self) -> None:
        if self.table:
            query(self.url, f"DROP TABLE IF EXISTS {DB}.{self.table}")

    def chload(self, source: str) -> list[str]:
        return [sys.executable, "-m", "chload", "load", source, "--table", self.table,
                "--target", f"{self.url}/{DB}", "--format", "CSVWithNames",
                "--schema", TRIPS_SCHEMA]

    def insert_url(self) -> str:
        sql = f"INSERT INTO {DB}.{self.table} FORMAT CSVWithNames"
        return f"{self.url}/?{urllib.parse.urlencode({'query': sql})}"

    def hand(self, urls_file: str, parallel: int) -> list[str]:
        """Each object (a presigned URL, one a line of `urls_file`) fetched and posted as
        stored (gzip), `parallel` at a time."""
        return ["sh", "-c", "export INSERT_URL=\"$0\"; "
                f"xargs -d '\\n' -n 1 -P {parallel} sh -c 'curl -sSf \"$1\" | curl -sSf "
                "-H \"Content-Encoding: gzip\" --data-binary @- \"$INSERT_URL\"' _ "
                f"< {shlex.quote(urls_file)}", self.insert_url()]

    def checksum(self) -> list[int]:
        return [int(x) for x in query(self.url, f"SELECT {CHECKSUM} FROM {DB}.{self.table}",
                                      timeout=3600).split()]

    def counters(self) -> tuple[float, int]:
        return _proc_counters(self.pids)

    def stored_bytes(self) -> int:
        return int(query(self.url, "SELECT sum(bytes) FROM system.parts WHERE active AND "
                                   f"database = '{DB}' AND table = '{self.table}'") or 0)

    def stop(self) -> None:
        self.service.stop()


class Cluster(Server):
    """Three 18.16 servers, shards weighted 1/2/1, a Distributed table over them."""

    name = "cluster"

    def __init__(self, work: str, s3: dict[str, str]) -> None:  # noqa: D107
        import services

        self.s3, self.n, self.table = s3, 0, ""
        self.cluster = services.start_weighted_cluster(Path(work), WEIGHTS)
        self.urls = self.cluster.urls
        self.url, self.pids = self.urls[0], [s.pid for s in self.cluster.servers]
        for url in self.urls:
            query(url, f"CREATE DATABASE IF NOT EXISTS {DB}")

    def fresh(self) -> None:
        self.drop()
        self.n += 1
        self.table = f"trips_{self.n}"
        for url in self.urls:
            query(url, f"CREATE TABLE {DB}.{self.table}_local ({TRIPS_SCHEMA}) "
                       f"ENGINE = MergeTree ORDER BY id {SERVER_TABLE_SETTINGS}")
        query(self.url, f"CREATE TABLE {DB}.{self.table} AS {DB}.{self.table}_local ENGINE = "
                        f"Distributed({self.cluster.name}, {DB}, {self.table}_local, {KEY})")

    def drop(self) -> None:
        if self.table:
            query(self.url, f"DROP TABLE IF EXISTS {DB}.{self.table}")
            for url in self.urls:
                query(url, f"DROP TABLE IF EXISTS {DB}.{self.table}_local")

    def chload(self, source: str) -> list[str]:
        shards = [a for s in self.cluster.servers for a in ("--shard", f"{s.endpoint}={s.url}")]
        return [*super().chload(source), *shards]

    def insert_url(self) -> str:
        return super().insert_url() + "&insert_distributed_sync=1"

    def checksum(self) -> list[int]:
        sums = [[int(x) for x in query(url, f"SELECT {CHECKSUM} FROM {DB}.{self.table}_local",
                                       timeout=3600).split()] for url in self.urls]
        return [sum(column) % 2**64 for column in zip(*sums, strict=True)]

    def stored_bytes(self) -> int:
        return sum(int(query(url, "SELECT sum(bytes) FROM system.parts WHERE active AND "
                                  f"database = '{DB}' AND table = '{self.table}_local'") or 0)
                   for url in self.urls)

    def stop(self) -> None:
        self.cluster.stop()


TARGETS = {"embedded": Embedded, "server": Server, "cluster": Cluster}
