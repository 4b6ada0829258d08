"""`--follow` of files end to end: the real `chload load ... --follow --poll 1` command
following a real MinIO bucket and a local directory into the embedded engine (and an
18.16 server) while files keep coming, stopped by SIGTERM or SIGINT; results checked
through SQL, and what each poll asks of the ledger counted."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import services
from conftest import run_chload
from test_remote_sources import _without_profile, s3_env

pytestmark = pytest.mark.integration


class Follower:
    """A `chload load ... --follow` process, its stdout read line by line on a thread."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chload", "load", *args, "--follow", "--poll", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._read_err, daemon=True)]
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.err += self.proc.stderr

    def wait_for(self, wanted: Callable[[str], bool], seconds: float = 60) -> str:
        """The first line (from now on) for which `wanted` holds, read within `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.proc.poll() is None, self.stop_reading()
                continue
            self.seen.append(line)
            if wanted(line):
                return line
        raise AssertionError(f"no such line within {seconds} s; seen: {self.seen[-5:]}")

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, list[str], str]:
        """Send `sig`; the exit code, every line of stdout not read yet, and stderr."""
        self.proc.send_signal(sig)
        self.proc.wait(timeout=120)
        return self.proc.returncode, self.stop_reading(), "".join(self.err)

    def stop_reading(self) -> list[str]:
        for reader in self.readers:
            reader.join(timeout=10)  # (the process's last lines)
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        self.seen += rest
        return rest


def polls(lines: list[str]) -> list[dict]:
    return [e for e in (json.loads(line) for line in lines if line.startswith("{"))
            if e.get("event") == "poll"]


def sql(target: str, query: str) -> str:
    out = run_chload("sql", query, "--target", target, "--format", "TSV")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_s3_follow_sigterm_five_times_and_restarts_every_row_once(
        minio: services.Service, tmp_path: Path) -> None:
    """A writer adds an object a second for 20 s while `--follow --poll 1` runs; SIGTERM
    at five random instants, each followed by a restart: every row once at the end, each
    process exiting 0 with its report, each poll listing only after the last key."""
    bucket, rows, seconds = f"follow-{uuid.uuid4().hex[:8]}", 500, 20
    services.minio_create_bucket(minio, bucket)
    client = services.minio_client(minio)
    target, env = str(tmp_path / "target"), s3_env(minio, tmp_path)
    args = (f"s3://{bucket}/in/", "--table", "events", "--target", target, "--json",
            "--after-last-key")

    def write() -> None:
        for i in range(seconds):
            body = "id\n" + "".join(f"{i * rows + r}\n" for r in range(rows))
            client.put_object(Bucket=bucket, Key=f"in/obj-{i:04d}.csv",  # type: ignore[attr-defined]
                              Body=body.encode())
            time.sleep(1)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    random.seed(os.getpid())
    reports, seen = [], []
    for _ in range(5):
        follower = Follower(*args, env=env)
        follower.wait_for(lambda line: '"event": "poll"' in line)
        time.sleep(random.uniform(0, 3))
        code, rest, err = follower.stop()
        assert code == 0, err
        assert "Traceback" not in err, err
        reports.append(json.loads(rest[-1]))
        seen += follower.seen
    writer.join(timeout=60)
    last = Follower(*args, env=env)  # catches up, then one empty poll
    last.wait_for(lambda line: '"event": "poll"' in line and '"files": 0' in line)
    code, rest, err = last.stop()
    assert code == 0, err
    reports.append(json.loads(rest[-1]))
    seen += last.seen
    total = seconds * rows
    assert sql(target, "SELECT count(), uniqExact(id), sum(id) FROM events") == \
        f"{total}\t{total}\t{total * (total - 1) // 2}"
    assert sum(r["files_loaded"] for r in reports) == seconds
    assert all(r["files_failed"] == 0 and not r["errors"] for r in reports)
    assert all(p["listing_calls"] == 1 for p in polls(seen))  # after the last key: 1 page


def test_local_file_written_slowly_is_never_loaded_half(tmp_path: Path) -> None:
    """A file written over 5 s (a chunk every half second) into a directory followed
    with --poll 1 is taken once whole: its polls meanwhile say it is being written."""
    source, target = tmp_path / "in", str(tmp_path / "target")
    source.mkdir()
    (source / "first.csv").write_text("id\n0\n")
    follower = Follower(str(source), "--table", "t", "--target", target, "--json")
    follower.wait_for(lambda line: '"files": 1' in line)
    with open(source / "slow.csv", "w") as out:
        out.write("id\n")
        for chunk in range(10):
            out.write("".join(f"{1 + chunk * 100 + r}\n" for r in range(100)))
            out.flush()
            time.sleep(0.5)
    follower.wait_for(lambda line: '"files": 1' in line, seconds=30)
    follower.wait_for(lambda line: '"event": "poll"' in line)
    code, rest, err = follower.stop()
    assert code == 0, err
    report = json.loads(rest[-1])
    assert (report["files_loaded"], report["files_failed"], report["files_changed"]) == \
        (2, 0, 0), report
    assert any(p["waiting"] for p in polls(follower.seen))
    assert sql(target, "SELECT count(), uniqExact(id) FROM t") == "1001\t1001"


def test_sigint_ends_a_follow_with_exit_0_and_the_report(tmp_path: Path) -> None:
    source, target = tmp_path / "in", str(tmp_path / "target")
    source.mkdir()
    (source / "a.csv").write_text("id\n1\n2\n")
    os.utime(source / "a.csv", (time.time() - 60, time.time() - 60))
    follower = Follower(str(source), "--table", "t", "--target", target)
    line = follower.wait_for(lambda line: line.startswith("poll 1:"))
    assert line.startswith("poll 1: 1 new file, 2 rows, 1 listing call"), line
    (source / "b.csv").write_text("id\n3\n")
    os.utime(source / "b.csv", (time.time() - 60, time.time() - 60))
    follower.wait_for(lambda line: ": 1 new file, 1 row," in line)
    code, rest, err = follower.stop(signal.SIGINT)
    assert code == 0, err
    assert any(line.startswith("default.t: 2 files: 2 loaded, 0 skipped; 3 rows")
               for line in rest), rest
    assert "interrupted" not in err
    assert sql(target, "SELECT sum(id) FROM t") == "6"


def test_a_changed_file_is_said_once_and_loaded_again_only_with_force(
        tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()

    def rewrite(text: str) -> None:
        (source / "a.csv").write_text(text)
        os.utime(source / "a.csv", (time.time() - 60, time.time() - 60))  # settled

    for force, target in ((False, str(tmp_path / "t1")), (True, str(tmp_path / "t2"))):
        rewrite("id\n1\n")
        follower = Follower(str(source), "--table", "t", "--target", target,
                            *(["--force"] if force else []))
        follower.wait_for(lambda line: line.startswith("poll 1: 1 new file"))
        rewrite("id\n1\n2\n")
        said = follower.wait_for(lambda line: "changed since loaded" in line)
        for _ in range(3):  # said once
            assert "changed" not in follower.wait_for(lambda line: line.startswith("poll"))
        code, rest, err = follower.stop(signal.SIGINT)
        if force:
            assert "1 new file, 2 rows" in said, said
            assert "changed since loaded, loaded again (--force): " in said, said
            assert code == 0, err
            assert sql(target, "SELECT count() FROM t") == "3"  # the old row stays
        else:
            assert "0 new files" in said, said
            assert said.endswith(f"changed since loaded, not loaded again (--force loads "
                                 f"them): {source / 'a.csv'}"), said
            assert code == 1 and "changed since it was loaded" in err, err
            assert any("1 failed" in line and "1 changed" in line for line in rest), rest
            assert sql(target, "SELECT count() FROM t") == "1"


PAGES = """
import json, os, signal, sys
sys.path.insert(0, {services!r})
import services
import chload
from chload.sources.files import s3
s3.PAGE_SIZE = 2  # a page of 2 keys: 5 objects are 3 requests
minio = services.Service(name="minio", argv=[], data_dir=None, ports={{}}, url={url!r},
                         endpoint="", credentials={creds!r})
