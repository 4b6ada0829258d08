"""Remote sources end to end: the real `chload` command loading from a real MinIO, a real
HDFS and a local HTTP server into the embedded engine; results checked through SQL, and
the S3 secret looked for everywhere it must not be."""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import services
from common import make_trips
from conftest import ROOT, run_chload, serving_http

pytestmark = pytest.mark.integration

FILES, ROWS = 10, 100_000
TOTAL = FILES * ROWS
ID_SUM = TOTAL * (TOTAL - 1) // 2


@pytest.fixture(scope="module")
def trips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 gzip CSV files with a header, 100,000 rows each, ids 0..999,999."""
    directory = tmp_path_factory.mktemp("remote-trips")
    make_trips(str(directory), FILES, ROWS)
    return directory


@pytest.fixture(scope="module")
def bucket(minio: services.Service, trips: Path) -> str:
    name = f"raw-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, name)
    client = services.minio_client(minio)
    for path in sorted(trips.iterdir()):
        client.upload_file(str(path), name, f"trips/{path.name}")  # type: ignore[attr-defined]
    client.put_object(Bucket=name, Key="trips/_SUCCESS", Body=b"")  # type: ignore[attr-defined]
    return name


def s3_env(minio: services.Service, tmp_path: Path, **extra: str) -> dict[str, str]:
    """Endpoint and keys only through the AWS environment variables; no profile files."""
    return {
        "AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": minio.credentials["access_key"],
        "AWS_SECRET_ACCESS_KEY": minio.credentials["secret_key"], "AWS_SESSION_TOKEN": "",
        "AWS_PROFILE": "", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"), **extra,
    }


def totals(target: str, table: str) -> tuple[int, int, int]:
    out = run_chload("sql", f"SELECT count(), uniqExact(id), sum(id) FROM {table}",
                     "--target", target, "--format", "TSV")
    assert out.returncode == 0, out.stderr
    a, b, c = out.stdout.split()
    return int(a), int(b), int(c)


def load(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                                 dict]:
    out = run_chload("load", *args, "--json", env=env, timeout=240)
    assert "Traceback" not in out.stderr, out.stderr
    return out, json.loads(out.stdout) if out.stdout.strip() else {}


def files_everywhere_without(target: str, secret: bytes) -> list[str]:
    """Every file under the target directory that contains `secret` (none, we hope)."""
    hits = []
    for root, _, names in os.walk(target):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                if secret in fh.read():
                    hits.append(path)
    return hits


def test_s3_exact_rerun_and_secret_nowhere(minio: services.Service, bucket: str,
                                           tmp_path: Path) -> None:
    target, env = str(tmp_path / "target"), s3_env(minio, tmp_path)
    secret = minio.credentials["secret_key"]
    out, report = load(f"s3://{bucket}/trips/*.csv.gz", "--table", "trips", "--target", target,
                       env=env)
    assert out.returncode == 0, out.stderr
    assert (report["files_loaded"], report["rows_loaded"], report["files_failed"]) == \
        (FILES, TOTAL, 0)
    assert report["files"][0]["uri"] == f"s3://{bucket}/trips/trips_000.csv.gz"
    assert totals(target, "trips") == (TOTAL, TOTAL, ID_SUM)

    again, report2 = load(f"s3://{bucket}/trips/", "--table", "trips", "--target", target,
                          env=env)  # the directory form names the same 10 (not _SUCCESS)
    assert (again.returncode, report2["files_skipped"], report2["files_loaded"]) == (0, FILES, 0)
    assert totals(target, "trips") == (TOTAL, TOTAL, ID_SUM)
    star, report3 = load(f"s3://{bucket}/trips/*", "--table", "trips", "--target", target,
                         env=env)  # a glob meets the empty _SUCCESS: no source, no failure
    assert (star.returncode, report3["files_skipped"], report3["files_failed"]) == (0, FILES, 0)

    plain = run_chload("load", f"s3://{bucket}/trips/*.csv.gz", "--table", "trips",
                       "--target", target, env=env)
    ledger = run_chload("files", "--table", "trips", "--target", target)
    ledger_json = run_chload("files", "--table", "trips", "--target", target, "--json")
    history = run_chload("history", "--target", target, "--json")
    rows = json.loads(ledger_json.stdout)
    assert len(rows) == FILES and {r["state"] for r in rows} == {"loaded"}
    assert all(r["identity"].count(":") == 1 and r["identity"].endswith(str(r["size"]))
               for r in rows)  # ETag:size
    for done in (out, again, plain, ledger, ledger_json, history):
        assert secret not in done.stdout and secret not in done.stderr
    assert files_everywhere_without(target, secret.encode()) == []
    assert secret not in ledger_tables(target)  # data files are compressed: ask the engine too


def test_s3_after_last_key_lists_only_keys_after_the_last_loaded(
        minio: services.Service, bucket: str, tmp_path: Path) -> None:
    target, env = str(tmp_path / "target"), s3_env(minio, tmp_path)
    client = services.minio_client(minio)

    def put(day: int) -> None:
        client.put_object(Bucket=bucket, Key=f"logs/2026-01-{day:02d}.csv",  # type: ignore[attr-defined]
                          Body=f"id\n{day}\n".encode())
    for day in (1, 2, 3):
        put(day)
    args = (f"s3://{bucket}/logs/", "--table", "logs", "--target", target)
    out, report = load(*args, "--after-last-key", env=env)
    assert (out.returncode, report["files_loaded"]) == (0, 3), out.stderr
    again, report = load(*args, "--after-last-key", env=env)  # nothing after the 3rd
    assert (again.returncode, report["files_loaded"], report["files_skipped"]) == (0, 0, 0)
    put(4)
    put(0)  # a late key, before the last loaded one: not listed with the flag
    newer, report = load(*args, "--after-last-key", env=env)
    assert (newer.returncode, report["files_loaded"], report["files_skipped"]) == (0, 1, 0)
    assert [f["uri"] for f in report["files"]] == [f"s3://{bucket}/logs/2026-01-04.csv"]
    whole, report = load(*args, env=env)  # the whole prefix: the late one, the rest skipped
    assert (whole.returncode, report["files_loaded"], report["files_skipped"]) == (0, 1, 4)
    out = run_chload("sql", "SELECT groupArray(id) FROM (SELECT id FROM logs ORDER BY id)",
                     "--target", target, "--format", "TSV")
    assert out.stdout.strip() == "[0,1,2,3,4]"
    local, _ = load(str(tmp_path / "target"), "--table", "x", "--after-last-key")
    assert local.returncode == 2
    assert "--after-last-key: only for an s3://, az:// or gs:// source" in local.stderr


def put_many(client: object, bucket: str, keys: list[str]) -> None:
    """Tiny CSV objects, 16 PUTs at a time."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: client.put_object(  # type: ignore[attr-defined]
            Bucket=bucket, Key=k, Body=f"id\n{len(k)}\n".encode()), keys))


