"""A cluster's sharding layout, recorded on each shard, against the layout of a rerun
(targets/cluster_ledger.py): refused where loaded rows could move."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chload.errors import UsageError
from chload.targets.cluster.ledger import check_layout, layout_of


def cluster(key: str = "cityHash64(id)", weights: tuple[int, ...] = (1, 2, 1),
            by_file: bool = False, has: dict[int, set[str]] | None = None) -> SimpleNamespace:
    shards = [SimpleNamespace(number=i + 1, weight=w) for i, w in enumerate(weights)]
    known = {n: {uri: object() for uri in uris} for n, uris in (has or {}).items()}
    return SimpleNamespace(dist=SimpleNamespace(cluster="c", key=key), by_file=by_file,
                           shards=shards, table_display="db.t",
                           known=SimpleNamespace(by_shard=known))


def test_a_first_load_records_the_layout_on_every_shard() -> None:
    c = cluster()
    assert check_layout(c, {1: None, 2: None, 3: None}) == [1, 2, 3]  # type: ignore[arg-type]
    same = layout_of(c)  # type: ignore[arg-type]
    assert check_layout(c, {1: same, 2: same, 3: same}) == []  # type: ignore[arg-type]


def test_a_new_key_with_every_unit_whole_is_recorded_not_refused() -> None:
    old = layout_of(cluster())  # type: ignore[arg-type]
    c = cluster(key="intHash64(id)", has={1: {"a"}, 2: {"a"}, 3: {"a"}})
    assert check_layout(c, {1: old, 2: old, 3: old}) == [1, 2, 3]  # type: ignore[arg-type]


def test_a_new_key_with_a_half_loaded_unit_is_refused_naming_it() -> None:
    old = layout_of(cluster())  # type: ignore[arg-type]
    c = cluster(weights=(1, 1, 2), has={1: {"a", "b"}, 2: {"a", "b"}, 3: {"a"}})
    with pytest.raises(UsageError) as refused:
        check_layout(c, {1: old, 2: old, 3: old})  # type: ignore[arg-type]
    assert str(refused.value) == (
        "table db.t: its sharding changed (key cityHash64(id) by row, shards weighted 1/2/1, "
        "now key cityHash64(id) by row, shards weighted 1/1/2) since b was loaded on shards "
        "1, 2 but not 3: routing it again now would move rows; finish it with the old "
        "layout, or drop its rows on every shard and load it with --force")


@pytest.mark.parametrize(("old", "now"), [
    (cluster(), cluster(weights=(1, 2, 1, 1))),  # a shard added
    (cluster(by_file=True), cluster()),  # whole files on one shard each, now by row
])
def test_other_shards_or_rows_after_files_are_refused_once_anything_is_loaded(
        old: SimpleNamespace, now: SimpleNamespace) -> None:
    recorded = layout_of(old)  # type: ignore[arg-type]
    now.known.by_shard = {1: {"a": object()}}
    with pytest.raises(UsageError, match="could place them twice"):
        check_layout(now, {1: recorded, 2: recorded, 3: recorded})  # type: ignore[arg-type]
