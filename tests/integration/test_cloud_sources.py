"""Azure Blob Storage and GCS sources end to end: the real `chload` command loading from a
real Azurite (az://) and from MinIO as GCS's S3-interoperable API (gs://) into the
embedded engine and a real 18.16 server; results checked through SQL, the account key
and the HMAC secret looked for everywhere they must not be."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import services
from common import make_trips
from conftest import kill_moments, kill_when, run_chload, top_block
from test_remote_sources import (
    FILES,
    ID_SUM,
    ROWS,
    TOTAL,
    files_everywhere_without,
    ledger_tables,
    load,
    totals,
)

pytestmark = pytest.mark.integration

NO_AWS = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
          "AWS_PROFILE": "", "AWS_ENDPOINT_URL": ""}


@pytest.fixture(scope="module")
def trips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 gzip CSV files with a header, 100,000 rows each, ids 0..999,999."""
    directory = tmp_path_factory.mktemp("cloud-trips")
    make_trips(str(directory), FILES, ROWS)
    return directory


def az_env(azurite: services.Service, **extra: str) -> dict[str, str]:
    """The account only through AZURE_STORAGE_CONNECTION_STRING."""
    return {"AZURE_STORAGE_CONNECTION_STRING": azurite.credentials["connection_string"],
            "AZURE_STORAGE_ACCOUNT": "", "AZURE_STORAGE_KEY": "", **NO_AWS, **extra}


def put(container: object, directory: Path, prefix: str) -> None:
    for path in sorted(directory.iterdir()):
        with open(path, "rb") as fh:
            container.upload_blob(f"{prefix}{path.name}", fh)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def container(azurite: services.Service, trips: Path) -> tuple[str, object]:
    name = f"raw-{uuid.uuid4().hex[:8]}"
    client = services.azure_create_container(azurite, name)
    put(client, trips, "trips/")
    client.upload_blob("trips/_SUCCESS", b"")  # type: ignore[attr-defined]
    return name, client


def secret_shown(azurite: services.Service, *outs: subprocess.CompletedProcess[str]) -> bool:
    key = azurite.credentials["key"]
    return any(key in o.stdout or key in o.stderr for o in outs)


def test_azure_exact_rerun_and_secret_nowhere(azurite: services.Service,
                                              container: tuple[str, object],
                                              tmp_path: Path) -> None:
    name, _ = container
    target, env = str(tmp_path / "target"), az_env(azurite)
    out, report = load(f"az://{name}/trips/*.csv.gz", "--table", "trips", "--target", target,
                       env=env)
    assert out.returncode == 0, out.stderr
    assert (report["files_loaded"], report["rows_loaded"], report["files_failed"],
            report["listing_calls"]) == (FILES, TOTAL, 0, 1)
    assert report["files"][0]["uri"] == f"az://{name}/trips/trips_000.csv.gz"
    assert totals(target, "trips") == (TOTAL, TOTAL, ID_SUM)

    again, report2 = load(f"az://{name}/trips/", "--table", "trips", "--target", target,
                          env=env)  # the directory form names the same 10 (not _SUCCESS)
    assert (again.returncode, report2["files_skipped"], report2["files_loaded"]) == (0, FILES, 0)
    star, report3 = load(f"azure://{name}/trips/*", "--table", "trips", "--target", target,
                         env=env)  # azure:// names the same blobs; the empty _SUCCESS is passed
    assert (star.returncode, report3["files_skipped"], report3["files_failed"]) == (0, FILES, 0)
    assert totals(target, "trips") == (TOTAL, TOTAL, ID_SUM)

    ledger = run_chload("files", "--table", "trips", "--target", target, "--json")
    history = run_chload("history", "--target", target, "--json")
    rows = json.loads(ledger.stdout)
    assert len(rows) == FILES and {r["state"] for r in rows} == {"loaded"}
    assert all(r["uri"].startswith(f"az://{name}/trips/") for r in rows)
    assert all(r["identity"].startswith("0x") and r["identity"].endswith(f":{r['size']}")
               for r in rows)  # ETag:size
    assert not secret_shown(azurite, out, again, star, ledger, history)
    key = azurite.credentials["key"].encode()
    assert files_everywhere_without(target, key) == []
    assert azurite.credentials["key"] not in ledger_tables(target)