def test_s3_listing_calls_are_counted_and_after_last_key_asks_one_page(
        minio: services.Service, tmp_path: Path) -> None:
    name = f"many-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, name)
    client = services.minio_client(minio)
    put_many(client, name, [f"k/{i:05d}.csv" for i in range(1500)])
    target, env = str(tmp_path / "target"), s3_env(minio, tmp_path)
    args = (f"s3://{name}/k/", "--table", "k", "--target", target)
    out, report = load(*args, env=env)
    assert (out.returncode, report["files_loaded"], report["listing_calls"]) == (0, 1500, 2)
    again, report = load(*args, env=env)  # the whole prefix again: 1,000 keys a page
    assert (report["files_skipped"], report["listing_calls"]) == (1500, 2)
    assert "listed in 2 requests" in run_chload("load", *args, env=env).stdout
    put_many(client, name, [f"k/{i:05d}.csv" for i in range(1500, 1505)])
    newer, report = load(*args, "--after-last-key", env=env)  # only after k/01499.csv
    assert (newer.returncode, report["files_loaded"], report["files_skipped"],
            report["listing_calls"]) == (0, 5, 0, 1)


def ledger_tables(target: str) -> str:
    """Every row of every table chload keeps for itself (ledger, runs, rejects), as text."""
    names = run_chload("sql", "SELECT name FROM system.tables WHERE database = 'chload'",
                       "--target", target, "--format", "TSV").stdout.split()
    assert "files" in names and "runs" in names
    dumps = [run_chload("sql", f"SELECT * FROM chload.{n}", "--target", target,
                        "--format", "TSV") for n in names]
    assert all(d.returncode == 0 for d in dumps)
    return "".join(d.stdout for d in dumps)


