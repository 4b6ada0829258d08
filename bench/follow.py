"""`chload load --follow` of S3 objects (a real MinIO) into a ClickHouse 18.16 server.

Two figures, measured in one run:

1. Lag under a steady stream: a writer puts `--rate` objects a second (`--rows` trips rows
   each, gzip CSV) for `--seconds` while `chload load s3://bench/stream/ --follow --poll P
   --after-last-key` runs. Each object's lag is the time from its PUT's answer to its
   commit (its `loaded` event in the ledger); the bar is a lag under two poll intervals
   (an object is taken when listed: at most one interval, plus the poll's load). Each
   poll's listing calls are printed too (with --after-last-key: the new keys' page).
2. Exactly once through restarts (`--only kills`, the full form of
   tests/integration/test_follow.py's): an object a second for `--kill-seconds` (60)
   while `--follow --poll 1` runs, SIGTERM at five random instants, each followed by a
   restart; every row must be in the table once at the end, every exit 0.
3. Catching up: `--backlog` such objects already there. The follow's first poll (its
   `seconds`, from its JSON event) against a one-shot `chload load` of the same objects
   into another table (the report's `seconds`), alternating, `--repeats` times; the bar
   is a speed of at least 0.95x the one-shot's (ratio = one-shot seconds / first poll).

4. What an empty poll costs over a long history (`--only history`): `--history`
   `loaded` events in the ledger, then a follow of an empty directory; each poll's
   seconds, against `--baseline` (another checkout) in the same run.

    python bench/follow.py [--rate 10] [--rows 100000] [--seconds 60] [--poll 1]
                           [--backlog 200] [--repeats 3] [--kill-seconds 60]
                           [--history 1000000] [--history-polls 6] [--baseline DIR]
                           [--only lag|kills|backlog|history] [--json OUT]

Starts its own MinIO and 18.16 server (scripts/services) on 127.0.0.1, stops them by
PID at the end. Data: bench/common.py make_trips (cached under CHLOAD_BENCH_CACHE).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "services"))
import services  # noqa: E402
from common import CACHE, compile_chload, make_trips, query  # noqa: E402

BUCKET = "bench"


class Follower:
    """A `chload load ... --follow --json` process, its poll events read on a thread."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, **env}, cwd=cwd)
        self.events: queue.Queue[tuple[float, dict]] = queue.Queue()
        self.polls: list[tuple[float, dict]] = []
        self.err: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr or []),
                         daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout or []:
            if line.startswith('{"event": "poll"'):
                self.events.put((time.perf_counter(), json.loads(line)))

    def next_poll(self, timeout: float = 900) -> tuple[float, dict]:
        try:
            got = self.events.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            sys.exit(f"no poll within {timeout} s: {''.join(self.err)[-2000:]}")
        self.polls.append(got)
        return got

    def drain(self) -> list[tuple[float, dict]]:
        """The poll events read but not yet taken (after the process ended)."""
        out = []
        while not self.events.empty():
            out.append(self.events.get())
        return out

    def until(self, done: Callable[[dict], bool]) -> None:
        while not done(self.next_poll()[1]):
            pass

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=300)
        self.reader.join(timeout=10)  # (its last lines)
        if code != 0:
            sys.exit(f"the follow exited {code}: {''.join(self.err)[-2000:]}")


TARGET_QUERY = ""  # --push: added to the server's URL where chload loads (?path=push)


def load_argv(source: str, table: str, server: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "chload", "load", source, "--table", table,
            "--target", server + TARGET_QUERY, "--json", *extra]


def upload(client: object, path: str, key: str) -> int:
    """PUT one object; the time (ns) its answer came."""
    client.upload_file(path, BUCKET, key)  # type: ignore[attr-defined]
    return time.time_ns()


