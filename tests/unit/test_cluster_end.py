"""The end of a cluster load (targets/cluster_end.py): the last round's stages are
dropped after the run's last ledger writes, each shard's in turn; earlier rounds' at
once."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from chload.targets.cluster.end import Ending
from chload.targets.cluster.round import Round


class _Shard:
    def __init__(self, number: int, log: list[str]) -> None:
        self.number, self.log = number, log
        self.target = SimpleNamespace(
            _drop=lambda stage: log.append(f"drop {number} {stage}"),
            committer=SimpleNamespace(release_kept=lambda: log.append(f"unlock {number}")),
            loaded=SimpleNamespace(add=lambda events: list(events)),
            flush=lambda: log.append(f"loaded {number}"))


class _Cluster(Ending):
    def __init__(self, final: bool) -> None:
        self.log: list[str] = []
        self.shards = [_Shard(1, self.log), _Shard(2, self.log)]  # type: ignore[list-item]
        self.entry = SimpleNamespace(flush=lambda: self.log.append("run record"),
                                     _drop=lambda route: None)  # type: ignore[assignment]
        self._busy_guard = threading.Lock()
        self._dropping, self._end_drops, self._loaded_at_end = [], {}, {}
        self._counting = self._ending = None
        self._counters, self._ends = [], []
        self._round = Round()
        self._round.plan([("a",)] if final else [("a",), ("b",)])  # type: ignore[list-item]
        self._unit = self._round.unit()
        self._unit.__enter__()


def test_the_last_rounds_stages_drop_after_the_runs_last_writes() -> None:
    c = _Cluster(final=True)
    c._drop_stage("s1", c.shards)
    c._drop_stage("s2", c.shards[:1])  # (shard 2's commit failed: its stage is kept)
    assert c.log == []  # nothing dropped before the end
    c.flush()
    writes = {"unlock 1", "unlock 2", "loaded 1", "loaded 2", "run record"}
    assert set(c.log[:5]) == writes
    assert c.log[5:].count("drop 1 s1") == 1 and c.log[5:].count("drop 2 s1") == 1
    assert c.log.index("drop 1 s1") < c.log.index("drop 1 s2")  # each shard's in turn
    assert "drop 2 s2" not in c.log


def test_an_earlier_rounds_stage_drops_at_once() -> None:
    c = _Cluster(final=False)
    c._drop_stage("s1", c.shards)
    c._dropped()
    assert sorted(c.log) == ["drop 1 s1", "drop 2 s1"]
