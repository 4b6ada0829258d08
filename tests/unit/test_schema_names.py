"""Column names with spaces and punctuation, header lines, reserved databases: the
pure functions behind them (no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chload.core.plan import parse_table
from chload.core.reading.sniff import guess_delimiter, header_names, looks_like_names, split_line
from chload.errors import SchemaError, UsageError
from chload.formats import FileFormat, detect
from chload.schema import Column, create_table_sql, header_columns, parse_structure
from chload.sources.base import SourceFile
from chload.targets.server.capabilities import Capabilities, server_columns


def test_schema_takes_quoted_names() -> None:
    columns = parse_structure('`Order ID` UInt32, "a, b" Nullable(String), `x(y)` '
                              "Map(String, UInt8), `q\\`t` String, plain Int8")
    assert [c.name for c in columns] == ["Order ID", "a, b", "x(y)", "q`t", "plain"]
    assert [c.type for c in columns] == ["UInt32", "Nullable(String)", "Map(String, UInt8)",
                                         "String", "Int8"]
    sql = create_table_sql("`db`.`t`", columns, None, None)
    assert parse_structure(sql[sql.index("(") + 1:sql.rindex(")")]) == columns
    with pytest.raises(UsageError, match="backquotes"):
        parse_structure("`Order ID`")


OLD = Capabilities("18.16.1", types=frozenset({"Int64", "String", "Nullable", "UInt8",
                                               "LowCardinality"}),
                   settings=frozenset({"allow_experimental_low_cardinality_type"}))


def test_server_ddl_with_quoted_names() -> None:
    columns = [Column("LowCardinality(a)", "LowCardinality(String)"), Column("x(", "Int64"),
               Column("b, c", "DateTime64(3)")]
    sql = create_table_sql("`default`.`t`", server_columns(columns[:2], OLD, "table t"),
                           None, None)
    assert "`LowCardinality(a)` String" in sql
    with pytest.raises(SchemaError, match="column b, c has type DateTime64"):
        server_columns(columns, OLD, "table t")


def test_header_columns_name_the_empty_and_the_repeated() -> None:
    assert header_columns(["a", "b", ""]) == ["a", "b", "c3"]
    assert header_columns(["a", "a", "b"]) == ["a", "a_2", "b"]
    assert header_columns(["", "c1"]) == ["c1_1", "c1"]


def test_first_lines_split_and_judged(tmp_path: Path) -> None:
    csv, named = FileFormat("CSV", "none"), FileFormat("CSVWithNames", "none")
    assert split_line("\ufeffcity,country\r\n", csv) == ["city", "country"]
    assert split_line('"Order ID", "a,b"\n', named) == ["Order ID", "a,b"]
    assert split_line("a\\tb\tc\\\\d\n", FileFormat("TSV", "none")) == ["a\tb", "c\\d"]
    assert split_line('a; "b;c"\n', FileFormat("CSV", "none", ";")) == ["a", "b;c"]
    path = tmp_path / "h.csv"
    path.write_bytes(b"\xef\xbb\xbfx,y")  # a file of just a header, no line end
    assert header_names(SourceFile(str(path), 1, 1, detect(path.name),
                                   local_path=str(path))) == ["x", "y"]
    assert looks_like_names(["city", "country"]) and looks_like_names(["a", "b", ""])
    for values in (["1", "x"], ["2024-01-31", "a"], ["true", "a"], ["a", ""], ["a", "a"],
                   ["", "", "b"], ["NULL", "a"], ["1.5e3", "b"]):
        assert not looks_like_names(values), values


@pytest.mark.parametrize("line,delimiter", [
    ("a;b;c\n", ";"), ("\ufeffa|b\r\n", "|"), ("a\tb\n", "\t"), ('"x;y"|z\n', "|"),
    ("a,b;c\n", None),  # `,` splits it: CSV as written
    ("abc\n", None), ('"a;b"\n', None), ("\n", None),  # one column, quoted or not
])
def test_a_first_line_shows_another_delimiter(line: str, delimiter: str | None) -> None:
    assert guess_delimiter(line) == delimiter


@pytest.mark.parametrize("value,default", [
    ("system.t", "default"), ("INFORMATION_SCHEMA.t", "default"),
    ("information_schema.t", "default"), ("chload.stage_1", "default"),
    ("t", "system"), ("t", "chload"),
])
def test_reserved_databases_are_refused(value: str, default: str) -> None:
    with pytest.raises(UsageError, match="load into a database of your own"):
        parse_table(value, default)
    assert parse_table("chloader.t").database == "chloader"