def lag(args: argparse.Namespace, client: object, server: str, env: dict[str, str],
        data: list[str]) -> dict:
    """Part 1: the steady stream and each object's lag."""
    count = args.rate * args.seconds
    put_ns: dict[str, int] = {}

    def write() -> None:
        begin = time.perf_counter()
        for i in range(count):
            time.sleep(max(0.0, begin + i / args.rate - time.perf_counter()))
            key = f"stream/{i:05d}.csv.gz"
            put_ns[f"s3://{BUCKET}/{key}"] = upload(client, data[i % len(data)], key)

    follow = Follower(load_argv(f"s3://{BUCKET}/stream/", "stream", server, "--follow",
                                "--poll", str(args.poll), "--after-last-key",
                                "--schema", "id UInt64, miles UInt32, duration UInt32, "
                                "vehicle_id UInt8"), env)
    follow.next_poll()  # (the first, empty: the table made, the engine warm)
    writer = threading.Thread(target=write)
    writer.start()
    writer.join()
    follow.until(lambda poll: poll["files"] == 0)
    follow.stop()
    ledger = subprocess.run([sys.executable, "-m", "chload", "files", "--table", "stream",
                             "--target", server, "--json"], capture_output=True, text=True,
                            env={**os.environ, **env}, check=True)
    loaded = {e["uri"]: e["seq"] for e in json.loads(ledger.stdout) if e["state"] == "loaded"}
    lags = sorted((loaded[uri] - ns) / 1e9 for uri, ns in put_ns.items() if uri in loaded)
    rows = int(query(server, "SELECT count() FROM stream"))
    polls = [p for _, p in follow.polls[1:]]
    calls = [p["listing_calls"] for p in polls]
    figures = {
        "objects": count, "loaded": len(lags), "rows": rows,
        "rows_expected": count * args.rows, "poll_seconds": args.poll,
        "lag_p50_s": statistics.median(lags), "lag_p95_s": lags[int(len(lags) * 0.95) - 1],
        "lag_max_s": lags[-1], "polls": len(polls),
        "listing_calls_per_poll_max": max(calls), "listing_calls_total": sum(calls),
        "poll_seconds_max": max(p["seconds"] for p in polls),
    }
    print(f"# steady stream: {args.rate} objects/s x {args.rows:,} rows for {args.seconds} s "
          f"into 18.16, --poll {args.poll:g}")
    print(f"objects loaded {len(lags)}/{count}, rows {rows:,} (expected {count * args.rows:,})")
    print(f"lag p50 {figures['lag_p50_s']:.2f} s, p95 {figures['lag_p95_s']:.2f} s, max "
          f"{figures['lag_max_s']:.2f} s; max / poll interval = "
          f"{figures['lag_max_s'] / args.poll:.2f} (bar: < 2)")
    print(f"polls {len(polls)}, listing calls per poll at most {max(calls)}, the longest "
          f"poll {figures['poll_seconds_max']:.2f} s")
    return figures


def kills(args: argparse.Namespace, client: object, server: str, env: dict[str, str],
          data: list[str]) -> dict:
    """Part 2: SIGTERM at five random instants of a minute of arriving objects, each
    followed by a restart; the table's rows counted against what was put."""
    count = args.kill_seconds
    argv = load_argv(f"s3://{BUCKET}/kills/", "kills", server, "--follow", "--poll", "1",
                     "--after-last-key")

    def write() -> None:
        for i in range(count):
            upload(client, data[i % len(data)], f"kills/{i:05d}.csv.gz")
            time.sleep(1)

    writer = threading.Thread(target=write)
    writer.start()
    moments = sorted(random.uniform(2, count - 2) for _ in range(5))
    began, loaded = time.perf_counter(), 0
    for moment in moments:
        follow = Follower(argv, env)
        follow.next_poll()  # (signals are caught once the load began: its first poll)
        time.sleep(max(0.0, began + moment - time.perf_counter()))
        follow.stop()  # (exits 0, or the bench stops)
        loaded += sum(p["files"] for _, p in follow.polls + follow.drain())
    writer.join()
    last = Follower(argv, env)
    last.until(lambda poll: poll["files"] == 0)
    last.stop()
    loaded += sum(p["files"] for _, p in last.polls + last.drain())
    rows = int(query(server, "SELECT count() FROM kills"))
    print(f"# five SIGTERMs and restarts while {count} objects arrive, one a second")
    print(f"SIGTERM at {', '.join(f'{m:.1f}' for m in moments)} s; objects loaded {loaded} "
          f"of {count}; rows {rows:,} (expected {count * args.rows:,}): "
          f"{'each once' if rows == count * args.rows and loaded == count else 'WRONG'}")
    return {"objects": count, "moments_s": moments, "objects_loaded": loaded, "rows": rows,
            "rows_expected": count * args.rows}


