"""Which database columns get a range check, against which bounds (core/reading/ranges.py), and
what the MariaDB C reader is told to check (mysql_native.checks_of)."""

from __future__ import annotations

from chload.core.reading import ranges as db_range
from chload.sources.databases.mysql_native import checks_of as _checks


def test_each_target_type_has_the_range_its_engine_parses() -> None:
    assert db_range.bounds("Nullable(DateTime('UTC'))", "18.16.1") == (
        "1970-01-01 00:00:00", "2105-12-31 23:59:59")
    assert db_range.bounds("DateTime", db_range.CHDB) == (
        "1970-01-01 00:00:00", "2106-02-07 06:28:15")
    assert db_range.bounds("Date", db_range.CHDB)[1].startswith("2149-06-06")
    assert db_range.bounds("DateTime64(9, 'UTC')", db_range.CHDB) == (
        "1677-09-21 00:12:44", "2262-04-11 23:47:16")
    assert db_range.bounds("DateTime64(3)", "23.8.1")[0].startswith("1900-01-01")  # unknown
    assert db_range.bounds("String", "18.16.1") is None
    assert db_range.bounds("Decimal(10, 2)", db_range.CHDB) is None


def test_only_columns_whose_target_type_is_narrower_are_checked() -> None:
    columns = [("id", ""), ("pg", "any"), ("my", "4digit"), ("day", "4digit")]
    read = ["Int32", "DateTime64(6, 'UTC')", "DateTime64(0, 'UTC')", "Date32"]
    found = db_range.guards(columns, read, {}, db_range.CHDB, False)
    # Date32 holds 0000 to 9999 on chDB: every MariaDB date; DateTime64 not year 0000
    assert sorted(found) == [1, 2]
    assert found[2].lo == "0001-01-01 00:00:00" and found[2].wider == "String"
    stored = {"pg": "Nullable(DateTime('UTC'))", "day": "Date"}
    on_server = db_range.guards(columns, read, stored, "18.16.1", True)
    assert sorted(on_server) == [1, 2, 3]
    assert on_server[1].hi == "2105-12-31 23:59:59" and on_server[1].rejects
    assert on_server[1].type == "DateTime('UTC')" and on_server[1].where.endswith("18.16.1")


def test_a_refusal_suggests_the_wider_type_on_chdb() -> None:
    [guard] = db_range.guards([("t", "any")], ["DateTime"], {}, db_range.CHDB,
                              False).values()
    assert guard.wider == "DateTime64(0, 'UTC')"
    line = str(db_range.message("pg://h/db/s.t", guard, "1960-01-01 00:00:00", "'t x'"))
    assert "column t holds '1960-01-01 00:00:00', which DateTime cannot hold on chDB (it " \
           "holds 1970-01-01 00:00:00 to 2106-02-07 06:28:15)" in line


def test_the_c_reader_is_told_each_fields_checks() -> None:
    [guard] = db_range.guards([("t", "4digit")], ["DateTime"], {}, "18.16.1", False).values()
    assert _checks("", {}, 2) == ""
    assert _checks("01", {}, 2) == "F0\t\n1\t\n"
    spec = _checks("", {1: guard}, 2)
    assert spec == "F0\t\n01970-01-01 00:00:00\t2105-12-31 23:59:59\n"


def test_a_value_no_date_type_holds_is_suggested_string() -> None:
    from chload.sources.databases.table import DbColumn, DbUrl, RangeChecks

    found = db_range.guards([("t", "any")], ["DateTime"], {}, db_range.CHDB, False)
    checks = RangeChecks(DbUrl("postgresql", "u", "h", 1, "d", "s", "t"),
                         [DbColumn("t", "DateTime", '"t"')], found)
    assert "--schema 't String'" in str(checks.refusal(0, "infinity"))
    assert "--schema 't String'" in str(checks.refusal(0, "0044-03-15 BC"))
    assert "DateTime64(0, 'UTC')\"" in str(checks.refusal(0, "1960-01-01 00:00:00"))


def test_a_suggested_schema_is_in_the_types_the_target_has() -> None:
    """databases/base.py `storable`: the --schema a refusal suggests for 18.16."""
    from chload.sources.databases.base import storable

    old = {"UInt8", "Int32", "DateTime", "Date", "Nullable", "Array", "String", "UUID",
           "Decimal"}.__contains__
    assert storable("Nullable(Bool)", old) == "Nullable(UInt8)"
    assert storable("Array(Nullable(Bool))", old) == "Array(Nullable(UInt8))"
    assert storable("DateTime64(0, 'UTC')", old) == "DateTime('UTC')"
    assert storable("Nullable(DateTime64(6, 'UTC'))", old) == "Nullable(String)"
    assert storable("Date32", old) == "String"
    assert storable("Decimal(50, 2)", old) == "String"
    assert storable("Array(Nullable(UUID))", old) == "Array(Nullable(UUID))"
    assert storable("Nullable(DateTime64(6, 'UTC'))", None) == "Nullable(DateTime64(6, 'UTC'))"


def test_values_of_several_columns_are_one_line_with_one_schema() -> None:
    from chload.sources.databases.table import DbColumn, DbUrl, RangeChecks

    columns = [DbColumn("id", "Int32", ""), DbColumn("d", "Nullable(Date32)", ""),
               DbColumn("t", "DateTime('UTC')", "")]
    found = db_range.guards([("id", ""), ("d", "any"), ("t", "any")],
                            ["Int32", "Date32", "DateTime('UTC')"], {}, "18.16.1", False)
    url = DbUrl("postgresql", "u", "h", 5432, "db", "public", "t")
    line = str(RangeChecks(url, columns, found).refusals({1: "infinity",
                                                          2: "1960-01-01 00:00:00"}))
    assert line.startswith("postgresql://h:5432/db/public.t: column d holds 'infinity'")
    assert "column t holds '1960-01-01 00:00:00', which DateTime('UTC') cannot hold" in line, line
    assert "pass --schema with d as String, t as String to load them, e.g. --schema " \
           "'id Int32, d Nullable(String), t String'" in line, line