def test_s3_missing_object_is_one_line(minio: services.Service, bucket: str,
                                       tmp_path: Path) -> None:
    env, target = s3_env(minio, tmp_path), str(tmp_path / "target")
    out = run_chload("load", f"s3://{bucket}/trips/missing.csv.gz", "--table", "t",
                     "--target", target, env=env)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and f"s3://{bucket}/trips/missing.csv.gz" in out.stderr
    wrong = run_chload("load", f"s3://{bucket}/trips/*.csv.gz", "--table", "t", "--target",
                       target, env={**env, "AWS_SECRET_ACCESS_KEY": "wrong-Secret-123"})
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1
    assert "access denied" in wrong.stderr and "wrong-Secret-123" not in wrong.stderr


VANISH = """
import json, sys
sys.path.insert(0, {services!r})
import chload, services
minio = services.Service(name="minio", argv=[], data_dir=None, ports={{}}, url={url!r},
                         endpoint="", credentials={creds!r})
client = services.minio_client(minio)
def on(event):
    if event.kind == "plan":  # listed; the object goes away before it is read
        client.delete_object(Bucket={bucket!r}, Key="gone/trips_001.csv.gz")
report = chload.load([{pattern!r}], table="t", target={target!r}, listener=on)
print(json.dumps(report.to_dict()))
"""


def test_s3_vanished_object_fails_alone(minio: services.Service, bucket: str, trips: Path,
                                        tmp_path: Path) -> None:
    client = services.minio_client(minio)
    for name in ("trips_000.csv.gz", "trips_001.csv.gz", "trips_002.csv.gz"):
        client.upload_file(str(trips / name), bucket, f"gone/{name}")  # type: ignore[attr-defined]
    target = str(tmp_path / "target")
    script = VANISH.format(services=str(ROOT / "scripts" / "services"), url=minio.url,
                           creds=minio.credentials, bucket=bucket, target=target,
                           pattern=f"s3://{bucket}/gone/*.csv.gz")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, env=_without_profile(s3_env(minio, tmp_path)), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["files_loaded"], report["files_failed"]) == (2, 1)
    failed = [f for f in report["files"] if f["status"] == "failed"][0]
    assert failed["uri"] == f"s3://{bucket}/gone/trips_001.csv.gz"
    assert failed["error"].startswith(failed["uri"] + ": ") and "\n" not in failed["error"]
    assert "404" in failed["error"]
    assert totals(target, "t") == (2 * ROWS, 2 * ROWS, sum(range(ROWS)) + sum(
        range(2 * ROWS, 3 * ROWS)))  # no row of the vanished object


def _without_profile(env: dict[str, str]) -> dict[str, str]:
    merged = {**os.environ, **env}
    merged.pop("AWS_PROFILE")  # boto3 (the test's own client) rejects an empty profile
    return merged


def test_s3_public_bucket_anonymously_and_profile(minio: services.Service, bucket: str,
                                                  trips: Path, tmp_path: Path) -> None:
    name = f"pub-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, name)
    client = services.minio_client(minio)
    policy = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": ["*"]},
        "Action": ["s3:GetObject", "s3:ListBucket"],
        "Resource": [f"arn:aws:s3:::{name}", f"arn:aws:s3:::{name}/*"]}]}
    client.put_bucket_policy(Bucket=name, Policy=json.dumps(policy))  # type: ignore[attr-defined]
    client.upload_file(str(trips / "trips_003.csv.gz"), name,  # type: ignore[attr-defined]
                       "a b/trips 003.csv.gz")
    anonymous = s3_env(minio, tmp_path, AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="",
                       AWS_ENDPOINT_URL="")
    target = str(tmp_path / "target")
    out, report = load(f"s3://{name}/a b/", "--table", "pub", "--target", target,
                       "--s3-endpoint", minio.url, env=anonymous)
    assert out.returncode == 0, out.stderr
    assert report["files"][0]["uri"] == f"s3://{name}/a b/trips 003.csv.gz"
    assert totals(target, "pub")[0] == ROWS

    profiles = tmp_path / "credentials"
    profiles.write_text(f"[loader]\naws_access_key_id = {minio.credentials['access_key']}\n"
                        f"aws_secret_access_key = {minio.credentials['secret_key']}\n")
    env = {**anonymous, "AWS_PROFILE": "loader", "AWS_SHARED_CREDENTIALS_FILE": str(profiles)}
    out, report = load(f"s3://{bucket}/trips/trips_00{{4,5}}.csv.gz", "--table",
                       "prof", "--target", target, "--s3-endpoint", minio.url, env=env)
    assert out.returncode == 0, out.stderr
    assert totals(target, "prof")[0] == 2 * ROWS
    assert files_everywhere_without(target, minio.credentials["secret_key"].encode()) == []


