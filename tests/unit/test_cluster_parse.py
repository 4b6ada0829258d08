"""What the cluster target reads from a server's metadata (targets/cluster/target.py), without
a cluster: the Distributed engine's arguments, a stage engine for a Replicated table,
the --shard map, and which shard a whole file goes to by weight."""

from __future__ import annotations

from collections import Counter

import pytest

from chload.errors import UsageError
from chload.targets.cluster.layout import (
    Distributed,
    describe,
    layout_from,
    parse_distributed,
    parse_shard_map,
    plain_engine,
)
from chload.targets.cluster.target import ClusterTarget


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
    from chload.commit.ledger import FileEvent
    from chload.errors import SourceError
    from chload.formats import FileFormat
    from chload.sources.base import SourceFile
    from chload.targets.base import LoadJob
    from chload.targets.cluster.target import _Loaded

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


class _Answers:
    """A server answering `describe`'s one query with the rows given."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows_given, self.asked = rows, 0
        self.url = type("U", (), {"display": "http://default@ch1:8123/default"})()

    def rows(self, sql: str) -> list[dict]:
        self.asked += 1
        return self.rows_given


def test_one_query_describes_the_table_its_columns_and_its_cluster() -> None:
    def replica(cluster: str, shard: int, number: int, port: int) -> dict:
        return {"k": "replica", "a": cluster, "b": str(shard), "c": str(shard), "d": str(number),
                "e": "127.0.0.1", "f": f"{port} {int(shard == 1)}"}
    server = _Answers([
        {"k": "engine", "a": "Distributed", "b": "Distributed(c, default, t_local, id)",
         "c": "", "d": "", "e": "", "f": ""},
        {"k": "column", "a": "id", "b": "UInt64", "c": "", "d": "", "e": "", "f": ""},
        replica("other", 1, 1, 9500), replica("c", 2, 1, 9002), replica("c", 1, 2, 9011),
        replica("c", 1, 1, 9001)])
    got = describe(server, "default.t")  # type: ignore[arg-type]
    assert server.asked == 1
    assert got.dist == Distributed("c", "default", "t_local", "id")
    assert [(c.name, c.type) for c in got.columns or []] == [("id", "UInt64")]
    layout = layout_from(server, got, "default.t")  # type: ignore[arg-type]
    assert [(r.shard, r.number, r.port, r.weight, r.is_local) for r in layout] == [
        (1, 1, 9001, 1, True), (1, 2, 9011, 1, True), (2, 1, 9002, 2, False)]
    with pytest.raises(UsageError, match="cluster c is not in system.clusters"):
        layout_from(server, describe(_Answers(server.rows_given[:2]), "default.t"),  # type: ignore[arg-type]
                    "default.t")
    plain = describe(_Answers([{"k": "engine", "a": "MergeTree", "b": "MergeTree ORDER BY id",
                                "c": "", "d": "", "e": "", "f": ""}]), "default.t")  # type: ignore[arg-type]
    assert plain.dist is None and plain.columns is None
