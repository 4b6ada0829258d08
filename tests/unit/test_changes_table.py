"""The followed table's shape and a change stream's positions (sources/changes/), and the
SQL of a unit's changes: pure functions, no database."""

from __future__ import annotations

import pytest

from chload.commit.ledger import LOADED, FileEvent
from chload.errors import UsageError
from chload.schema import Column
from chload.sources.changes import followed, table
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


class _Dist:
    def __init__(self, key: str | None) -> None:
        self.key = key


class _Cluster:
    """What check_sharding reads of a cluster target: its Distributed arguments."""

    def __init__(self, key: str | None, by_file: bool = False) -> None:
        self.dist, self.by_file = _Dist(key), by_file


@pytest.mark.parametrize("key", ["cityHash64(id)", "intHash64(`id`)", "id",
                                 "cityHash64(tenant, id) % 7", "sipHash64(concat(tenant, 'x'))"])
def test_a_sharding_key_of_the_followed_key_alone_is_taken(key: str) -> None:
    table.check_sharding(_Cluster(key), "default.t", ("tenant", "id"))  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["rand()", "cityHash64(note)", "id + n", None,
                                 "cityHash64(id, rand64())"])
def test_a_sharding_key_that_scatters_a_keys_versions_is_refused_in_one_line(
        key: str | None) -> None:
    with pytest.raises(UsageError) as caught:
        table.check_sharding(_Cluster(key), "default.t", ("id",))  # type: ignore[arg-type]
    said = str(caught.value)
    shown = key or "none"
    assert said.startswith(f"table default.t: a Distributed table with sharding key {shown},")
    assert "different shards" in said and "cityHash64(id)" in said and "\n" not in said


def test_a_follow_routed_by_file_is_refused() -> None:
    with pytest.raises(UsageError, match="--shard-by file"):
        table.check_sharding(_Cluster("cityHash64(id)", by_file=True), "default.t",  # type: ignore[arg-type]
                             ("id",))


def test_a_table_that_is_not_distributed_has_no_sharding_to_check() -> None:
    table.check_sharding(object(), "default.t", ("id",))  # type: ignore[arg-type]


def test_the_names_a_sharding_key_reads_leave_out_functions_and_literals() -> None:
    assert table.key_names("cityHash64(`a b`, c, 'lit') % 4") == {"a b", "c"}


class _Ledger:
    def __init__(self, events: list) -> None:
        self.events = events

    def latest(self, target_table: str) -> list:
        return self.events


class _ClusterLedger(_Cluster):
    """A cluster target of 3 shards whose ledger holds `on`: uri -> the shards having it."""

    def __init__(self, on: dict[str, list[int]]) -> None:
        super().__init__("cityHash64(id)")
        self.shards = [1, 2, 3]
        self.ledger = _Ledger([FileEvent(f"default.t shard {n}", uri, "", 0, 0, LOADED)
                               for uri, shards in on.items() for n in shards])


def test_into_a_cluster_a_stream_ends_where_every_shard_has_its_units() -> None:
    s = "pgchanges://u@h:5432/db/public.t/slot"
    done = _ClusterLedger({f"{s}/0-99": [1, 2, 3], f"{s}/100-199": [1, 2, 3],
                           "pgchanges://u@h:5432/db/public.other/slot/0-999": [1]})
    assert table.committed_end(done, "default.t", s) == 200  # type: ignore[arg-type]
    assert table.committed_end(_ClusterLedger({}), "default.t", s) is None  # type: ignore[arg-type]


def test_into_a_cluster_a_unit_on_some_shards_only_is_the_one_to_load_next() -> None:
    s = "pgchanges://u@h:5432/db/public.t/slot"
    cut = _ClusterLedger({f"{s}/0-99": [1, 2, 3], f"{s}/100-199": [1]})
    assert table.resume_point(cut, "default.t", s) == (100, (100, 199))  # type: ignore[arg-type]
    assert table.committed_end(cut, "default.t", s) == 100  # type: ignore[arg-type]
    first = _ClusterLedger({f"{s}/0-99": [2]})  # (the first unit: no end yet)
    assert table.resume_point(first, "default.t", s) == (None, (0, 99))  # type: ignore[arg-type]


