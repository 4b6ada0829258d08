"""Values a column cannot hold (fit.py), on both targets: the file that holds one fails
alone before any of its rows load, the others load, nothing is changed without a word.
Before, each of these loaded and stored another value (NULL -> 0, 300 -> 44,
1960-01-01 -> 1970-01-01 or 0000-00-00)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_chload
from test_small_contracts import load, sql, target  # noqa: F401 (target: a fixture)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("table, schema, bad, says", [
    ("fit_nulls", "id Int64, v Int64", "3,\n", "line 2, column v: an empty value in a column "
     "that is not Nullable (Int64)"),
    ("fit_wrap", "id Int64, v UInt8", "3,300\n", "line 2, column v: '300' is outside UInt8"),
    ("fit_dates", "id Int64, v Date", "3,1960-01-01\n", "line 2, column v: '1960-01-01' is "
     "outside the dates Date holds"),
])
def test_a_file_with_a_value_its_column_cannot_hold_fails_alone(
        tmp_path: Path, target: tuple[str, dict], table: str,  # noqa: F811
        schema: str, bad: str, says: str) -> None:
    good_value = "2024-05-01" if "Date" in schema else "7"
    (tmp_path / "a_good.csv").write_text(f"id,v\n1,{good_value}\n2,{good_value}\n")
    (tmp_path / "b_bad.csv").write_text("id,v\n" + bad)
    code, report, err = load(target, str(tmp_path / "a_good.csv"), str(tmp_path / "b_bad.csv"),
                             "--table", table, "--schema", schema)
    assert code == 1, err
    failed = {f["uri"].rsplit("/", 1)[-1]: f for f in report["files"]}
    assert failed["b_bad.csv"]["status"] == "failed"
    assert says in failed["b_bad.csv"]["error"], failed["b_bad.csv"]
    assert "ALTER TABLE default." + table in failed["b_bad.csv"]["error"]
    assert sql(target, f"SELECT count(), countIf(id = 3) FROM {table}") == "2\t0"


@pytest.mark.parametrize("table, schema, told, query, stored", [
    ("fit_defaults", "id Int64, v Int64", ("--setting", "input_format_null_as_default=1"),
     "v", "0\n5"),  # asked for: the type's default
    ("fit_nullable", "id Int64, v Nullable(Int64)", (), "isNull(v)", "1\n0"),  # 18.16: pushed
])
def test_an_empty_field_loads_as_asked_or_as_null(
        tmp_path: Path, target: tuple[str, dict], table: str, schema: str,  # noqa: F811
        told: tuple[str, ...], query: str, stored: str) -> None:
    data = tmp_path / "nulls.csv"
    data.write_text("id,v\n1,\n2,5\n")
    code, _, err = load(target, str(data), "--table", table, "--schema", schema, *told)
    assert code == 0, err
    assert sql(target, f"SELECT {query} FROM {table} ORDER BY id") == stored


def test_a_parquet_null_into_a_column_not_nullable_is_refused(
        tmp_path: Path, target: tuple[str, dict]) -> None:  # noqa: F811
    """Parquet/ORC/Arrow/Avro/Native NULLs were stored as 0 (input_format_null_as_default);
    the engine now refuses them (engine.py), exactly, in every row."""
    import chdb  # (the engine chload uses: writes the file)
    path = tmp_path / "n.parquet"
    chdb.query("SELECT number AS id, if(number = 70000, NULL, toInt64(number)) AS v "
               f"FROM numbers(100000) INTO OUTFILE '{path}' FORMAT Parquet")
    code, report, err = load(target, str(path), "--table", "fit_parquet", "--schema",
                             "id UInt64, v Int64")
    assert code == 1 and "column v: NULL in a column that is not Nullable" in \
        report["files"][0]["error"], (err, report)
    assert "--setting input_format_null_as_default=1" in report["files"][0]["error"]
    code, _, err = load(target, str(path), "--table", "fit_parquet", "--setting",
                        "input_format_null_as_default=1")
    assert code == 0, err
    assert sql(target, "SELECT count(), countIf(v = 0) FROM fit_parquet") == "100000\t2"


def test_a_typed_files_number_too_wide_for_its_column_is_refused(
        tmp_path: Path, target: tuple[str, dict]) -> None:  # noqa: F811
    """A Parquet Int64 of 300 into a UInt8 column was stored as 44 (the reader casts);
    it is read as Int64 and inserted through accurateCast now (fit.widened)."""
    import chdb
    path = tmp_path / "w.parquet"
    chdb.query("SELECT number AS id, toInt64(if(number = 50000, 300, number % 200)) AS v "
               f"FROM numbers(100000) INTO OUTFILE '{path}' FORMAT Parquet")
    code, report, err = load(target, str(path), "--table", "fit_wide", "--schema",
                             "id UInt64, v UInt8")
    assert code == 1 and "column v: a value does not fit UInt8 (read as Int64)" in \
        report["files"][0]["error"], (err, report)
    assert sql(target, "SELECT count() FROM fit_wide") == "0"
    code, _, err = load(target, str(path), "--table", "fit_wider", "--schema",
                        "id UInt64, v Nullable(UInt16)")
    assert code == 0, err
    assert sql(target, "SELECT max(v), sum(v) FROM fit_wider") == \
        sql(target, "SELECT 300, sum(if(number = 50000, 300, number % 200)) "
                    "FROM numbers(100000)")


def test_a_number_past_the_sampled_start_is_refused_where_chdb_reads_the_file(
        tmp_path: Path, target: tuple[str, dict]) -> None:  # noqa: F811
    """fit.py samples a text file's first 16 KB; a number past it that its column cannot
    hold was stored wrapped (300 -> 44). Where the loader's engine reads the file (the
    embedded target; pushed into a server) it is read as Int64 and inserted through
    accurateCast now: the file fails, nothing of it loads. A file that fits loads whole."""
    rows = "".join(f"{i},{i % 200}\n" for i in range(1, 20_001))  # ~170 KB
    late = tmp_path / "late.csv"
    late.write_text("id,v\n" + rows + "20001,300\n")
    fine = tmp_path / "fine.csv"
    fine.write_text("id,v\n" + rows)
    where, env = target
    if where.startswith("http"):
        where += "?path=push"  # (18.16 parsing the file itself still wraps it: sample only)
    code, report, err = load((where, env), str(late), "--table", "fit_late", "--schema",
                             "id UInt64, v UInt8")
    assert code == 1 and "column v: a value does not fit UInt8" in \
        report["files"][0]["error"], (err, report)
    assert sql(target, "SELECT count() FROM fit_late") == "0"
    out = run_chload("validate", str(late), "--table", "fit_late", "--target", where,
                     "--json", env=env)  # says so too (the table exists: its types)
    [check] = json.loads(out.stdout)
    assert "column v: a value does not fit UInt8" in check["failure"], (out.stderr, check)
    code, _, err = load((where, env), str(fine), "--table", "fit_late", "--schema",
                        "id UInt64, v UInt8")
    assert code == 0, err
    assert sql(target, "SELECT count(), sum(v), toTypeName(any(v)) FROM fit_late") == \
        f"20000\t{sum(i % 200 for i in range(1, 20_001))}\tUInt8"


def test_a_word_in_a_narrow_integer_column_is_named_by_the_columns_type(
        tmp_path: Path, target: tuple[str, dict]) -> None:  # noqa: F811
    """The column is read as Int64 (above); the failure names its own type, UInt8."""
    path = tmp_path / "word.csv"
    path.write_text("id,v\n1,7\n2,true\n")
    where, env = target
    if where.startswith("http"):
        where += "?path=push"
    code, report, err = load((where, env), str(path), "--table", "fit_word", "--schema",
                             "id UInt64, v UInt8")
    assert code == 1 and "column v: 'true' is not UInt8" in report["files"][0]["error"], \
        (err, report)


def test_among_many_files_each_refused_alone_with_its_own_reason(
        tmp_path: Path, target: tuple[str, dict]) -> None:  # noqa: F811
    """The header check judges a first line once for the files that share it and searches
    the files' starts 512 at a time (fit.check_many): a misfit at either edge of such a
    batch still fails its file alone, as do a header the table lacks, UTF-16 text and a
    delimiter hint among files of the same first line."""
    bad = {0: "7,300\n", 511: "7,\\N\n", 512: "7,256\n", 599: "7,\n"}
    for n in range(600):
        (tmp_path / f"f{n:03d}.csv").write_text(f"id,v\n{n},5\n" if n not in bad else
                                                f"id,v\n{n},5\n" + bad[n])
    (tmp_path / "f100.csv").write_text("id,w\n100,5\n")  # a header the table lacks
    (tmp_path / "f200.csv").write_bytes("id,v\n200,5\n".encode("utf-16"))
    (tmp_path / "f300.csv").write_text("sep=,\nid,v\n300,5\n")
    code, report, err = load(target, str(tmp_path / "*.csv"), "--table", "fit_many",
                             "--schema", "id Int64, v UInt8")
    assert code == 1, err
    failed = {int(f["uri"][-7:-4]): f["error"] for f in report["files"]
              if f["status"] == "failed"}
    assert sorted(failed) == [0, 100, 200, 300, 511, 512, 599], failed
    assert "line 3, column v: '300' is outside UInt8" in failed[0]
    assert "line 3, column v: NULL in a column that is not Nullable" in failed[511]
    assert "line 3, column v: '256' is outside UInt8" in failed[512]
    assert "line 3, column v: an empty value" in failed[599]
    assert "its header does not fit table default.fit_many" in failed[100]
    assert "UTF-16" in failed[200] and "delimiter hint" in failed[300]
    assert sql(target, "SELECT count(), countIf(id IN (0, 100, 200, 300, 511, 512, 599)) "
                       "FROM fit_many") == "593\t0"
