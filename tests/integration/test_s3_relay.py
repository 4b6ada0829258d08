"""Objects posted to a server as they are stored: gzip CSV in a real MinIO, streamed by
the loader into a real 18.16 server (and a 3-shard cluster), which parses them; what
the loader must still see first (a header in another order, empty fields of Nullable
columns) and an object rewritten after it was listed."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import services
from common import make_trips
from conftest import run_chload
from test_cluster import assert_exact_and_placed, make_tables, shard_args
from test_remote_sources import s3_env

pytestmark = pytest.mark.integration

FILES, ROWS = 8, 125_000
TOTAL = FILES * ROWS
CHECK = "count(), uniqExact(id), sum(miles), sum(duration), sum(vehicle_id)"


@pytest.fixture(scope="module")
def bucket(minio: services.Service, tmp_path_factory: pytest.TempPathFactory) -> str:
    """8 gzip CSV objects of the trips rows (ids 0..999,999), the last one's columns
    written in another order than the others'."""
    directory = tmp_path_factory.mktemp("relay-trips")
    paths = make_trips(str(directory), FILES, ROWS)
    name = f"relay-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, name)
    client = services.minio_client(minio)
    last = Path(paths[-1])
    with gzip.open(last, "rt") as fh:
        lines = fh.read().splitlines()
    reordered = ["vehicle_id,duration,id,miles"] + [
        ",".join((v, d, i, m)) for i, m, d, v in (line.split(",") for line in lines[1:])]
    with gzip.open(last, "wt") as fh:
        fh.write("\n".join(reordered) + "\n")
    for path in paths:
        client.upload_file(path, name, f"trips/{os.path.basename(path)}")  # type: ignore[attr-defined]
    return name


def expected(minio: services.Service, bucket: str) -> str:
    """The checksum as the embedded engine reads the same objects (by column name)."""
    import chdb

    return chdb.query(f"SELECT {CHECK} FROM s3('{minio.url}/{bucket}/trips/*.csv.gz', "
                      f"'{minio.credentials['access_key']}', "
                      f"'{minio.credentials['secret_key']}', 'CSVWithNames')",
                      "TSV").bytes().decode().strip()