def test_into_a_cluster_a_unit_on_some_shards_only_past_a_gap_stops_the_follow_in_one_line(
        ) -> None:
    s = "pgchanges://u@h:5432/db/public.t/slot"
    for on in ({f"{s}/0-99": [1, 2, 3], f"{s}/150-199": [1, 3]},
               {f"{s}/0-99": [1, 2, 3], f"{s}/100-149": [1], f"{s}/150-199": [1]}):
        with pytest.raises(UsageError) as caught:
            table.committed_end(_ClusterLedger(on), "default.t", s)  # type: ignore[arg-type]
        said = str(caught.value)
        assert said.startswith("table default.t: changes 150-199 were committed on "
                               "default.t shard 1"), said
        assert "beyond the changes every shard has (up to 100)" in said and "\n" not in said


class _Server:
    """A server target whose own ledger holds `rows` (target_table, uri of a loaded unit)
    and whose `default.t` has engine `engine`."""

    def __init__(self, rows: list[tuple[str, str]], engine: str = "MergeTree") -> None:
        self.found, self.engine = rows, engine

    def rows(self, sql: str) -> list[dict]:
        return [{"target_table": t, "uri": u} for t, u in self.found]

    def table_engines(self, table_sql: str) -> list[tuple[str, str]]:
        return [("default.t", self.engine)]


def test_a_follow_into_a_cluster_is_listed_from_its_shards_not_as_its_local_table() -> None:
    """The entry server (also shard 1) holds its shard's units under `t_local`: the
    cluster's follow, listed once, at the end every shard has; a plain follow beside it."""
    s = "pgchanges://u@h:5432/db/public.t/slot"
    cluster = _ClusterLedger({f"{s}/0-99": [1, 2, 3], f"{s}/100-199": [1, 2, 3]})
    cluster.local, cluster.table_display = "`default`.`t_local`", "default.t"  # type: ignore[attr-defined]
    other = "pgchanges://u@h:5432/db/public.o/slot2"
    server = _Server([("default.t_local", f"{s}/0-99"), ("default.t_local", f"{s}/100-199"),
                      ("default.o", f"{other}/0-49")])
    found = followed.streams(server, [cluster], "pgchanges://")  # type: ignore[arg-type, list-item]
    assert [(f.table, f.stream, f.end, f.where) for f in found] == [
        ("default.o", other, 50, server), ("default.t", s, 200, cluster)]
    # a unit some shards lack (the next run commits it on the others): listed at the end
    # every shard has, where that run goes on from
    cut = _ClusterLedger({f"{s}/0-99": [1, 2, 3], f"{s}/100-199": [1]})
    cut.local, cut.table_display = "`default`.`t_local`", "default.t"  # type: ignore[attr-defined]
    [listed] = followed.streams(_Server([]), [cut], "pgchanges://")  # type: ignore[arg-type, list-item]
    assert listed.end == 100 and not listed.error
    # one past a gap (no run would go on from it): listed with the line the follow stops with
    gap = _ClusterLedger({f"{s}/0-99": [1, 2, 3], f"{s}/150-199": [1]})
    gap.local, gap.table_display = "`default`.`t_local`", "default.t"  # type: ignore[attr-defined]
    [listed] = followed.streams(_Server([]), [gap], "pgchanges://")  # type: ignore[arg-type, list-item]
    assert listed.end is None and "committed on default.t shard 1 only" in listed.error


def test_cluster_into_an_existing_table_that_is_not_distributed_is_refused_in_one_line(
        ) -> None:
    with pytest.raises(UsageError, match=r"^--cluster c: table default\.t exists and is not "
                                         r"a Distributed table; follow into a new --table"):
        table.check_cluster_table(_Server([]), "`default`.`t`", "default.t", "c")  # type: ignore[arg-type]
    table.check_cluster_table(_Server([], "Distributed(c, default, t_local, id)"),  # type: ignore[arg-type]
                              "`default`.`t`", "default.t", "c")
    table.check_cluster_table(_Cluster("id"), "`default`.`t`", "default.t", "c")  # type: ignore[arg-type]
    table.check_cluster_table(_Server([]), "`default`.`t`", "default.t", None)  # type: ignore[arg-type]
