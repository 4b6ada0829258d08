"""Iceberg and Delta table sources without a table: their URIs, the appends-only check
against what the ledger holds, and their units as the file sources read them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from chload.errors import SourceError, UsageError
from chload.sources import registry
from chload.sources.files import aws
from chload.sources.lake.table import DataFile, Snapshot, TableUri, check_appends, parse, units

S3 = aws.S3Settings("http://127.0.0.1:9000", "us-east-1",
                    aws.Credentials("AK", "SECRET"), custom_endpoint=True)


def test_table_uris_name_format_storage_root_and_pinned_snapshot(tmp_path) -> None:
    assert parse("iceberg+s3://wh/db/events/?snapshot=12", "iceberg", "snapshot") == TableUri(
        "iceberg+s3://wh/db/events/?snapshot=12", "iceberg", "s3", "s3://wh/db/events", "12")
    local = parse(f"delta+file://{tmp_path}/sales", "delta", "version")
    assert (local.storage, local.root, local.pinned) == ("file", f"{tmp_path}/sales", "")
    with pytest.raises(UsageError, match=r"takes only \?version=N"):
        parse("delta+file:///x?snapshot=3", "delta", "version")
    with pytest.raises(UsageError, match=r"takes only \?snapshot=N"):
        parse("iceberg+s3://wh/t?snapshot=latest", "iceberg", "snapshot")


def test_the_schemes_are_registered_and_s3_tables_resolve_s3_settings() -> None:
    assert [registry.kind_of(u) for u in ("iceberg+s3://b/t", "ICEBERG+FILE:///t",
                                         "delta+s3://b/t", "delta+file:///t")] == [
        "iceberg", "iceberg", "delta", "delta"]
    env = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b",
           "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    assert registry.s3_settings(["delta+s3://b/t"], env, "http://127.0.0.1:9") is not None
    assert registry.s3_settings(["delta+file:///t"], env, None) is None


TABLE = TableUri("delta+s3://lake/sales", "delta", "s3", "s3://lake/sales")


def test_appends_over_what_was_loaded_pass() -> None:
    snap = Snapshot("3", [DataFile("s3://lake/sales/a.parquet", 10),
                          DataFile("s3://lake/sales/b.parquet", 20)], [("1", "delete")])
    check_appends(TABLE, snap, {"s3://lake/sales/a.parquet": "delta:10",
                                "s3://lake/salesman/z.parquet": "delta:1",  # another table
                                "s3://other/x.csv": "e"})


def test_a_snapshot_without_a_loaded_file_is_refused_naming_what_removed_it() -> None:
    snap = Snapshot("5", [DataFile("s3://lake/sales/c.parquet", 10)],
                    [("2", "optimize"), ("5", "write (overwrite)")])
    with pytest.raises(SourceError) as exc:
        check_appends(TABLE, snap, {"s3://lake/sales/a.parquet": "delta:10"})
    assert str(exc.value) == (
        "delta+s3://lake/sales: 1 data file(s) loaded earlier into this table are no longer "
        "in version 5 (its operation: write (overwrite)); a load appends only new data files, so "
        "nothing was loaded: run it with --mode replace-table (not with --follow) to make "
        "the table this version")


def test_a_snapshot_whose_files_are_not_its_rows_is_refused_even_first() -> None:
    snap = Snapshot("9", [DataFile("s3://lake/sales/a.parquet", 1)], unreadable="has deletes")
    with pytest.raises(SourceError, match="sales: has deletes; nothing was loaded"):
        check_appends(TABLE, snap, {})


def test_units_are_parquet_files_of_their_storage_with_a_written_once_identity() -> None:
    snap = Snapshot("1", [DataFile("s3://lake/sales/a b.parquet", 10),
                          DataFile("/data/t/x.orc", 5, "orc")])
    s3_unit, local_unit = units(TABLE, snap, S3)
    assert (s3_unit.kind, s3_unit.uri, s3_unit.identity, s3_unit.format.name) == (
        "s3", "s3://lake/sales/a b.parquet", "delta:10", "Parquet")
    assert s3_unit.location == "http://127.0.0.1:9000/lake/sales/a%20b.parquet"
    assert "SECRET" not in repr(s3_unit)
    assert (local_unit.kind, local_unit.local_path, local_unit.format.name) == (
        "local", "/data/t/x.orc", "ORC")
    with pytest.raises(SourceError, match="neither on S3 nor on this machine"):
        list(units(TABLE, Snapshot("1", [DataFile("abfss://c@a/t/x.parquet", 1)]), S3))


def test_iceberg_metadata_read_here_names_the_files_pyiceberg_plans(tmp_path) -> None:
    """Our reading of the JSON and Avro metadata against pyiceberg's own scan, at every
    snapshot of a table with appends, a new column, an overwrite and a delete."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from lake_tables import LakeTables

    from chload.sources.base import SourceContext
    from chload.sources.lake import iceberg

    tables = LakeTables(str(tmp_path / "lake"), formats=("iceberg",))
    tables.append(0, 10)
    tables.append(10, 20, extra=True)
    tables.overwrite(100, 110)
    tables.append(200, 210)
    tables.delete_below(105)
    table = tables.catalog.load_table("db.events")
    ops = []
    for snap in table.metadata.snapshots:
        uri = parse(f"{tables.uri('iceberg')}?snapshot={snap.snapshot_id}", "iceberg",
                    "snapshot")
        ours = iceberg.read(uri, SourceContext())
        theirs = {(t.file.file_path.removeprefix("file://"), t.file.file_size_in_bytes)
                  for t in table.scan(snapshot_id=snap.snapshot_id).plan_files()}
        assert {(f.uri, f.size) for f in ours.files} == theirs
        ops.append(ours.removals[-1][1] if ours.removals else "append")
    assert ops == ["append", "append", "delete", "delete", "delete", "overwrite"]