def test_azure_changed_blob_loads_again_and_after_last_key(
        azurite: services.Service, tmp_path: Path) -> None:
    """A brace list names exact blobs; --after-last-key passes over names up to the last
    loaded; a blob rewritten (a new ETag) is refused as changed, as any file is."""
    name = f"keys-{uuid.uuid4().hex[:8]}"
    client = services.azure_create_container(azurite, name)
    for i in range(5):
        client.upload_blob(f"k/{i:03d}.csv", f"id\n{i}\n".encode())  # type: ignore[attr-defined]
    target, env = str(tmp_path / "target"), az_env(azurite)
    args = ("--table", "k", "--target", target)
    first, report = load(f"az://{name}/k/{{000,001,002}}.csv", *args, env=env)
    assert (first.returncode, report["files_loaded"]) == (0, 3), first.stderr
    rest, report = load(f"az://{name}/k/", *args, "--after-last-key", env=env)
    assert (rest.returncode, report["files_loaded"], report["files_skipped"]) == (0, 2, 0)
    client.upload_blob("k/001.csv", b"id\n1\n", overwrite=True)  # type: ignore[attr-defined]
    client.upload_blob("k/005.csv", b"id\n5\n")  # type: ignore[attr-defined]
    after, report = load(f"az://{name}/k/", *args, "--after-last-key", env=env)
    assert (after.returncode, report["files_loaded"]) == (0, 1)  # 005 only: after 004
    whole, report = load(f"az://{name}/k/", *args, env=env)
    assert (whole.returncode, report["files_loaded"], report["files_changed"]) == (1, 0, 1)
    assert f"az://{name}/k/001.csv" in whole.stdout + whole.stderr
    out = run_chload("sql", "SELECT count(), sum(id) FROM k", "--target", target,
                     "--format", "TSV")
    assert out.stdout.split() == ["6", "15"]  # 001 once, 005 added


def test_azure_refusals_are_one_line_without_the_key(azurite: services.Service,
                                                     container: tuple[str, object],
                                                     tmp_path: Path) -> None:
    name, _ = container
    target = str(tmp_path / "target")
    key = azurite.credentials["key"]
    wrong = key[:-6] + ("AAAAA=" if not key.endswith("AAAAA=") else "BBBBB=")
    bad_key = az_env(azurite, AZURE_STORAGE_CONNECTION_STRING=azurite.credentials[
        "connection_string"].replace(key, wrong))
    cases = [
        (f"az://{name}/nothing/*.csv", az_env(azurite), "no blob matches"),
        (f"az://gone-{name}/x.csv", az_env(azurite), "no such container"),
        (f"az://{name}/trips/*.csv.gz", bad_key, "access denied"),
        ("az://Bad_Name/x.csv", az_env(azurite), "write Azure sources as az://container"),
        (f"az://{name}/trips/", {**az_env(azurite), "AZURE_STORAGE_CONNECTION_STRING": ""},
         "no Azure credentials"),
    ]
    for source, env, said in cases:
        out = run_chload("load", source, "--table", "t", "--target", target, env=env)
        assert out.returncode != 0 and said in out.stderr, (source, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 2
        assert key not in out.stderr + out.stdout and wrong not in out.stderr + out.stdout


def test_azure_bad_rows_are_rejected_and_kept(azurite: services.Service,
                                              tmp_path: Path) -> None:
    """--max-errors over blobs: the engine reads them again for the rejected lines."""
    name = f"bad-{uuid.uuid4().hex[:8]}"
    client = services.azure_create_container(azurite, name)
    client.upload_blob("in/a.csv", b"id,v\n1,a\n2,b\n")  # type: ignore[attr-defined]
    client.upload_blob("in/b.csv", b"id,v\n3,c\nnot-a-number,d\n5,e\n")  # type: ignore[attr-defined]
    target = str(tmp_path / "target")
    out = run_chload("load", f"az://{name}/in/*.csv", "--table", "t", "--target", target,
                     "--schema", "id UInt32, v String", "--max-errors", "5", "--json",
                     env=az_env(azurite))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["rows_loaded"], report["rows_rejected"]) == (4, 1)
    kept = run_chload("sql", "SELECT uri, line FROM chload.rejects", "--target", target,
                      "--format", "TSV")
    assert kept.stdout.split() == [f"az://{name}/in/b.csv", "3"], kept.stdout
    assert not secret_shown(azurite, out, kept)


