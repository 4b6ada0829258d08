"""cluster/target.py `_commit` of a stream's units (Kafka): each unit first on the first
shard of those lacking it, then on the others only if it attached there; a file's units
on every shard at once, as before. Shards faked: each records what it was asked."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from chload.commit.ledger import FileEvent
from chload.sources.base import StreamPosition
from chload.targets.cluster.round import Round, Unit
from chload.targets.cluster.target import ClusterTarget, _Loaded


def _cluster(asked: list[tuple[int, list[str], list]], refusing: set[int]) -> Any:
    c: Any = object.__new__(ClusterTarget)
    c.local = "d.t_local"
    c.shards = []
    for n in (1, 2, 3):
        def commit_group(table: str, display: str, units: list, follows: Any = (),
                         n: int = n) -> list[bool]:
            asked.append((n, [u[0] for u in units], list(follows)))
            return [n not in refusing for _ in units]
        c.shards.append(SimpleNamespace(
            number=n, local_display="d.t_local", rows=0, bytes=0, seconds=0.0,
            target=SimpleNamespace(committer=SimpleNamespace(commit_group=commit_group),
                                   _started_ns=0, loaded=SimpleNamespace(add=list))))
    c._busy_guard, c._busy_since = threading.Lock(), {}
    c._loaded_at_end, c.known, c._round = {}, _Loaded(), Round()
    c._events = lambda unit, shard: [FileEvent("d.t_local", unit.stage, "", 0, 0,
                                               "committing")]
    return c


def _unit(c: Any, stage: str, todo: list[int], stream: bool = True) -> Unit:
    follows = (StreamPosition(f"kafka://b/t/{stage}", 0),) if stream else ()
    return Unit(SimpleNamespace(follows=follows, mode="append"), stage,  # type: ignore[arg-type]
                [s for s in c.shards if s.number in todo],
                {s.number: (1, []) for s in c.shards}, [], None)


def test_a_streams_unit_goes_to_the_others_only_once_its_first_shard_took_it() -> None:
    asked: list[tuple[int, list[str], list]] = []
    c = _cluster(asked, refusing={1})  # shard 1: another loader's unit of the partition
    a = _unit(c, "a", [1, 2, 3])
    b = _unit(c, "b", [2, 3])  # (a unit shard 1 has: the shards that lack it)
    outcomes = c._commit([a, b])
    assert outcomes == [(set(), {}), ({2, 3}, {})]
    first, then = asked[:2], asked[2:]
    assert sorted((n, stages) for n, stages, _ in first) == [(1, ["a"]), (2, ["b"])]
    assert [(n, stages) for n, stages, _ in then] == [(3, ["b"])]
    assert all(follows == [u.job.follows] for n, stages, follows in asked
               for u in (a, b) if stages == [u.stage])  # each shard checks the position


def test_a_files_units_go_to_every_shard_at_once() -> None:
    asked: list[tuple[int, list[str], list]] = []
    c = _cluster(asked, refusing=set())
    outcomes = c._commit([_unit(c, "f", [1, 2, 3], stream=False)])
    assert outcomes == [({1, 2, 3}, {})]
    assert sorted(n for n, _, _ in asked) == [1, 2, 3]