def load(pattern: str, table: str, target: str, env: dict[str, str], *extra: str) -> dict:
    out = run_chload("load", pattern, "--table", table, "--target", target, "--json", *extra,
                     env=env, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    return json.loads(out.stdout)


def server_env(minio: services.Service, clickhouse: services.Service,
               tmp_path: Path) -> tuple[str, dict[str, str]]:
    url = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    return url, {**s3_env(minio, tmp_path),
                 "CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}


def test_objects_are_posted_as_stored_exactly_once(
        minio: services.Service, clickhouse: services.Service, bucket: str, tmp_path: Path,
        table_name: str) -> None:
    """Every row in its column though one object's header has another order (18.16
    takes a header's columns by position: the loader names them in the INSERT), a
    rerun skips all, and the secret is nowhere the server keeps."""
    url, env = server_env(minio, clickhouse, tmp_path)
    report = load(f"s3://{bucket}/trips/*.csv.gz", table_name, url, env, "--setting",
                  "log_queries=1")
    assert (report["files_loaded"], report["rows_loaded"]) == (FILES, TOTAL)
    got = services.clickhouse_query(clickhouse, f"SELECT {CHECK} FROM {table_name}").strip()
    assert got == expected(minio, bucket)
    services.clickhouse_query(clickhouse, "SYSTEM FLUSH LOGS")
    posted = services.clickhouse_query(clickhouse, (
        "SELECT countIf(query LIKE '%FORMAT CSVWithNames%'), countIf(query LIKE "
        "'%(`vehicle_id`, `duration`, `id`, `miles`) FORMAT CSVWithNames%') FROM "
        "system.query_log WHERE type = 2 AND query LIKE 'INSERT INTO chload.stage%'"))
    assert posted.split() == [str(FILES), "1"]  # (the server parsed every object)
    again = load(f"s3://{bucket}/trips/*.csv.gz", table_name, url, env)
    assert (again["files_loaded"], again["files_skipped"]) == (0, FILES)
    secret = minio.credentials["secret_key"].encode()
    for root, _, names in os.walk(clickhouse.data_dir):
        for file in names:
            with open(os.path.join(root, file), "rb") as fh:
                assert secret not in fh.read(), file


def test_empty_fields_stay_null(minio: services.Service, clickhouse: services.Service,
                                tmp_path: Path, table_name: str) -> None:
    """An object whose start has an empty field of a Nullable column: 18.16 would read
    it as 0, so it goes through the loader's engine, which keeps the NULL."""
    name = f"relay-nulls-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, name)
    client = services.minio_client(minio)
    body = gzip.compress(b"id,score\n1,\n2,5\n3,\n")
    client.put_object(Bucket=name, Key="n.csv.gz", Body=body)  # type: ignore[attr-defined]
    url, env = server_env(minio, clickhouse, tmp_path)
    load(f"s3://{name}/n.csv.gz", table_name, url, env, "--schema",
         "id UInt32, score Nullable(UInt32)")
    got = services.clickhouse_query(
        clickhouse, f"SELECT count(), countIf(isNull(score)), sum(score) FROM {table_name}")
    assert got.split() == ["3", "2", "5"]


def test_an_object_rewritten_after_listing_fails_then_loads(
        minio: services.Service, clickhouse: services.Service, tmp_path: Path,
        table_name: str) -> None:
    """Listed as one object, rewritten before its bytes are read: the read asks for the
    listed ETag, so the file fails in one line and nothing of either version loads; the
    next run loads what is there now, once."""
    name = f"relay-rewrite-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, name)
    client = services.minio_client(minio)
    client.put_object(Bucket=name, Key="r.csv", Body=b"id\n1\n2\n")  # type: ignore[attr-defined]
    url, env = server_env(minio, clickhouse, tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "chload", "load", f"s3://{name}/r.csv", "--table", table_name,
         "--target", url, "--schema", "id UInt32", "--json"],
        env={**os.environ, **env, "CHLOAD_PAUSE_AT": "relay:4"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)  # listed by now, paused before the read (4 s)
    client.put_object(Bucket=name, Key="r.csv", Body=b"id\n7\n8\n9\n")  # type: ignore[attr-defined]
    out, err = proc.communicate(timeout=120)
    report = json.loads(out)
    assert report["files_failed"] == 1, err
    assert "changed since it was listed" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "r.csv" in line]) >= 1
    assert services.clickhouse_query(
        clickhouse, f"SELECT count() FROM {table_name}").strip() == "0"
    again = load(f"s3://{name}/r.csv", table_name, url, env, "--schema", "id UInt32")
    assert (again["files_loaded"], again["rows_loaded"]) == (1, 3)
    assert services.clickhouse_query(
        clickhouse, f"SELECT groupArray(id) FROM (SELECT id FROM {table_name} ORDER BY id)"
    ).strip() == "[7,8,9]"


def test_into_a_cluster_by_key(minio: services.Service, weighted_cluster, bucket: str,
                               tmp_path: Path) -> None:
    """The cluster's entry server parses the posted objects and routes every row by
    the Distributed table's key: exact, each row on its shard, a rerun skips all."""
    table = make_tables(weighted_cluster, "cityHash64(id)")
    env = s3_env(minio, tmp_path)
    target = f"{weighted_cluster.servers[0].url}/default"
    report = load(f"s3://{bucket}/trips/*.csv.gz", table, target, env,
                  *shard_args(weighted_cluster))
    assert report["rows_loaded"] == TOTAL
    assert_exact_and_placed(weighted_cluster, table)
    got = services.clickhouse_query(weighted_cluster.servers[0],
                                    f"SELECT {CHECK} FROM default.{table}").strip()
    assert got == expected(minio, bucket)
    again = load(f"s3://{bucket}/trips/*.csv.gz", table, target, env,
                 *shard_args(weighted_cluster))
    assert (again["files_loaded"], again["files_skipped"]) == (0, FILES)