def _start(source: str, target: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "chload", "load", source, "--table", "trips", "--target",
         target, "--quiet"], env={**os.environ, **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def big_container(azurite: services.Service,
                  tmp_path_factory: pytest.TempPathFactory) -> str:
    """8 gzip CSV blobs of 1,000,000 trips rows: several commits' worth, seconds to load."""
    big = tmp_path_factory.mktemp("cloud-big")
    make_trips(str(big), 8, 1_000_000)
    name = f"big-{uuid.uuid4().hex[:8]}"
    put(services.azure_create_container(azurite, name), big, "")
    return name


def test_azure_sigkill_at_three_moments_then_exact(azurite: services.Service,
                                                   big_container: str, tmp_path: Path) -> None:
    """Kill a load from Azure at three moments seen on disk (a stage filling, the first
    commit, a rerun's stage filling); the final run loads every row exactly once. While
    it runs, `ps` shows its command line without the key."""
    name = big_container
    source, target, env = f"az://{name}/*.csv.gz", str(tmp_path / "target"), az_env(azurite)
    for what, ready in kill_moments(target, "trips"):
        before = top_block(target, "trips")
        proc = _start(source, target, env)
        if what.startswith("its first stage"):
            listed = subprocess.run(["ps", "-o", "args=", "-p", str(proc.pid)],
                                    capture_output=True, text=True, timeout=30).stdout
            assert f"az://{name}/" in listed and azurite.credentials["key"] not in listed
        kill_when(proc, functools.partial(ready, proc.pid, before), what)
    final = _start(source, target, env)
    assert final.wait(timeout=240) == 0, final.stderr.read() if final.stderr else ""
    out = run_chload("sql", "SELECT count(), uniqExact(id) FROM trips", "--target", target,
                     "--format", "TSV")
    assert out.stdout.split() == ["8000000", "8000000"]
    states = {r["state"] for r in json.loads(run_chload(
        "files", "--table", "trips", "--target", target, "--json").stdout)}
    assert states == {"loaded"}


def _server_stages(clickhouse: services.Service) -> int:
    return int(services.clickhouse_query(
        clickhouse, "SELECT count() FROM system.tables WHERE database = 'chload' AND "
                    "startsWith(name, 'stage_')").strip())


def test_azure_into_the_18_16_server(azurite: services.Service, clickhouse: services.Service,
                                     big_container: str, table_name: str) -> None:
    """The loader's engine reads the blobs and pushes them: a loader killed -9 while its
    stages fill, then a rerun: exact; another rerun skips; the key is in nothing the
    server keeps (its data, logs)."""
    server = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    env = {**az_env(azurite), "CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    source = f"az://{big_container}/*.csv.gz"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chload", "load", source, "--table", table_name, "--target",
         server, "--quiet"], env={**os.environ, **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kill_when(proc, lambda: _server_stages(clickhouse) > 0, "a stage on the server")
    runs = []
    for expect_skipped in (None, 8):
        out, report = load(source, "--table", table_name, "--target", server, env=env)
        assert out.returncode == 0, out.stderr
        assert report["files_loaded"] + report["files_skipped"] == 8
        if expect_skipped is not None:
            assert report["files_skipped"] == expect_skipped
        runs.append(out)
    got = services.clickhouse_query(
        clickhouse, f"SELECT count(), uniqExact(id) FROM {table_name}").split()
    assert got == ["8000000", "8000000"]
    assert not secret_shown(azurite, *runs)
    key = azurite.credentials["key"].encode()
    assert files_everywhere_without(str(clickhouse.data_dir), key) == []


# -- gs:// through GCS's S3-interoperable API (MinIO stands for it) ------------------------

def gs_env(minio: services.Service, tmp_path: Path) -> dict[str, str]:
    """HMAC keys and endpoint only through the GCS variables; the AWS ones empty."""
    return {"GCS_ENDPOINT_URL": minio.url, "GCS_ACCESS_KEY_ID": minio.credentials["access_key"],
            "GCS_SECRET_ACCESS_KEY": minio.credentials["secret_key"], **NO_AWS,
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none")}


def test_gcs_exact_rerun_after_last_key_and_secret_nowhere(minio: services.Service,
                                                           trips: Path,
                                                           tmp_path: Path) -> None:
    bucket = f"gs-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, bucket)
    client = services.minio_client(minio)
    for path in sorted(trips.iterdir()):
        client.upload_file(str(path), bucket, f"trips/{path.name}")  # type: ignore[attr-defined]
    target, env = str(tmp_path / "target"), gs_env(minio, tmp_path)
    secret = minio.credentials["secret_key"]
    out, report = load(f"gs://{bucket}/trips/*.csv.gz", "--table", "trips", "--target", target,
                       env=env)
    assert out.returncode == 0, out.stderr
    assert (report["files_loaded"], report["rows_loaded"]) == (FILES, TOTAL)
    assert report["files"][0]["uri"] == f"gs://{bucket}/trips/trips_000.csv.gz"
    again, report2 = load(f"gs://{bucket}/trips/", "--table", "trips", "--target", target,
                          "--after-last-key", env=env)
    assert (again.returncode, report2["files_loaded"], report2["listing_calls"]) == (0, 0, 1)
    assert totals(target, "trips") == (TOTAL, TOTAL, ID_SUM)
    for done in (out, again):
        assert secret not in done.stdout + done.stderr
    assert files_everywhere_without(target, secret.encode()) == []
    assert secret not in ledger_tables(target)

    wrong = run_chload("load", f"gs://{bucket}/trips/", "--table", "trips", "--target", target,
                       env={**env, "GCS_SECRET_ACCESS_KEY": "wrong-Secret-123"})
    assert wrong.returncode != 0 and "access denied" in wrong.stderr, wrong.stderr
    assert "GCS_ACCESS_KEY_ID" in wrong.stderr and "wrong-Secret-123" not in wrong.stderr
    mixed = run_chload("load", f"gs://{bucket}/trips/", "s3://other/x.csv", "--table", "t",
                       "--target", target, env=env)
    assert mixed.returncode == 2 and "separate runs" in mixed.stderr, mixed.stderr


def test_azure_follow_sigterm_and_restart_every_row_once(azurite: services.Service,
                                                         tmp_path: Path) -> None:
    """A writer adds a blob a second for 8 s while `--follow --poll 1` runs; SIGTERM at two
    instants, each followed by a restart: every row once, each process exiting 0."""
    from test_follow import Follower

    name, rows, seconds = f"follow-{uuid.uuid4().hex[:8]}", 200, 8
    client = services.azure_create_container(azurite, name)
    target, env = str(tmp_path / "target"), az_env(azurite)
    args = (f"az://{name}/in/", "--table", "events", "--target", target, "--json",
            "--after-last-key")

    def write() -> None:
        for i in range(seconds):
            body = "id\n" + "".join(f"{i * rows + r}\n" for r in range(rows))
            client.upload_blob(f"in/obj-{i:04d}.csv", body.encode())  # type: ignore[attr-defined]
            time.sleep(1)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    reports = []
    for pause in (1.5, 0.5):
        follower = Follower(*args, env=env)
        follower.wait_for(lambda line: '"event": "poll"' in line)
        time.sleep(pause)
        code, rest, err = follower.stop()
        assert code == 0 and "Traceback" not in err, err
        assert azurite.credentials["key"] not in err + "".join(rest + follower.seen)
        reports.append(json.loads(rest[-1]))
    writer.join(timeout=60)
    last = Follower(*args, env=env)  # catches up, then one empty poll
    last.wait_for(lambda line: '"event": "poll"' in line and '"files": 0' in line)
    code, rest, err = last.stop()
    assert code == 0, err
    reports.append(json.loads(rest[-1]))
    total = seconds * rows
    out = run_chload("sql", "SELECT count(), uniqExact(id), sum(id) FROM events", "--target",
                     target, "--format", "TSV")
    assert out.stdout.split() == [str(total), str(total), str(total * (total - 1) // 2)]
    assert sum(r["files_loaded"] for r in reports) == seconds
    assert all(r["files_failed"] == 0 and not r["errors"] for r in reports)


def test_gcs_into_the_18_16_server(minio: services.Service, clickhouse: services.Service,
                                   trips: Path, tmp_path: Path, table_name: str) -> None:
    """gs:// read by the loader's engine (gcs()) and pushed: exact, a rerun skips, the
    HMAC secret in nothing the server keeps."""
    bucket = f"gs18-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, bucket)
    client = services.minio_client(minio)
    for path in sorted(trips.iterdir())[:3]:
        client.upload_file(str(path), bucket, path.name)  # type: ignore[attr-defined]
    server = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    env = {**gs_env(minio, tmp_path), "CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    for expect_loaded in (3, 0):
        out, report = load(f"gs://{bucket}/*.csv.gz", "--table", table_name, "--target",
                           server, env=env)
        assert out.returncode == 0, out.stderr
        assert (report["files_loaded"], report["files_skipped"]) == (expect_loaded,
                                                                     3 - expect_loaded)
        assert minio.credentials["secret_key"] not in out.stdout + out.stderr
    got = services.clickhouse_query(clickhouse, f"SELECT count(), uniqExact(id) FROM "
                                                f"{table_name}").split()
    assert got == [str(3 * ROWS), str(3 * ROWS)]
    secret = minio.credentials["secret_key"].encode()
    assert files_everywhere_without(str(clickhouse.data_dir), secret) == []


def test_azure_sas_token_lists_and_reads(azurite: services.Service,
                                         container: tuple[str, object],
                                         tmp_path: Path) -> None:
    """A connection string with a SAS token (read and list only) instead of the key:
    listing and the engine's reads use it; the token's signature is never shown."""
    import datetime as dt

    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    name, _ = container
    sas = generate_account_sas(
        azurite.credentials["account"], azurite.credentials["key"],
        ResourceTypes(service=True, container=True, object=True),
        AccountSasPermissions(read=True, list=True),
        expiry=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    env = az_env(azurite, AZURE_STORAGE_CONNECTION_STRING=f"BlobEndpoint={azurite.url};"
                                                          f"SharedAccessSignature={sas}")
    target = str(tmp_path / "target")
    out, report = load(f"az://{name}/trips/*.csv.gz", "--table", "trips", "--target", target,
                       env=env)
    assert out.returncode == 0, out.stderr
    assert (report["files_loaded"], report["rows_loaded"]) == (FILES, TOTAL)
    signature = dict(p.split("=", 1) for p in sas.split("&"))["sig"]
    assert signature not in out.stdout + out.stderr
    assert files_everywhere_without(target, signature.encode()) == []


def test_azure_gzip_blob_without_gz_in_its_name(azurite: services.Service,
                                                tmp_path: Path) -> None:
    """A gzip export saved as `x.csv` is read as gzip (its first bytes, one ranged GET),
    a plain one beside it as text."""
    import gzip

    name = f"sniff-{uuid.uuid4().hex[:8]}"
    client = services.azure_create_container(azurite, name)
    client.upload_blob("in/a.csv", gzip.compress(b"id\n1\n2\n"))  # type: ignore[attr-defined]
    client.upload_blob("in/b.csv", b"id\n3\n")  # type: ignore[attr-defined]
    target = str(tmp_path / "target")
    out, report = load(f"az://{name}/in/*.csv", "--table", "t", "--target", target,
                       env=az_env(azurite))
    assert out.returncode == 0, out.stderr
    assert (report["files_loaded"], report["rows_loaded"]) == (2, 3)
    got = run_chload("sql", "SELECT sum(id) FROM t", "--target", target, "--format", "TSV")
    assert got.stdout.strip() == "6"