client = services.minio_client(minio)
polls = []

def on_event(event):
    if event.poll is None:
        return
    polls.append(event.poll.listing_calls)
    if len(polls) == 1:
        client.put_object(Bucket={bucket!r}, Key="p/5.csv", Body=b"id\\n5\\n")
    else:
        os.kill(os.getpid(), signal.SIGINT)

report = chload.load("s3://{bucket}/p/", table="t", target={target!r}, follow=True,
                     poll=0.5, after_last_key={after}, listener=on_event)
print(json.dumps({{"polls": polls, "loaded": report.files_loaded,
                  "listing_calls": report.listing_calls}}))
"""


@pytest.mark.parametrize("after", [False, True])
def test_each_poll_reports_its_listing_requests(minio: services.Service, tmp_path: Path,
                                                after: bool) -> None:
    """A poll's listing calls are its ListObjectsV2 requests: the whole prefix each poll,
    or with --after-last-key only the pages after the last key loaded. In Python: the
    `poll` events of chload.load(follow=True), which SIGINT ends with its report."""
    bucket = f"pages-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, bucket)
    client = services.minio_client(minio)
    for i in range(5):
        client.put_object(Bucket=bucket, Key=f"p/{i}.csv", Body=f"id\n{i}\n".encode())  # type: ignore[attr-defined]
    script = PAGES.format(services=str(Path(__file__).parents[2] / "scripts" / "services"),
                          url=minio.url, creds=minio.credentials, bucket=bucket,
                          target=str(tmp_path / "target"), after=after)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=_without_profile(s3_env(minio, tmp_path)))
    assert out.returncode == 0, out.stderr
    done = json.loads(out.stdout.strip().splitlines()[-1])
    # the first poll: 3 pages; the second: the whole prefix again (6 keys: 3 full pages,
    # MinIO then answers a 4th, empty), or 1 page after key 4
    assert done == {"polls": [3, 1 if after else 4], "loaded": 6,
                    "listing_calls": 4 if after else 7}, out.stderr


def test_hdfs_follow_waits_for_an_empty_directory_then_loads_what_comes(
        hdfs: services.Service, tmp_path: Path) -> None:
    directory, target = f"/follow-{uuid.uuid4().hex[:8]}", str(tmp_path / "target")
    services.hdfs_mkdir(hdfs, directory)
    follower = Follower(f"{hdfs.url}{directory}", "--table", "t", "--target", target,
                        "--format", "CSVWithNames", "--schema", "id UInt64", "--json")
    follower.wait_for(lambda line: '"files": 0' in line)  # nothing yet: no error
    for i in range(2):
        local = tmp_path / f"p{i}.csv"
        local.write_text(f"id\n{i}\n{i + 10}\n")
        services.hdfs_put(hdfs, local, f"{directory}/p{i}.csv")
    follower.wait_for(lambda line: '"files": ' in line and '"files": 0' not in line)
    code, rest, err = follower.stop()
    assert code == 0, err
    report = json.loads(rest[-1])
    assert report["files_loaded"] >= 1 and report["files_failed"] == 0, report
    follower = Follower(f"{hdfs.url}{directory}", "--table", "t", "--target", target,
                        "--json")
    follower.wait_for(lambda line: '"event": "poll"' in line)  # the rest, if any
    code, rest, err = follower.stop()
    assert code == 0, err
    assert json.loads(rest[-1])["files_loaded"] == 2 - report["files_loaded"]
    assert sql(target, "SELECT count(), sum(id) FROM t") == "4\t22"


def test_a_failed_file_is_tried_again_less_and_less_often_and_counted_once(
        tmp_path: Path) -> None:
    """A file that fails (a bad value) waits 1, 2, 4 ... polls before it is tried again,
    each failure said in its poll's line but counted once in the report; fixed, it
    loads at its next try and the run ends well (exit 0)."""
    source, target = tmp_path / "in", str(tmp_path / "target")
    source.mkdir()
    old = (time.time() - 60, time.time() - 60)
    (source / "good.csv").write_text("id\n1\n")
    os.utime(source / "good.csv", old)
    follower = Follower(str(source), "--table", "t", "--target", target, "--json",
                        "--schema", "id UInt64")
    follower.wait_for(lambda line: '"files": 1' in line)
    (source / "bad.csv").write_text("id\nx\n")
    os.utime(source / "bad.csv", old)
    for _ in range(8):
        follower.wait_for(lambda line: '"event": "poll"' in line)
    tried = [p["number"] for p in polls(follower.seen) if p["failed"]]
    gaps = [b - a for a, b in zip(tried[:-1], tried[1:], strict=True)]
    assert len(tried) >= 2 and gaps[0] >= 2 and gaps == sorted(set(gaps)), tried  # 2, 3, 5
    (source / "bad.csv").write_text("id\n2\n")  # fixed
    os.utime(source / "bad.csv", old)
    follower.wait_for(lambda line: '"files": 1' in line, seconds=60)
    code, rest, err = follower.stop()
    assert code == 0, err
    report = json.loads(rest[-1])
    assert (report["files_loaded"], report["files_failed"]) == (2, 0), report
    assert sql(target, "SELECT sum(id) FROM t") == "3"
    failed = sql(target, "SELECT count() FROM chload.files WHERE state = 'failed'")
    assert int(failed) == len(tried), (failed, tried)


LEDGER_READS = """
import json, os, signal, sys, time
import chload
from chload.commit import ledger

