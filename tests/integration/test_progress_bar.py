"""The progress bar as a terminal shows it (cli/render.py), for objects in S3 (MinIO)
loaded into the 3-shard 18.16 cluster: its rows count the rows loaded (the cluster's
units said 0 rows until their commit), and its bytes never pass the total (the loader's
engine counts more bytes read from S3 than the objects' listed sizes: the bar was full,
its ETA 0:00:00, with a fifth of the load left)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path

import pytest
import services
from common import make_trips
from test_cluster import make_tables, shard_args

FILES, ROWS = 2, 1_000_000
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_FRAME = re.compile(r"(\d+)/\d+ files ([\d.]+)/([\d.]+) (?:bytes|kB|MB) ([\d,]+) rows")


@pytest.fixture(scope="module")
def objects(minio: services.Service, tmp_path_factory: pytest.TempPathFactory) -> str:
    paths = make_trips(str(tmp_path_factory.mktemp("bar-trips")), FILES, ROWS)
    bucket = f"bar-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, bucket)
    client = services.minio_client(minio)
    for path in paths:
        client.upload_file(path, bucket, f"trips/{os.path.basename(path)}")  # type: ignore
    return f"s3://{bucket}/trips/*.csv.gz"


def on_terminal(argv: list[str], env: dict[str, str], timeout: float = 240) -> tuple[int, str]:
    """Run `argv` with a 200-column terminal as its stdout and stderr; its exit code and
    all it drew (escapes removed)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env={**os.environ, **env, "COLUMNS": "200", "TERM": "xterm"},
                            start_new_session=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 1)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the process ended
                break
            if not chunk:
                break
            out += chunk
    os.close(master)
    try:
        code = proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    return code, _ANSI.sub("", out.decode(errors="replace"))


def test_the_bar_counts_rows_and_bytes_up_to_the_total_into_a_cluster(
        weighted_cluster: services.ClickHouseCluster, minio: services.Service,
        objects: str, tmp_path: Path) -> None:
    table = make_tables(weighted_cluster, "cityHash64(id)")
    env = {"AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": minio.credentials["access_key"],
           "AWS_SECRET_ACCESS_KEY": minio.credentials["secret_key"], "AWS_SESSION_TOKEN": "",
           "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    code, drawn = on_terminal([sys.executable, "-m", "chload", "load", objects, "--table",
                               table, "--target", f"{weighted_cluster.servers[0].url}/default",
                               *shard_args(weighted_cluster)], env)
    assert code == 0, drawn[-2000:]
    assert f"{FILES * ROWS:,} rows" in drawn  # the summary: it loaded
    frames = [(int(files), float(done), float(total), int(rows.replace(",", "")))
              for files, done, total, rows in _FRAME.findall(drawn)]
    assert frames, drawn[-2000:]
    assert all(done <= total for _, done, total, _ in frames), frames
    assert max(rows for *_, rows in frames) > 0, frames
    # a frame with units done shows their rows
    assert all(rows >= files * ROWS for files, _, _, rows in frames), frames
