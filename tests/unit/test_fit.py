"""fit.py: values a column cannot hold, found in a file's start (no engine)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from chload.core.reading import fit
from chload.formats import FileFormat
from chload.schema import Column
from chload.sources.base import SourceFile


def _file(path: Path, data: str, fmt: str = "CSVWithNames") -> SourceFile:
    compression = "gzip" if path.suffix == ".gz" else "none"
    raw = data.encode()
    path.write_bytes(gzip.compress(raw) if compression == "gzip" else raw)
    return SourceFile(str(path), path.stat().st_size, 0, FileFormat(fmt, compression),
                      local_path=str(path))


def _check(tmp_path: Path, data: str, types: str, fmt: str = "CSVWithNames",
           settings: dict | None = None, name: str = "f.csv") -> str:
    columns = [Column(*c.split(" ", 1)) for c in re.split(r",\s*(?=\w+ )", types)]
    found = fit.check(_file(tmp_path / name, data, fmt), columns,
                      [c.name for c in columns], settings or {}, "db.t")
    return found.message() if found else ""


@pytest.mark.parametrize("data, types, says", [
    ("id,v\n1,5\n2,\n", "id Int64, v Int64", "line 3, column v: an empty value in a column "
     "that is not Nullable (Int64)"),
    ("id,v\n1,\\N\n", "id Int64, v Int64", "line 2, column v: NULL in a column"),
    ('id,v\n1,""\n', "id Int64, v Date", "an empty value in a column that is not Nullable"),
    ("id,v\n1,300\n", "id Int64, v UInt8", "'300' is outside UInt8 (0 to 255)"),
    ("id,v\n1,-129\n", "id Int64, v Int8", "'-129' is outside Int8 (-128 to 127)"),
    ("id,v\n1,9999999999999999999\n", "id Int64, v Int64", "is outside Int64"),
    ("id,v\n1,4294967296\n", "id Int64, v UInt32", "e.g. UInt64"),
    ("id,d\n1,1960-01-01\n", "id Int64, d Date", "'1960-01-01' is outside the dates Date "
     "holds (1970-01-01 to 2149-06-06)"),
    ("id,d\n1,2200-01-01 00:00:00\n", "id Int64, d DateTime('UTC')",
     "outside the dates DateTime holds"),
    ("id,f\n1,1e39\n", "id Int64, f Float32", "'1e39' is beyond Float32's range"),
    ("id,m\n1,1.50\n2,1.239\n", "id Int64, m Decimal(10, 2)", "line 3, column m: '1.239' has "
     "more decimal places than Decimal(10, 2) keeps (2)"),
    ("id,m\n1,1.239\n", "id Int64, m Decimal64(2)", "more decimal places"),
])
def test_a_value_the_column_cannot_hold_is_named(tmp_path: Path, data: str, types: str,
                                                  says: str) -> None:
    assert says in _check(tmp_path, data, types)


@pytest.mark.parametrize("data, types", [
    ("id,v\n1,5\n2,7\n", "id Int64, v Int64"),
    ("id,v\n1,\n2,\\N\n", "id Int64, v Nullable(Int64)"),
    ("id,v\n1,\n", "id Int64, v LowCardinality(Nullable(String))"),
    ("id,s\n1,\n", "id Int64, s String"),  # an empty string is a value
    ("id,v\n1,255\n2,0\n", "id Int64, v UInt8"),
    ("id,v\n1,-9223372036854775808\n", "id Int64, v Int64"),
    ("id,d\n1,1970-01-01\n2,2149-06-06\n3,0000-00-00\n", "id Int64, d Date"),
    ("id,d\n1,1960-01-01 10:00:00\n", "id Int64, d DateTime64(3)"),
    ("id,d\n1,1899-12-31\n2,2120-01-01\n", "id Int64, d Date32"),
    ("id,d\n1,2120-01-01\n", "id Int64, d Date"),  # chDB's Date holds it
    ("id,d\n1,1700000000\n", "id Int64, d DateTime"),  # seconds since 1970
    ("id,f\n1,3.4e38\n2,inf\n3,1e300\n", "id Int64, f Float64"),
    ("id,m\n1,1.2300\n2,5\n", "id Int64, m Decimal(10, 2)"),
    ("id,v\n1,x\n", "id Int64, v UInt8"),  # not a number: the engine says so
    ("id,other\n1,300\n", "id Int64, v UInt8"),  # a column the table lacks: the header check
])
def test_values_that_fit_pass(tmp_path: Path, data: str, types: str) -> None:
    assert _check(tmp_path, data, types) == ""


def test_nulls_pass_when_defaults_are_asked_for(tmp_path: Path) -> None:
    data = "id,v\n1,\n2,\\N\n"
    assert _check(tmp_path, data, "id Int64, v Int64",
                  settings={"input_format_null_as_default": "1"}) == ""
    assert "NULL" in _check(tmp_path, data, "id Int64, v Int64",
                            settings={"input_format_csv_empty_as_default": "1"})


def test_an_empty_field_of_a_column_with_a_default_is_that_default(tmp_path: Path) -> None:
    found = fit.check(_file(tmp_path / "f.csv", "id,v\n1,\n"),
                      [Column("id", "Int64"), Column("v", "Int64", "DEFAULT")], ["id", "v"],
                      {}, "db.t")
    assert found is None


def test_tsv_json_gzip_and_other_delimiters(tmp_path: Path) -> None:
    assert "line 3, column v: NULL" in _check(tmp_path, "id\tv\n1\t2\n2\t\\N\n",
                                              "id Int64, v String", "TSVWithNames", name="f.tsv")
    assert "line 1, column v: NULL" in _check(
        tmp_path, '{"id":1,"v":null}\n', "id Int64, v Int64", "JSONEachRow", name="f.jsonl")
    assert "'300' is outside UInt8" in _check(
        tmp_path, '\n{"id":1,"v":300}\n', "id Int64, v UInt8", "JSONEachRow", name="f.jsonl")
    assert "line 2, column v: NULL" in _check(tmp_path, '{"id":1}\n{"id":2,"v":null}\n',
                                              "id Int64, v Int64", "JSONEachRow", name="f.jsonl")
    assert _check(tmp_path, '{"id":1}\n', "id Int64, v Int64", "JSONEachRow",
                  name="f.jsonl") == ""  # a missing key is the column's default, as meant
    assert "'1960-01-01'" in _check(tmp_path, "id,d\n1,1960-01-01\n", "id Int64, d Date",
                                    name="f.csv.gz")
    csv_semicolon = FileFormat("CSVWithNames", "none", ";")
    path = tmp_path / "s.csv"
    path.write_text("id;v\n1;\n")
    found = fit.check(SourceFile(str(path), 1, 0, csv_semicolon, local_path=str(path)),
                      [Column("id", "Int64"), Column("v", "Int64")], ["id", "v"], {}, "db.t")
    assert found and found.column == "v"


def test_a_quoted_line_end_counts_in_the_line_named(tmp_path: Path) -> None:
    says = _check(tmp_path, 'id,note,v\n1,"two\nlines",5\n2,x,300\n',
                  "id Int64, note String, v UInt8")
    assert says.startswith("line 4, column v: '300'"), says


def test_without_a_header_the_runs_columns_name_the_fields(tmp_path: Path) -> None:
    assert "column v: '300'" in _check(tmp_path, "1,300\n", "id Int64, v UInt8", "CSV")


def test_only_the_start_is_read(tmp_path: Path) -> None:
    rows = "".join(f"{i},1\n" for i in range(fit.SAMPLE // 4))
    assert _check(tmp_path, "id,v\n" + rows + "9,300\n", "id Int64, v UInt8") == ""


@pytest.mark.parametrize("message, says", [
    ("Code: 349. DB::Exception: Cannot convert NULL value to non-Nullable type for column v: "
     "read stage: ColumnData: column: v: (in file/uri /x.parquet)",
     "column v: NULL in a column that is not Nullable;"),
    ("Code: 349. DB::Exception: Cannot convert NULL value to non-Nullable type: while "
     "converting column `v` from type Nullable(Int64) to type Int64: (in file/uri /x.orc)",
     "column v: NULL in a column that is not Nullable (Int64);"),
    ("Code: 36. DB::Exception: Cannot insert Avro Union(Null, long) into non-nullable type "
     "Int64. To use default value on NULL, enable setting input_format_null_as_default",
     ": NULL in a column that is not Nullable (Int64);"),
    ('Code: 117. DB::Exception: Expected end of line: (at row 2)\n: \nRow 2:\nColumn 0,   '
     'name: id, type: Int64, parsed text: "2"\nColumn 1,   name: v,  type: Int64, ERROR: text '
     '"<BACKSLASH>N<LINE FEED>" is not like Int64\n\n: (in file/uri /x.csv)',
     "column v: NULL in a column that is not Nullable (Int64) (at row 2);"),
])
def test_an_engine_refusing_a_null_is_said_with_the_way_on(message: str, says: str) -> None:
    from chload.errors import DataError, from_engine_message
    error = from_engine_message(message, "f")
    assert isinstance(error, DataError) and says in str(error), str(error)
    assert "input_format_null_as_default=1" in str(error)


def test_a_server_as_old_as_18_16_holds_dates_to_2105(tmp_path: Path) -> None:
    found = fit.check(_file(tmp_path / "f.csv", "id,d\n1,2120-01-01\n"),
                      [Column("id", "Int64"), Column("d", "Date")], ["id", "d"], {}, "db.t",
                      "18.16.1")
    assert found and "(1970-01-01 to 2105-12-31)" in found.message()
    assert "no date type of this target holds it" in found.message()


@pytest.mark.parametrize("suffix, pack", [
    (".csv.gz", gzip.compress), (".csv.bz2", bz2.compress), (".csv.xz", lzma.compress),
    (".csv.deflate", zlib.compress)])
def test_every_compression_the_standard_library_reads(tmp_path: Path, suffix: str,
                                                       pack: Callable[[bytes], bytes]) -> None:
    path = tmp_path / f"f{suffix}"
    path.write_bytes(pack(b"id,v\n1,300\n"))
    compression = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".deflate": "deflate"}[path.suffix]
    found = fit.check(SourceFile(str(path), 1, 0, FileFormat("CSVWithNames", compression),
                                 local_path=str(path)),
                      [Column("id", "Int64"), Column("v", "UInt8")], ["id", "v"], {}, "db.t")
    assert found and found.value == "'300'"


def test_typed_files_read_narrow_integers_wide_and_insert_them_checked() -> None:
    read = fit.widened([Column("a", "UInt8"), Column("b", "Nullable(Int32)"),
                        Column("c", "Int64"), Column("d", "Float32"), Column("e", "String"),
                        Column("f", "UInt16")], {"a", "b", "c", "d", "e"})
    assert [c.type for c in read] == ["Int64", "Nullable(Int64)", "Int64", "Float32", "String",
                                      "UInt16"]
    assert fit.insert_expr("`a`", "Int64", "UInt8") == "accurateCast(`a`, 'UInt8') AS `a`"
    assert fit.insert_expr("`b`", "Nullable(Int64)", "Nullable(Int32)") == \
        "accurateCast(`b`, 'Nullable(Int32)') AS `b`"
    assert fit.insert_expr("`c`", "Int64", "Int64") is None
    assert fit.insert_expr("`x`", "DateTime64(3)", "DateTime") is None  # another cast's


def test_a_number_too_wide_is_said_with_its_column() -> None:
    from chload.errors import DataError, from_engine_message
    error = from_engine_message(
        "Code: 70. DB::Exception: Value in column Int64 cannot be safely converted into type "
        "UInt8: while executing 'FUNCTION accurateCast(__table1.v :: 2, 'UInt8'_String :: 1) "
        "-> accurateCast(__table1.v, 'UInt8') UInt8 : 3'. (CANNOT_CONVERT_TYPE)", "w.parquet")
    assert isinstance(error, DataError)
    assert "w.parquet: column v: a value does not fit UInt8 (read as Int64)" in str(error)


def test_an_error_in_a_column_read_wider_names_the_tables_type() -> None:
    """A narrow integer column is read as Int64 (planner.prepare_table); the engine's
    parse error then says Int64, and the user's column is UInt8."""
    read = [Column("id", "UInt64"), Column("v", "Int64"), Column("n", "Nullable(Int64)")]
    table = [Column("id", "UInt64"), Column("v", "UInt8"), Column("n", "Nullable(UInt16)")]
    said = "a.csv: line 6, column v: 'true' is not Int64"
    assert fit.in_table_types(said, "v", read, table) == \
        "a.csv: line 6, column v: 'true' is not UInt8"
    assert fit.in_table_types("column n: 'x' is not Int64", "n", read, table) == \
        "column n: 'x' is not UInt16"
    assert fit.in_table_types("column id: 'x' is not UInt64", "id", read, table) == \
        "column id: 'x' is not UInt64"  # read as it is held: unchanged
    assert fit.in_table_types(said, None, read, table) == said


def test_a_number_too_wide_is_said_with_its_whole_quoted_column_name() -> None:
    from chload.errors import from_engine_message
    error = from_engine_message(
        "Code: 70. DB::Exception: Value in column Int64 cannot be safely converted into type "
        "UInt8: while executing 'FUNCTION accurateCast(__table1.`my col` :: 2, 'UInt8'_String "
        ":: 1) -> accurateCast(__table1.`my col`, 'UInt8'_String) UInt8 : 0'. "
        "(CANNOT_CONVERT_TYPE)", "a b.csv")
    assert "a b.csv: column my col: a value does not fit UInt8" in str(error)