reads = []  # (what, rows or bytes answered) of each ledger question about chload.files


class Counted:
    def __init__(self, sql):
        self.sql = sql

    def command(self, statement):
        return self.sql.command(statement)

    def rows(self, statement):
        answer = self.sql.rows(statement)
        if "chload.files" in statement:
            reads.append(("rows", len(answer)))
        return answer

    def binary(self, statement, fmt):
        answer = self.sql.binary(statement, fmt)
        if "chload.files" in statement:
            reads.append(("bytes", len(answer)))
        return answer


made = ledger.Ledger.__init__
ledger.Ledger.__init__ = lambda self, sql: made(self, Counted(sql))
polls = []


def on_event(event):
    if event.poll is None:
        return
    polls.append({{"files": event.poll.files, "reads": list(reads)}})
    reads.clear()
    if len(polls) == 1:
        old = time.time() - 60
        path = os.path.join({source!r}, "new.csv")
        with open(path, "w") as out:
            out.write("id\\n1000\\n")
        os.utime(path, (old, old))
    if len(polls) == 4:
        os.kill(os.getpid(), signal.SIGINT)


report = chload.load({source!r}, table="t", target={target!r}, follow=True, poll=0.5,
                     listener=on_event)
print(json.dumps({{"polls": polls, "loaded": report.files_loaded}}))
"""


def test_a_poll_after_many_known_units_asks_the_ledger_only_for_the_new(
        tmp_path: Path) -> None:
    """A follow's first poll loads 300 files; each later poll asks the ledger only for
    the keys (16 bytes a unit) of the units loaded since the previous poll asked: the
    300, then the one new file, then none (not the 301 known each time), counted through
    a counter around the ledger's SQL (chload.load(follow=True) in its own process)."""
    source, target = tmp_path / "in", str(tmp_path / "target")
    source.mkdir()
    old = time.time() - 60
    for i in range(300):
        (source / f"f{i:03d}.csv").write_text(f"id\n{i}\n")
        os.utime(source / f"f{i:03d}.csv", (old, old))
    script = LEDGER_READS.format(source=str(source), target=target)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert [p["files"] for p in result["polls"]] == [300, 1, 0, 0], result
    reads = [[tuple(r) for r in p["reads"]] for p in result["polls"]]
    assert reads[1:] == [[("bytes", 300 * 16)], [("bytes", 16)], [("bytes", 0)]], reads
    assert sql(target, "SELECT count(), sum(id) FROM t") == f"301\t{sum(range(300)) + 1000}"