def test_an_iceberg_table_that_renamed_a_column_is_refused_first_time(tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from lake_tables import LakeTables

    from chload.sources.base import SourceContext
    from chload.sources.lake import iceberg

    tables = LakeTables(str(tmp_path / "lake"), formats=("iceberg",))
    tables.append(0, 10)
    with tables.catalog.load_table("db.events").update_schema() as update:
        update.rename_column("name", "label")
    with pytest.raises(SourceError, match=r"renamed column\(s\) label/name, so its older"):
        list(iceberg.SOURCE.open().list(tables.uri("iceberg"), SourceContext()))


def test_an_overwritten_snapshot_is_listed_whole_under_replace_table_only(tmp_path) -> None:
    """Files loaded, then an overwrite: appending (and replace-partitions, which lists
    with force) refuses; replace-table, or --force of an append, lists the snapshot."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from lake_tables import LakeTables

    from chload.sources.base import SourceContext
    from chload.sources.lake import iceberg

    tables = LakeTables(str(tmp_path / "lake"), formats=("iceberg",))
    tables.append(0, 10)
    tables.append(10, 20)
    loaded = {f.uri: f.etag for f in iceberg.SOURCE.open().list(tables.uri("iceberg"),
                                                               SourceContext())}
    assert len(loaded) == 2
    tables.overwrite(100, 105)

    def listed(mode: str, force: bool) -> set[str]:
        context = SourceContext(mode=mode, force=force, committed=lambda: loaded)
        return {f.uri for f in iceberg.SOURCE.open().list(tables.uri("iceberg"), context)}

    for mode, force in (("append", False), ("replace-partitions", True)):
        with pytest.raises(SourceError, match=r"2 data file\(s\) loaded earlier .* no longer "
                           r"in snapshot \d+ \(.*operation: delete\).* --mode replace-table"):
            listed(mode, force)
    now = listed("replace-table", True)
    assert len(now) == 1 and not now & set(loaded)
    assert listed("append", True) == now


def test_no_table_there_and_no_delta_library_are_one_line_each(tmp_path, monkeypatch) -> None:
    from chload.errors import NothingMatched
    from chload.sources.base import SourceContext
    from chload.sources.lake import delta, iceberg

    with pytest.raises(NothingMatched, match=r"no Iceberg table there \(No such file"):
        iceberg.SOURCE.open().list(f"iceberg+file://{tmp_path}/none", SourceContext())
    (tmp_path / "t" / "metadata").mkdir(parents=True)
    with pytest.raises(NothingMatched, match=r"no metadata/\*\.metadata\.json"):
        iceberg.SOURCE.open().list(f"iceberg+file://{tmp_path}/t", SourceContext())
    with pytest.raises(NothingMatched, match="no Delta table there"):
        delta.SOURCE.open().list(f"delta+file://{tmp_path}/t", SourceContext())
    monkeypatch.setitem(sys.modules, "deltalake", None)
    with pytest.raises(UsageError, match=r"needs the Python package deltalake: pip install "
                                         r"'chload\[delta\]'"):
        delta.SOURCE.open().list(f"delta+file://{tmp_path}/t", SourceContext())


def test_delta_partition_values_come_from_the_log_typed_and_every_read_adds_them(
        tmp_path) -> None:
    import datetime
    import decimal

    pa = pytest.importorskip("pyarrow")
    deltalake = pytest.importorskip("deltalake")
    from chload.sources.base import SourceContext
    from chload.sources.lake import delta

    at = datetime.datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=datetime.UTC)
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "r": pa.array(["E'U", None]),
                     "d": pa.array([datetime.date(2024, 1, 2), None]),
                     "b": pa.array([True, None]), "t": pa.array([at, None]),
                     "m": pa.array([decimal.Decimal("4.50"), None], pa.decimal128(10, 2))})
    deltalake.write_deltalake(str(tmp_path), data, partition_by=["r", "d", "b", "t", "m"])
    snap = delta.read(parse(f"delta+file://{tmp_path}", "delta", "version"), SourceContext())
    assert not snap.unreadable
    by_id = {f.constants[0][2]: f for f in snap.files}
    assert by_id["'E\\'U'"].constants == (
        ("r", "Nullable(String)", "'E\\'U'"), ("d", "Nullable(Date32)", "'2024-01-02'"),
        ("b", "Nullable(Bool)", "'true'"),
        ("t", "Nullable(DateTime64(6, 'UTC'))", "'2024-01-02 03:04:05.600000'"),
        ("m", "Nullable(Decimal(10, 2))", "'4.50'"))
    assert [v for _, _, v in by_id["NULL"].constants] == ["NULL"] * 5
    files = list(units(parse(f"delta+file://{tmp_path}", "delta", "version"), snap, None))
    one = registry.table_function(files[0], "Parquet", "id Int64, r Nullable(String)")
    assert one.startswith("(SELECT * EXCEPT (`r`, `d`, `b`, `t`, `m`), _path, _file, CAST(")
    assert "'`id` Int64'" in one and "AS `r`" in one  # the file is read without them
    many = registry.table_function_many(files, "Parquet", None)
    assert many is not None and many[0].count("multiIf(") == 5 and "_path" not in many[0][:60]