def backlog(args: argparse.Namespace, server: str, env: dict[str, str]) -> dict:
    """Part 2: a follow's first poll over a backlog against a one-shot load of it."""
    source = f"s3://{BUCKET}/backlog/"
    one_shot: list[float] = []
    first_poll: list[float] = []
    walls: dict[str, list[float]] = {"one-shot": [], "follow": []}

    def once(n: int) -> None:
        began = time.perf_counter()
        done = subprocess.run(load_argv(source, f"once_{n}", server), capture_output=True,
                              text=True, env={**os.environ, **env}, timeout=900)
        walls["one-shot"].append(time.perf_counter() - began)  # (start to exit)
        if done.returncode != 0:
            sys.exit(f"one-shot load failed: {done.stderr[-2000:]}")
        one_shot.append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])

    def followed(n: int) -> None:
        follow = Follower(load_argv(source, f"follow_{n}", server, "--follow", "--poll",
                                    str(args.poll)), env)
        at, poll = follow.next_poll()
        walls["follow"].append(at - follow.started)  # (start to the first poll's line)
        follow.stop()
        if poll["files"] != args.backlog:
            sys.exit(f"the first poll loaded {poll['files']} of {args.backlog} objects")
        first_poll.append(poll["seconds"])

    for n in range(args.repeats):
        for step in ((once, followed) if n % 2 == 0 else (followed, once)):
            step(n)
    ratio = statistics.median(one_shot) / statistics.median(first_poll)
    print(f"# backlog: {args.backlog} objects x {args.rows:,} rows into 18.16")
    print(f"one-shot load          median {statistics.median(one_shot):8.2f} s  runs "
          + " ".join(f"{s:.2f}" for s in one_shot))
    print(f"--follow, first poll   median {statistics.median(first_poll):8.2f} s  runs "
          + " ".join(f"{s:.2f}" for s in first_poll))
    print(f"speed ratio (follow / one-shot) {ratio:.3f} (bar: >= 0.95)")
    wall = statistics.median(walls["one-shot"]) / statistics.median(walls["follow"])
    print(f"whole processes: one-shot start to exit median "
          f"{statistics.median(walls['one-shot']):.2f} s, follow start to its first poll "
          f"{statistics.median(walls['follow']):.2f} s: speed ratio {wall:.3f}")
    return {"objects": args.backlog, "rows_per_object": args.rows,
            "one_shot_seconds": one_shot, "first_poll_seconds": first_poll,
            "speed_ratio": ratio, "wall_seconds": walls, "wall_speed_ratio": wall}


