"""The followed table's shape and a change stream's positions (sources/changes/), and the
SQL of a unit's changes: pure functions, no database."""

from __future__ import annotations

import pytest

from chload.errors import UsageError
from chload.schema import Column
from chload.sources.changes import table
from chload.sources.changes.postgres.slot import lsn_int, lsn_text, slot_name
from chload.sources.changes.postgres.sql import SourceColumn, changes_query, options, stopped


def test_the_change_columns_follow_the_source_columns_with_defaults() -> None:
    cols = table.change_columns([Column("id", "Int64"), Column("v", "String")])
    assert [c.name for c in cols] == ["id", "v", "_version", "_is_deleted"]
    assert cols[2].default_kind == "DEFAULT" and cols[3].type.startswith("UInt8")


@pytest.mark.parametrize("engine, takes", [("chdb", True), ("18.16.1", False),
                                           ("23.1.3", False), ("23.2.1", True),
                                           ("24.8", True), ("", False)])
def test_is_deleted_is_an_engine_argument_from_23_2(engine: str, takes: bool) -> None:
    assert table.takes_is_deleted(engine) is takes


def test_a_table_without_a_key_is_refused_unless_a_key_is_given() -> None:
    with pytest.raises(UsageError, match="--follow needs a primary key"):
        table.key_of([], None, "postgresql://h:5432/db/public.t")
    assert table.key_of([], "a, b", "x") == ("a", "b")
    assert table.key_of(["id"], None, "x") == ("id",)


def test_a_unit_names_its_range_and_its_end_is_read_back() -> None:
    uri = table.unit_uri("pgchanges://u@h:5432/db/public.t/s", 100, 250)
    assert uri.endswith("/100-249")
    assert table.unit_end(uri) == 250


def test_lsns_round_trip_as_integers() -> None:
    assert lsn_int("0/1925AC8") == 0x1925AC8
    assert lsn_int("1/0") == 1 << 32
    assert lsn_text(lsn_int("16/B374D848")) == "16/B374D848"


def test_a_slot_is_named_per_target_and_table() -> None:
    a = slot_name("/data/t", "default.orders", "postgresql://u@h:5432/db/public.orders")
    b = slot_name("/data/u", "default.orders", "postgresql://u@h:5432/db/public.orders")
    assert a != b and a.startswith("chload_") and len(a) <= 63 and a == a.lower()


def test_wal2json_reads_only_the_table_its_name_escaped() -> None:
    assert "E'public.orders'" in options("public", "orders")
    assert "E'my\\\\ schema.a\\\\.b'" in options("my schema", "a.b")


def test_a_unit_parses_each_change_once_and_stops_on_truncate() -> None:
    sql = changes_query("s", "0/10", ("public", "t"), "pg/public.t",
                        [SourceColumn("id", "integer", '"id"'),
                         SourceColumn("raw", "bytea", '"raw"')], ["id"])
    assert sql.startswith("COPY (") and sql.endswith("TO STDOUT")
    assert sql.count("pg_logical_slot_peek_changes") == 1 and "OFFSET 0" in sql
    assert "decode(" in sql  # bytea: wal2json prints bare hex
    assert "was truncated at the source" in sql


def test_a_stop_raised_by_the_copy_is_read_back_as_its_line() -> None:
    said = ('psql:<stdin>:1: ERROR:  invalid input syntax for type integer: "chload-stop: '
            'pg/public.t was truncated at the source; the follow stopped"')
    assert stopped(said) == "pg/public.t was truncated at the source; the follow stopped"
    assert stopped("ERROR: something else") is None


def test_a_unit_read_ahead_leaves_out_transactions_committed_before_the_unit_loading() -> None:
    columns = [SourceColumn("id", "integer", '"id"')]
    plain = changes_query("s", "0/20", ("public", "t"), "pg/public.t", columns, ["id"])
    ahead = changes_query("s", "0/20", ("public", "t"), "pg/public.t", columns, ["id"],
                          skip="0/10")
    assert "E'include-transaction', E'0'" in plain and "ORDINALITY" not in plain
    # the begin and commit rows asked for, the commits before 0/10 found by where their
    # record starts (the commit row's "lsn"), then left out with every row before them
    assert "E'include-transaction', E'1'" in ahead and "WITH ORDINALITY" in ahead
    assert "->> 'lsn')::pg_lsn < E'0/10'::pg_lsn" in ahead
    assert "p.o > coalesce(p.skipped, 0)" in ahead
    assert ahead.count("pg_logical_slot_peek_changes") == 1
