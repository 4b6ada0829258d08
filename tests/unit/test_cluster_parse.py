"""What the cluster target reads from a server's metadata (targets/cluster.py), without
a cluster: the Distributed engine's arguments, a stage engine for a Replicated table,
the --shard map, and which shard a whole file goes to by weight."""

from __future__ import annotations

from collections import Counter

import pytest

from chload.errors import UsageError
from chload.targets.cluster import ClusterTarget
from chload.targets.cluster_layout import (
    Distributed,
    parse_distributed,
    parse_shard_map,
    plain_engine,
)


def test_distributed_arguments_with_nested_key() -> None:
    got = parse_distributed("Distributed(chload_weighted, default, ev_local, "
                            "cityHash64(user_id, toString(id)))")
    assert got == Distributed("chload_weighted", "default", "ev_local",
                              "cityHash64(user_id, toString(id))")
    assert parse_distributed("Distributed('c', 'db', 't')") == Distributed("c", "db", "t", None)
    assert parse_distributed("MergeTree ORDER BY id") is None


def test_a_replicated_engine_staged_as_its_plain_twin() -> None:
    assert plain_engine("ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') "
                        "ORDER BY id SETTINGS index_granularity = 8192") == (
        "MergeTree() ORDER BY id SETTINGS index_granularity = 8192")
    assert plain_engine("ReplicatedReplacingMergeTree('/p/t', 'r', ver) PARTITION BY "
                        "toYYYYMM(d) ORDER BY (id, d)") == (
        "ReplacingMergeTree(ver) PARTITION BY toYYYYMM(d) ORDER BY (id, d)")


def test_shard_map_is_checked() -> None:
    assert parse_shard_map([("ch2:9000", "http://ch2:8123")]) == {"ch2:9000": "http://ch2:8123"}
    with pytest.raises(UsageError, match="HOST:TCP_PORT"):
        parse_shard_map([("ch2", "http://ch2:8123")])


class _Shard:
    def __init__(self, number: int, weight: int) -> None:
        self.number, self.weight = number, weight


def test_whole_files_spread_by_weight_and_stable() -> None:
    cluster = object.__new__(ClusterTarget)
    cluster.shards = [_Shard(1, 1), _Shard(2, 2), _Shard(3, 1)]  # type: ignore[list-item]
    cluster.total_weight = 4
    counts = Counter(cluster.shard_of(f"s3://b/f{i}.csv").number for i in range(4000))
    assert 0.9 < counts[2] / (counts[1] + counts[3]) < 1.1
    assert cluster.shard_of("s3://b/x.csv") is cluster.shard_of("s3://b/x.csv")


def test_a_file_changed_between_shards_commits_is_refused() -> None:
    from chload.errors import SourceError
    from chload.formats import FileFormat
    from chload.ledger import FileEvent
    from chload.sources import SourceFile
    from chload.targets import LoadJob
    from chload.targets.cluster import _Loaded

    cluster = object.__new__(ClusterTarget)
    cluster.shards = [_Shard(1, 1), _Shard(2, 2), _Shard(3, 1)]  # type: ignore[list-item]
    fmt = FileFormat("CSV", "none")
    old = SourceFile("f", 1, 1, fmt, etag="v1")
    cluster.known = _Loaded({1: {"f": FileEvent("t", "f", old.identity, 1, 1, "loaded")}})

    def job(f: SourceFile) -> LoadJob:
        return LoadJob(file=f, table="t", table_display="t", columns=(), read_columns=(),
                       audit=False, settings=(), run_id="r")

    assert [s.number for s in cluster._pending(job(old))] == [2, 3]
    with pytest.raises(SourceError, match="changed since shard 1 loaded it"):
        cluster._pending(job(SourceFile("f", 2, 2, fmt, etag="v2")))
