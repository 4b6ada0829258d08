"""The engine a versions note suggests (core/finish.py): ReplacingMergeTree with the
--incremental-by column as its version where the target takes that type, Replicated
with the same path and replica."""

from __future__ import annotations

from chload.core.finish import _replacing
from chload.schema import Column

COLUMNS = [Column("id", "Int64"), Column("at", "Nullable(DateTime('UTC'))"),
           Column("n", "Int32"), Column("s", "String")]


def test_the_version_is_the_column_where_its_type_may_be_one() -> None:
    plain = ("MergeTree", "MergeTree ORDER BY id SETTINGS index_granularity = 8192")
    assert _replacing(plain, "at", COLUMNS, "18.16.1") == "ReplacingMergeTree(`at`)"
    assert _replacing(plain, "n", COLUMNS, "chdb") == "ReplacingMergeTree(`n`)"
    assert _replacing(plain, "n", COLUMNS, "18.16.1") == "ReplacingMergeTree()"  # UInt only
    assert _replacing(plain, "s", COLUMNS, "chdb") == "ReplacingMergeTree()"


def test_a_replicated_table_keeps_its_path_and_replica() -> None:
    found = ("ReplicatedMergeTree", "ReplicatedMergeTree('/clickhouse/tables/{shard}/t', "
             "'{replica}') ORDER BY id SETTINGS index_granularity = 8192")
    assert _replacing(found, "at", COLUMNS, "18.16.1") == (
        "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/t', '{replica}', `at`)")