def test_hdfs_loads_exactly(hdfs: services.Service, trips: Path, tmp_path: Path) -> None:
    directory = f"/trips-{uuid.uuid4().hex[:8]}"
    services.hdfs_mkdir(hdfs, directory)
    for path in sorted(trips.iterdir()):
        services.hdfs_put(hdfs, path, f"{directory}/{path.name}")
    target = str(tmp_path / "target")
    out, report = load(f"{hdfs.url}{directory}/*.csv.gz", "--table", "trips", "--target", target)
    assert out.returncode == 0, out.stderr
    assert (report["files_loaded"], report["rows_loaded"]) == (FILES, TOTAL)
    assert report["files"][0]["uri"] == f"{hdfs.url}{directory}/trips_000.csv.gz"
    assert totals(target, "trips") == (TOTAL, TOTAL, ID_SUM)
    out, report = load(f"{hdfs.url}{directory}", "--table", "trips", "--target", target)
    assert (out.returncode, report["files_skipped"]) == (0, FILES)
    missing = run_chload("load", f"{hdfs.url}{directory}/nope.csv.gz", "--table", "trips",
                         "--target", target)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert f"{directory}/nope.csv.gz" in missing.stderr


@pytest.fixture
def http_server(trips: Path) -> Iterator[str]:
    """A local HTTP server on 127.0.0.1 serving the trips files (HEAD and GET)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass
    handler = functools.partial(Quiet, directory=str(trips))
    with serving_http(handler) as url:
        yield url


def test_http_loads_exactly(http_server: str, tmp_path: Path) -> None:
    target = str(tmp_path / "target")
    out, report = load(f"{http_server}/trips_{{000..009}}.csv.gz", "--table", "trips",
                       "--target", target)
    assert out.returncode == 0, out.stderr
    assert (report["files_loaded"], report["rows_loaded"]) == (FILES, TOTAL)
    assert totals(target, "trips") == (TOTAL, TOTAL, ID_SUM)
    out, report = load(f"{http_server}/trips_{{000..009}}.csv.gz", "--table", "trips",
                       "--target", target)
    assert (out.returncode, report["files_skipped"]) == (0, FILES)
    missing = run_chload("load", f"{http_server}/trips_{{000,404}}.csv.gz", "--table", "trips",
                         "--target", target)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert f"{http_server}/trips_404.csv.gz: not found (HTTP 404)" in missing.stderr


def test_many_objects_in_one_read(minio: services.Service, bucket: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine reads a `{a,b,c}` list of keys with exact per-object rows (for batches)."""
    from chload.sources.files import aws
    from chload.sources.files.s3 import list_s3
    from chload.sources.registry import table_function_many

    env = s3_env(minio, tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    files = list(list_s3(f"s3://{bucket}/trips/trips_00{{1,3,5}}.csv.gz", "CSVWithNames",
                         None, aws.resolve(env)))
    sql, uri = table_function_many(files, "CSVWithNames", "id UInt64") or ("", "")
    seed = tmp_path / "seed.csv"
    seed.write_text("id\n1\n")  # `chload sql` reads an existing target, never creates one
    assert run_chload("load", str(seed), "--table", "seed", "--target",
                      str(tmp_path / "target")).returncode == 0
    out = run_chload("sql", f"SELECT {uri} AS f, count() FROM {sql} GROUP BY f ORDER BY f",
                     "--target", str(tmp_path / "target"), "--format", "TSV", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{f.uri}\t{ROWS}" for f in files]