def history(args: argparse.Namespace, server: str, work: str) -> dict:
    """Part 4: what an empty poll costs over a long history. The ledger is given
    `--history` `loaded` events of the table (made by the engine: INSERT ... SELECT from
    numbers()), then a follow of an empty directory polls `--history-polls` times; each
    poll's seconds, for this checkout and for `--baseline` (another checkout, as
    PYTHONPATH), alternating, `--repeats` times."""
    source = os.path.join(work, "empty")
    os.makedirs(source, exist_ok=True)
    seed = os.path.join(work, "seed.csv")
    with open(seed, "w") as out:
        out.write("id\n1\n")
    done = subprocess.run(load_argv(seed, "hist", server), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"seeding the table failed: {done.stderr[-2000:]}")
    query(server, "INSERT INTO chload.files (target_table, uri, identity, size, mtime_ns, "
                  "state, rows, seq) SELECT 'default.hist', concat('/history/', "
                  "toString(number), '.csv'), '1:1', 1, 1, 'loaded', 1, number + 1 FROM "
                  f"numbers({args.history})", timeout=600)
    checkouts = {"this": os.path.join(HERE, "..")}
    if args.baseline:
        checkouts["baseline"] = args.baseline
    seconds: dict[str, list[list[float]]] = {name: [] for name in checkouts}
    for n in range(args.repeats):
        for name in (list(checkouts) if n % 2 == 0 else list(checkouts)[::-1]):
            checkout = os.path.abspath(checkouts[name])  # (python -m: its folder first)
            follow = Follower(load_argv(source, "hist", server, "--follow", "--poll", "0.2"),
                              {"PYTHONPATH": checkout}, cwd=checkout)
            polls = [follow.next_poll()[1] for _ in range(args.history_polls)]
            follow.stop()
            seconds[name].append([p["seconds"] for p in polls])
    print(f"# an empty poll over a ledger of {args.history:,} units (18.16)")
    figures: dict = {"units": args.history, "poll_seconds": seconds}
    for name, runs in seconds.items():
        first = statistics.median(r[0] for r in runs)
        later = statistics.median(s for r in runs for s in r[1:])
        figures[f"{name}_first_s"], figures[f"{name}_later_median_s"] = first, later
        print(f"{name:9s} first poll median {first:.3f} s, later polls median {later:.3f} s")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=10, help="objects a second")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per object")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--backlog", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kill-seconds", type=int, default=60)
    parser.add_argument("--history", type=int, default=1_000_000,
                        help="ledger units before an empty follow (--only history)")
    parser.add_argument("--history-polls", type=int, default=6)
    parser.add_argument("--baseline", help="another checkout to measure --only history "
                        "against (its folder, as PYTHONPATH)")
    parser.add_argument("--only", choices=["lag", "kills", "backlog", "history"])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--push", action="store_true", help="the target URL asks the loader's "
                        "engine to parse every object (?path=push), not the server (relay)")
    args = parser.parse_args()
    files = max(args.backlog, min(args.rate * args.seconds, 200))
    data = [] if args.only == "history" else make_trips(
        os.path.join(CACHE, f"trips-csvgz-{files}x{args.rows}"), files, args.rows)
    compile_chload()
    result: dict = {"load_average_start": os.getloadavg()[0]}
    print(f"load average at start {result['load_average_start']:.1f} (2 cores)")
    work = tempfile.mkdtemp(prefix="chload-bench-follow-")
    minio = services.start_minio(Path(work))
    clickhouse = services.start_clickhouse_server(Path(work))
    global TARGET_QUERY
    TARGET_QUERY = "/default?path=push" if args.push else ""
    target = clickhouse.url
    try:
        services.minio_create_bucket(minio, BUCKET)
        client = services.minio_client(minio)
        env = {"AWS_ENDPOINT_URL": minio.url,
               "AWS_ACCESS_KEY_ID": minio.credentials["access_key"],
               "AWS_SECRET_ACCESS_KEY": minio.credentials["secret_key"]}
        if args.only in (None, "lag"):
            result["lag"] = lag(args, client, target, env, data)
        if args.only in (None, "kills"):
            result["kills"] = kills(args, client, target, env, data)
        if args.only == "history":
            result["history"] = history(args, clickhouse.url, work)
        if args.only in (None, "backlog"):
            for i, path in enumerate(data[:args.backlog]):
                upload(client, path, f"backlog/{i:05d}.csv.gz")
            result["backlog"] = backlog(args, target, env)
    finally:
        clickhouse.stop()
        minio.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["load_average_end"] = os.getloadavg()[0]
    print(f"load average at end {result['load_average_end']:.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
