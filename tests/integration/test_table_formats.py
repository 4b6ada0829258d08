"""Iceberg and Delta Lake tables (written by pyiceberg and delta-rs, on local disk and on
MinIO) loaded as their snapshots' data files: exactly once, appends only (a snapshot
that rewrote loaded files: the whole table again, under --mode replace-table).

Each test writes its own tables (bench/lake_tables.py: both formats, the same rows), so
what a table holds is known: ids [lo, hi) give count, sum(id) and sum(amount) exactly.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import services
from conftest import kill_moments, kill_when, run_chload, top_block
from lake_tables import LakeTables, S3Access

pytestmark = pytest.mark.integration

FORMATS = ["iceberg", "delta"]
ROWS = 20_000  # rows an append adds in the small tables
FULL_APPEND = 1_666_667  # the full-size tables: 5M rows in three appends
OLD_SERVER_SCHEMA = "id Int64, amount Decimal(18, 2), at DateTime, name String"


@pytest.fixture(scope="module")
def lake_bucket(minio: services.Service) -> str:
    name = f"lake-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, name)
    return name


def s3_access(minio: services.Service) -> S3Access:
    return S3Access(minio.url, minio.credentials["access_key"], minio.credentials["secret_key"])


def s3_env(minio: services.Service, tmp_path: Path) -> dict[str, str]:
    """Endpoint and keys only through the AWS environment variables; no profile files."""
    return {
        "AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": minio.credentials["access_key"],
        "AWS_SECRET_ACCESS_KEY": minio.credentials["secret_key"], "AWS_SESSION_TOKEN": "",
        "AWS_PROFILE": "", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
    }


def load(uri: str, table: str, target: str, *extra: str, env: dict[str, str] | None = None,
         ) -> tuple[int, dict, str]:
    if target.startswith("http"):  # 18.16 has no DateTime64: its seconds, as the load says
        extra = ("--schema", OLD_SERVER_SCHEMA, *extra)
    out = run_chload("load", uri, "--table", table, "--target", target, "--json", *extra,
                     env=env, timeout=240)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


def totals(target: str, table: str, env: dict[str, str] | None = None) -> tuple[int, ...]:
    """count(), uniqExact(id), sum(id), and sum(amount) in hundredths."""
    out = run_chload("sql", f"SELECT count(), uniqExact(id), sum(id), "
                     f"toInt64(sum(amount) * 100) FROM {table}", "--target", target,
                     "--format", "TSV", env=env)
    assert out.returncode == 0, out.stderr
    return tuple(int(v) for v in out.stdout.split())


def expected(*ranges: tuple[int, int]) -> tuple[int, ...]:
    """totals() of a table holding the ids of `ranges` (amount = id / 100)."""
    count = sum(hi - lo for lo, hi in ranges)
    total = sum((lo + hi - 1) * (hi - lo) // 2 for lo, hi in ranges)
    distinct, end = 0, None
    for lo, hi in sorted(ranges):  # ids held by more than one range count once
        lo = lo if end is None else max(lo, end)
        distinct += max(0, hi - lo)
        end = hi if end is None else max(end, hi)
    return count, distinct, total, total


def appended(tables: LakeTables, count: int, rows: int = ROWS) -> list[tuple[int, int]]:
    ranges = [(i * rows, (i + 1) * rows) for i in range(count)]
    for lo, hi in ranges:
        tables.append(lo, hi)
    return ranges


@pytest.mark.parametrize("where", ["file", "s3"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_three_appends_exact_a_rerun_skips_a_new_append_loads_only_its_rows(
        fmt: str, where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env: dict[str, str] | None = None
    if where == "s3":
        minio = request.getfixturevalue("minio")
        bucket = request.getfixturevalue("lake_bucket")
        tables = LakeTables(f"s3://{bucket}/{uuid.uuid4().hex[:8]}", s3=s3_access(minio),
                        formats=(fmt,))
        env = s3_env(minio, tmp_path)
    else:
        tables = LakeTables(str(tmp_path / "lake"), formats=(fmt,))
    ranges = appended(tables, 3)
    target = str(tmp_path / "target")
    code, report, err = load(tables.uri(fmt), "t", target, env=env)
    assert code == 0, err
    assert (report["files_loaded"], report["rows_loaded"]) == (3, 3 * ROWS)
    assert totals(target, "t") == expected(*ranges)
    code, report, err = load(tables.uri(fmt), "t", target, env=env)
    assert code == 0, err
    assert (report["files_loaded"], report["files_skipped"]) == (0, 3)
    tables.append(3 * ROWS, 3 * ROWS + 777)
    code, report, err = load(tables.uri(fmt), "t", target, env=env)
    assert code == 0, err
    assert (report["files_loaded"], report["rows_loaded"]) == (1, 777)
    assert totals(target, "t") == expected(*ranges, (3 * ROWS, 3 * ROWS + 777))
    if env is not None:
        secret = env["AWS_SECRET_ACCESS_KEY"]
        ledger = run_chload("files", "--table", "t", "--target", target, "--json")
        assert secret not in json.dumps(report) + err + ledger.stdout + ledger.stderr
        assert {r["uri"][:5] for r in json.loads(ledger.stdout)} == {"s3://"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_types_arrive_as_the_table_defines_them(fmt: str, tmp_path: Path) -> None:
    tables = LakeTables(str(tmp_path / "lake"), formats=(fmt,))
    appended(tables, 1, 1000)
    target = str(tmp_path / "target")
    assert load(tables.uri(fmt), "t", target)[0] == 0
    out = run_chload("sql", "SELECT toTypeName(amount), toTypeName(at), toString(max(at)), "
                     "toString(max(amount)) FROM t GROUP BY 1, 2", "--target", target,
                     "--format", "TSV")
    types = out.stdout.strip().split("\t")
    assert types[0].removeprefix("Nullable(").startswith("Decimal(18, 2)"), types
    assert types[1].removeprefix("Nullable(").startswith("DateTime64(6"), types  # micros
    assert types[2:] == ["2026-01-01 00:16:39.000000", "9.99"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_overwrite_or_a_delete_is_refused_never_appended(fmt: str, tmp_path: Path) -> None:
    tables = LakeTables(str(tmp_path / "lake"), formats=(fmt,))
    ranges = appended(tables, 2)
    target = str(tmp_path / "target")
    assert load(tables.uri(fmt), "t", target)[0] == 0
    tables.overwrite(100_000, 100_500)
    code, report, err = load(tables.uri(fmt), "t", target)
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "overwrite" in err and "appends only" in err and "nothing was loaded" in err, err
    assert totals(target, "t") == expected(*ranges)
    # a table loaded after the overwrite holds what the table holds now; then a delete
    assert load(tables.uri(fmt), "now", target)[0] == 0
    assert totals(target, "now") == expected((100_000, 100_500))
    tables.delete_below(100_100)
    code, report, err = load(tables.uri(fmt), "now", target)
    assert code != 0 and "delete" in err and "appends only" in err, err
    assert totals(target, "now") == expected((100_000, 100_500))


@pytest.mark.parametrize(("fmt", "where"), [("iceberg", "embedded"), ("delta", "embedded"),
                                           ("iceberg", "18.16"), ("delta", "18.16")])
def test_an_overwrite_under_replace_table_makes_the_table_the_snapshot_then_appends_add(
        fmt: str, where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Two appends loaded, then an overwrite: a plain run refuses it in one line naming
    --mode replace-table, loading nothing; a run with it leaves the table equal to the
    current snapshot; an append run after it loads a new append's rows only. A delete
    (files rewritten) then goes the same way."""
    env: dict[str, str] | None = None
    if where == "18.16":
        minio, clickhouse = request.getfixturevalue("minio"), request.getfixturevalue(
            "clickhouse")
        tables = LakeTables(f"s3://{request.getfixturevalue('lake_bucket')}/"
                            f"{uuid.uuid4().hex[:8]}", s3=s3_access(minio), formats=(fmt,))
        target = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
        env = {**s3_env(minio, tmp_path),
               "CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
        table = request.getfixturevalue("table_name")
    else:
        tables = LakeTables(str(tmp_path / "lake"), formats=(fmt,))
        target, table = str(tmp_path / "target"), "t"
    ranges = appended(tables, 2)
    assert load(tables.uri(fmt), table, target, env=env)[0] == 0
    tables.overwrite(100_000, 100_500)
    code, report, err = load(tables.uri(fmt), table, target, env=env)
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "no longer in" in err and "run it with --mode replace-table" in err, err
    assert totals(target, table, env) == expected(*ranges)

    code, report, err = load(tables.uri(fmt), table, target, "--mode", "replace-table",
                             env=env)
    assert code == 0, err
    assert (report["files_loaded"], report["rows_loaded"]) == (1, 500), report
    assert totals(target, table, env) == expected((100_000, 100_500))

    tables.append(200_000, 200_300)
    code, report, err = load(tables.uri(fmt), table, target, env=env)
    assert code == 0, err
    assert (report["files_loaded"], report["files_skipped"], report["rows_loaded"]) == (
        1, 1, 300), report
    now = [(100_000, 100_500), (200_000, 200_300)]
    assert totals(target, table, env) == expected(*now)

    tables.delete_below(100_100)  # a file rewritten without its first 100 rows
    code, report, err = load(tables.uri(fmt), table, target, env=env)
    assert code != 0 and "no longer in" in err and "--mode replace-table" in err, err
    assert totals(target, table, env) == expected(*now)
    code, report, err = load(tables.uri(fmt), table, target, "--mode", "replace-table",
                             env=env)
    assert code == 0, err
    assert totals(target, table, env) == expected((100_100, 100_500), (200_000, 200_300))
    if env is not None:
        assert env["AWS_SECRET_ACCESS_KEY"] not in err + json.dumps(report)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_pinned_snapshot_loads_then_the_current_one_adds_the_rest(
        fmt: str, tmp_path: Path) -> None:
    tables = LakeTables(str(tmp_path / "lake"), formats=(fmt,))
    ranges = appended(tables, 3, 1000)
    target = str(tmp_path / "target")
    if fmt == "delta":
        first = tables.uri(fmt) + "?version=0"
    else:
        snaps = tables.catalog.load_table("db.events").metadata.snapshots
        first = tables.uri(fmt) + f"?snapshot={snaps[0].snapshot_id}"
    code, report, err = load(first, "t", target)
    assert code == 0 and report["files_loaded"] == 1, err
    assert totals(target, "t") == expected(ranges[0])
    code, report, err = load(tables.uri(fmt), "t", target)
    assert code == 0 and report["files_loaded"] == 2, err
    assert totals(target, "t") == expected(*ranges)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_new_column_is_added_when_asked(fmt: str, tmp_path: Path) -> None:
    tables = LakeTables(str(tmp_path / "lake"), formats=(fmt,))
    ranges = appended(tables, 2, 1000)
    target = str(tmp_path / "target")
    assert load(tables.uri(fmt), "t", target)[0] == 0
    tables.append(5000, 5100, extra=True)
    code, _, err = load(tables.uri(fmt), "t", target)
    assert code != 0 and "score" in err and "--on-new-column add" in err, err
    code, report, err = load(tables.uri(fmt), "t", target, "--on-new-column", "add")
    assert code == 0 and report["files_loaded"] == 1, err
    assert totals(target, "t") == expected(*ranges, (5000, 5100))
    out = run_chload("sql", "SELECT count(score), sum(score) FROM t", "--target", target,
                     "--format", "TSV")
    assert [float(v) for v in out.stdout.split()] == [
        100, sum(i * 0.5 for i in range(5000, 5100))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_kill_9_mid_load_then_a_rerun_is_exact(fmt: str, tmp_path: Path) -> None:
    """A table of 5M rows in three appends, each data file big enough to commit alone;
    the load killed at three moments (first stage filling, right after its first commit,
    a rerun's stage filling), then finished: every row once; a rerun skips; a fourth
    append loads only its rows; an overwrite is refused, the table left as it was."""
    tables = LakeTables(str(tmp_path / "lake"), formats=(fmt,))
    ranges = appended(tables, 3, FULL_APPEND)  # more than a block: a stage fills in parts
    target = str(tmp_path / "target")
    argv = [sys.executable, "-m", "chload", "load", tables.uri(fmt), "--table", "t",
            "--target", target, "--workers", "1"]
    for what, ready in kill_moments(target, "t"):
        before = top_block(target, "t")
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kill_when(proc, functools.partial(ready, proc.pid, before), what)
    assert subprocess.run(argv, capture_output=True, timeout=240).returncode == 0
    assert totals(target, "t") == expected(*ranges)
    after_kills(tables, fmt, "t", target, ranges)


def after_kills(tables: LakeTables, fmt: str, table: str, target: str,
                ranges: list[tuple[int, int]], env: dict[str, str] | None = None) -> None:
    """The checks after a killed load of the full-size table finished: a rerun skips
    its three files, a new append loads only its rows, an overwrite is refused."""
    code, report, err = load(tables.uri(fmt), table, target, env=env)
    assert code == 0 and (report["files_loaded"], report["files_skipped"]) == (0, 3), err
    new = (3 * FULL_APPEND, 3 * FULL_APPEND + 1234)
    tables.append(*new)
    code, report, err = load(tables.uri(fmt), table, target, env=env)
    assert code == 0 and (report["files_loaded"], report["rows_loaded"]) == (1, 1234), err
    tables.overwrite(0, 10)
    code, _, err = load(tables.uri(fmt), table, target, env=env)
    assert code != 0 and "appends only" in err, err
    assert totals(target, table, env) == expected(*ranges, new)


@pytest.mark.parametrize("fmt", FORMATS)
def test_into_18_16_the_loaders_chdb_reads_and_pushes(
        fmt: str, clickhouse: services.Service, minio: services.Service, lake_bucket: str,
        table_name: str, tmp_path: Path) -> None:
    tables = LakeTables(f"s3://{lake_bucket}/{uuid.uuid4().hex[:8]}", s3=s3_access(minio),
                        formats=(fmt,))
    ranges = appended(tables, 3)
    target = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    env = {**s3_env(minio, tmp_path), "CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    code, report, err = load(tables.uri(fmt), table_name, target, env=env)
    assert code == 0 and report["files_loaded"] == 3, err
    assert totals(target, table_name, env) == expected(*ranges)
    assert load(tables.uri(fmt), table_name, target, env=env)[1]["files_skipped"] == 3
    tables.append(90_000, 90_100)
    code, report, err = load(tables.uri(fmt), table_name, target, env=env)
    assert code == 0 and (report["files_loaded"], report["rows_loaded"]) == (1, 100), err
    assert totals(target, table_name, env) == expected(*ranges, (90_000, 90_100))
    tables.overwrite(0, 10)
    code, _, err = load(tables.uri(fmt), table_name, target, env=env)
    assert code != 0 and "appends only" in err, err
    assert totals(target, table_name, env) == expected(*ranges, (90_000, 90_100))
    assert env["AWS_SECRET_ACCESS_KEY"] not in err + json.dumps(report)


@pytest.mark.parametrize("fmt", FORMATS)
def test_following_loads_each_new_append_once_and_stops_at_an_overwrite(
        fmt: str, minio: services.Service, lake_bucket: str, tmp_path: Path) -> None:
    """`--follow --poll 1` on a table on S3: each append a poll finds loads once; an
    overwrite ends the run with its one line, the appends loaded before it intact."""
    from test_follow import Follower

    tables = LakeTables(f"s3://{lake_bucket}/{uuid.uuid4().hex[:8]}", s3=s3_access(minio),
                        formats=(fmt,))
    ranges = appended(tables, 1, 1000)
    target, env = str(tmp_path / "target"), s3_env(minio, tmp_path)
    follower = Follower(tables.uri(fmt), "--table", "t", "--target", target, "--json",
                        env=env)
    follower.wait_for(lambda line: '"event": "poll"' in line and '"files": 1' in line)
    for lo in (1000, 2000):
        tables.append(lo, lo + 1000)
        ranges.append((lo, lo + 1000))
        follower.wait_for(lambda line: '"event": "poll"' in line and '"files": 1' in line)
    tables.overwrite(0, 10)
    follower.proc.wait(timeout=60)
    rest = follower.stop_reading()
    err = "".join(follower.err)
    assert follower.proc.returncode != 0 and "appends only" in err, err
    assert "--mode replace-table (not with --follow)" in err, err
    report = json.loads(rest[-1])  # the run's report: what it committed stands
    assert report["files_loaded"] == 3 and "appends only" in " ".join(report["errors"]), rest
    assert totals(target, "t") == expected(*ranges)


def test_an_iceberg_sql_catalog_names_the_table_on_s3(
        minio: services.Service, lake_bucket: str, tmp_path: Path) -> None:
    """pyiceberg's SQL catalog in SQLite, the warehouse on MinIO: the catalog's table
    loads, an append adds its rows only, an overwrite is refused."""
    tables = LakeTables(f"s3://{lake_bucket}/{uuid.uuid4().hex[:8]}", s3=s3_access(minio),
                        formats=("iceberg",))
    ranges = appended(tables, 2, 1000)
    uri = f"iceberg+sqlite://{tables.catalog_dir}/catalog.db?table=db.events&catalog=lake"
    target, env = str(tmp_path / "target"), s3_env(minio, tmp_path)
    code, report, err = load(uri, "t", target, env=env)
    assert code == 0 and report["files_loaded"] == 2, err
    tables.append(7000, 7010)
    code, report, err = load(uri, "t", target, env=env)
    assert code == 0 and report["files_loaded"] == 1, err
    assert totals(target, "t") == expected(*ranges, (7000, 7010))
    tables.overwrite(0, 5)
    code, _, err = load(uri, "t", target, env=env)
    assert code != 0 and "appends only" in err, err
    code, _, err = load(uri.replace("db.events", "db.nothing"), "t", target, env=env)
    assert code != 0 and "no such table in the catalog" in err, err


def test_partitions_and_nested_columns_arrive_as_written(tmp_path: Path) -> None:
    """An Iceberg table partitioned by identity (its files keep the column) with a list
    and a struct column loads as written."""
    import pyarrow as pa

    data = pa.table({
        "id": pa.array(range(6), pa.int64()), "region": pa.array(["eu", "us"] * 3),
        "tags": pa.array([["a", "b"], [], ["c"], ["d"], [], ["e", "f"]], pa.list_(pa.string())),
        "point": pa.array([{"x": i, "y": i / 2} for i in range(6)],
                          pa.struct([("x", pa.int64()), ("y", pa.float64())]))})
    tables = LakeTables(str(tmp_path / "lake"), formats=())
    iceberg = tables.catalog.create_table("db.p", schema=data.schema)
    with iceberg.update_spec() as spec:
        spec.add_identity("region")
    iceberg.append(data)
    target = str(tmp_path / "target")
    code, report, err = load(tables.uri("iceberg").replace("/events", "/p"), "p", target)
    assert code == 0 and report["files_loaded"] == 2, err  # one file a partition
    out = run_chload("sql", "SELECT groupArray(region), groupArray(tags), "
                     "groupArray(point.y) FROM (SELECT * FROM p ORDER BY id)",
                     "--target", target, "--format", "TSV")
    assert out.stdout.split("\t") == [
        "['eu','us','eu','us','eu','us']", "[['a','b'],[],['c'],['d'],[],['e','f']]",
        "[0,0.5,1,1.5,2,2.5]\n"], out.stderr


def partitioned_rows(lo: int, hi: int) -> Any:
    """Rows lo..hi-1: region EU, US or NULL (id % 3), day 2024-01-01, 2024-01-02, NULL
    (id % 4: the first day twice), n 10 or NULL (id % 5 == 0)."""
    import pyarrow as pa

    ids = range(lo, hi)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "region": pa.array([("EU", "US", None)[i % 3] for i in ids], pa.string()),
        "day": pa.array([(datetime.date(2024, 1, 1), datetime.date(2024, 1, 2),
                          datetime.date(2024, 1, 1), None)[i % 4] for i in ids], pa.date32()),
        "n": pa.array([None if i % 5 == 0 else 10 for i in ids], pa.int32())})


def partition_sums(*ranges: tuple[int, int]) -> list[str]:
    """The TSV lines of `GROUP BY region, day, n ORDER BY region, day, n` (NULLs last)
    over `partitioned_rows` of `ranges`: each partition's count and sum(id)."""
    groups: dict[tuple, list[int]] = {}
    for lo, hi in ranges:
        for row in partitioned_rows(lo, hi).to_pylist():
            key = (row["region"], row["day"], row["n"])
            groups.setdefault(key, [0, 0])
            groups[key][0] += 1
            groups[key][1] += row["id"]

    def last(v: Any) -> tuple:
        return (v is None, v if v is not None else 0)
    return ["\t".join(["\\N" if v is None else str(v) for v in key] + [str(c), str(t)])
            for key, (c, t) in sorted(groups.items(), key=lambda kv: tuple(map(last, kv[0])))]


@pytest.mark.parametrize(("into", "where"), [("embedded", "file"), ("embedded", "s3"),
                                             ("18.16", "s3")])
def test_a_partitioned_delta_table_loads_its_partition_values_typed_with_nulls(
        into: str, where: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A Delta table partitioned by a string, a date and an int (its data files hold none
    of them: the log does), NULL among each, over two appends: every row gets its
    file's values, typed as the table's schema, NULL kept; a rerun skips every file."""
    from deltalake import write_deltalake

    env: dict[str, str] = {}
    options = None
    location = str(tmp_path / "parts")
    if where == "s3":
        minio = request.getfixturevalue("minio")
        bucket = request.getfixturevalue("lake_bucket")
        options = s3_access(minio).delta()
        location = f"s3://{bucket}/{uuid.uuid4().hex[:8]}/parts"
        env = s3_env(minio, tmp_path)
    uri = f"delta+{location}" if where == "s3" else f"delta+file://{location}"
    target, extra = str(tmp_path / "target"), []
    if into == "18.16":  # no Date32 there: a date column is told Date, as a file's would be
        server = request.getfixturevalue("clickhouse")
        target = f"http://loader@127.0.0.1:{server.ports['http']}/default"
        env["CLICKHOUSE_PASSWORD"] = server.credentials["password"]
        extra = ["--schema", "id Int64, region Nullable(String), day Nullable(Date), "
                 "n Nullable(Int32)"]
    table = f"parts_{uuid.uuid4().hex[:8]}"
    counts = []
    for lo, hi in [(0, 3000), (3000, 4000)]:
        write_deltalake(location, partitioned_rows(lo, hi), mode="append",
                        partition_by=["region", "day", "n"], storage_options=options)
        out = run_chload("load", uri, "--table", table, "--target", target, "--json",
                         *extra, env=env, timeout=240)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        counts.append(json.loads(out.stdout)["files_loaded"])
    assert counts[0] == 18 and counts[1] == 18, counts  # 3 regions x 3 days x 2 n's
    out = run_chload("sql", f"SELECT region, day, n, count(), sum(id) FROM {table} GROUP BY "
                     "region, day, n ORDER BY region, day, n", "--target", target,
                     "--format", "TSV", env=env)
    assert out.stdout.splitlines() == partition_sums((0, 3000), (3000, 4000)), out.stderr
    out = run_chload("sql", f"SELECT toTypeName(region), toTypeName(day), toTypeName(n) "
                     f"FROM {table} LIMIT 1", "--target", target, "--format", "TSV", env=env)
    date = "Date32" if into == "embedded" else "Date"
    assert out.stdout.split() == ["Nullable(String)", f"Nullable({date})",
                                  "Nullable(Int32)"], out.stderr
    again = run_chload("load", uri, "--table", table, "--target", target, "--json", *extra,
                       env=env)
    assert json.loads(again.stdout)["files_skipped"] == 36, again.stderr


@pytest.mark.parametrize("fmt", FORMATS)
def test_into_18_16_killed_mid_load_then_a_rerun_is_exact(
        fmt: str, clickhouse: services.Service, minio: services.Service, lake_bucket: str,
        table_name: str, tmp_path: Path) -> None:
    """Killed while the server's stages fill, then killed inside its first commit (the
    committing entry written, nothing attached): the next run loads every row once."""
    tables = LakeTables(f"s3://{lake_bucket}/{uuid.uuid4().hex[:8]}", s3=s3_access(minio),
                        formats=(fmt,))
    ranges = appended(tables, 3, FULL_APPEND)
    target = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    env = {**os.environ, **s3_env(minio, tmp_path),
           "CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    argv = [sys.executable, "-m", "chload", "load", tables.uri(fmt), "--table", table_name,
            "--target", target, "--schema", OLD_SERVER_SCHEMA, "--quiet"]

    def stages() -> bool:
        return services.clickhouse_query(
            clickhouse, "SELECT count() FROM system.tables WHERE database = 'chload' AND "
            "startsWith(name, 'stage_')").strip() != "0"

    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(proc, stages, "a stage on the server")
    crash = subprocess.run(argv, env={**env, "CHLOAD_CRASH_AT": "server-before-attach:1"},
                           capture_output=True, timeout=240)
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    code, report, err = load(tables.uri(fmt), table_name, target, env=env)
    assert code == 0, err
    assert totals(target, table_name, env) == expected(*ranges)
    assert report["files_loaded"] + report["files_skipped"] == 3
    after_kills(tables, fmt, table_name, target, ranges, env)


def test_delta_partitions_by_timestamp_boolean_and_decimal_arrive_typed_from_s3(
        minio: services.Service, lake_bucket: str, tmp_path: Path) -> None:
    """Timestamp partitions put `%`-escaped folder names on S3 (`at=2024-01-02%2003%3A04...`):
    a batch of such objects read in one s3() still gives each row its own file's values,
    typed as the table's schema (a timestamp to the microsecond, NULL kept)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    at = [datetime.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC), None,
          datetime.datetime(2023, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)]
    ids = range(300)
    data = pa.table({"id": pa.array(ids, pa.int64()),
                     "at": pa.array([at[i % 3] for i in ids], pa.timestamp("us", "UTC")),
                     "ok": pa.array([(True, False)[i % 2] for i in ids]),
                     "price": pa.array([decimal.Decimal(f"{i % 4}.25") for i in ids],
                                       pa.decimal128(9, 2))})
    location = f"s3://{lake_bucket}/{uuid.uuid4().hex[:8]}/stamps"
    write_deltalake(location, data, partition_by=["at", "ok", "price"],
                    storage_options=s3_access(minio).delta())
    target, env = str(tmp_path / "target"), s3_env(minio, tmp_path)
    out = run_chload("load", f"delta+{location}", "--table", "s", "--target", target,
                     "--json", env=env, timeout=240)
    assert out.returncode == 0 and json.loads(out.stdout)["files_loaded"] == 12, out.stderr
    out = run_chload("sql", "SELECT toTypeName(at), toTypeName(ok), toTypeName(price), "
                     "arraySort(r -> r.1, groupArray((id, toString(at), ok, price))) FROM s "
                     "GROUP BY 1, 2, 3", "--target", target, "--format", "JSON", env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["data"]
    assert len(got) == 1 and list(got[0].values())[:3] == [
        "Nullable(DateTime64(6, 'UTC'))", "Nullable(Bool)", "Nullable(Decimal(9, 2))"]
    rows = list(got[0].values())[3]
    stamps = ["2024-01-02 03:04:05.678901", None, "2023-12-31 23:59:59.000000"]
    assert [r[1] for r in rows] == [stamps[i % 3] for i in ids]
    assert [r[2] for r in rows] == [i % 2 == 0 for i in ids]
    assert [float(r[3]) for r in rows] == [i % 4 + 0.25 for i in ids]
