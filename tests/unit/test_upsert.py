"""--upsert-key and --version: the options checked, the engine chload creates, and which
existing tables (system.tables.engine_full) are taken as upsert tables."""

from __future__ import annotations

import pytest

from chload.core.upsert import of
from chload.errors import UsageError
from chload.schema import Column


def test_the_engine_and_order_created() -> None:
    one, two = of("id", "updated_at", None), of(" tenant, `id` ", None, None)
    assert one is not None and two is not None
    assert (one.engine, one.order_by) == ("ReplacingMergeTree(`updated_at`)", "`id`")
    assert (two.engine, two.order_by) == ("ReplacingMergeTree()", "(`tenant`, `id`)")


@pytest.mark.parametrize("key, version, order_by, says", [
    (None, "v", None, "--version v: only with --upsert-key"),
    ("id", None, "id", "--order-by id with --upsert-key"),
    ("id;drop", None, None, "--upsert-key id;drop: name columns"),
    ("id", "a+b", None, "--version a+b: name one column")])
def test_wrong_options_in_one_line(key: str | None, version: str | None,
                                   order_by: str | None, says: str) -> None:
    with pytest.raises(UsageError, match=says.replace("+", r"\+")):
        of(key, version, order_by)


@pytest.mark.parametrize("engine_full", [
    "ReplacingMergeTree(updated_at) ORDER BY id SETTINGS index_granularity = 8192",
    "ReplicatedReplacingMergeTree('/t/{shard}', '{replica}', updated_at) ORDER BY (id) "
    "SETTINGS index_granularity = 8192",
    "ReplacingMergeTree(`updated_at`) PARTITION BY toYYYYMM(d) ORDER BY `id`"])
def test_an_upsert_table_is_taken(engine_full: str) -> None:
    upsert = of("id", "updated_at", None)
    assert upsert is not None
    upsert.check_table("t", [("t", engine_full)])
    plain = of("id", None, None)
    assert plain is not None
    plain.check_table("t", [("t", engine_full)])  # (no --version: any version column)
    plain.check_table("t", [("t", "ReplacingMergeTree ORDER BY id")])


@pytest.mark.parametrize("engine_full, is_", [
    ("MergeTree ORDER BY id SETTINGS index_granularity = 8192", "MergeTree ORDER BY id"),
    ("ReplacingMergeTree(updated_at) ORDER BY (id, v)", "ORDER BY (id, v)"),
    ("ReplacingMergeTree(v) ORDER BY id", "ReplacingMergeTree(v) ORDER BY id"),
    ("ReplacingMergeTree ORDER BY id", "ReplacingMergeTree ORDER BY id")])
def test_another_engine_or_order_is_refused(engine_full: str, is_: str) -> None:
    upsert = of("id", "updated_at", None)
    assert upsert is not None
    with pytest.raises(UsageError, match="needs s1 to be ENGINE = ReplacingMergeTree"
                       r"\(`updated_at`\) ORDER BY `id`, but it is ") as caught:
        upsert.check_table("t", [("s0", "ReplacingMergeTree(updated_at) ORDER BY id"),
                                 ("s1", engine_full)])
    assert is_ in str(caught.value) and "\n" not in str(caught.value)


def test_a_column_the_data_lacks_is_named() -> None:
    upsert = of("tenant,id", "updated_at", None)
    assert upsert is not None
    with pytest.raises(UsageError, match="--upsert-key column tenant is not in the data"):
        upsert.check_data("t", [Column("id", "Int64"), Column("updated_at", "DateTime")])