def test_a_follow_skips_what_another_loader_committed_meanwhile_without_loading_it(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    """While a follow of a directory into an 18.16 table waits between polls (stopped
    there by SIGSTOP), another chload loads a new file of it into the same table: the
    follow's next poll learns it from the ledger's events since its last ask and skips
    it in its plan (never staged: no skip by the committer counted), and the table holds
    its rows once."""
    source = tmp_path / "in"
    source.mkdir()
    old = time.time() - 60
    (source / "a.csv").write_text("id\n1\n")
    os.utime(source / "a.csv", (old, old))
    follower = Follower(str(source), "--table", table_name, "--target", clickhouse.url,
                        "--json")
    follower.wait_for(lambda line: '"files": 1' in line)
    follower.proc.send_signal(signal.SIGSTOP)  # (between polls: just after one's line)
    try:
        (source / "b.csv").write_text("id\n2\n3\n")
        os.utime(source / "b.csv", (old, old))
        other = run_chload("load", str(source / "b.csv"), "--table", table_name,
                           "--target", clickhouse.url)
        assert other.returncode == 0, other.stderr
    finally:
        follower.proc.send_signal(signal.SIGCONT)
    for _ in range(2):
        follower.wait_for(lambda line: '"event": "poll"' in line)
    code, rest, err = follower.stop()
    assert code == 0, err
    report = json.loads(rest[-1])
    assert (report["files_loaded"], report["files_skipped"], report["files_failed"]) == \
        (1, 0, 0), report
    assert all(p["files"] == 0 for p in polls(follower.seen)[1:])
    assert sql(clickhouse.url, f"SELECT count(), sum(id) FROM {table_name}") == "3\t6"
