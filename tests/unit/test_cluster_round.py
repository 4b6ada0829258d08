"""When a cluster load's units commit (targets/cluster_round.py)."""

from __future__ import annotations

import threading
import time

from chload.targets.cluster import round as round_module
from chload.targets.cluster.round import Round


def test_the_last_round_commits_once_every_unit_is_routed_or_failed() -> None:
    r = Round()
    r.plan([("a",), ("b",), ("c",)])  # type: ignore[list-item]
    order: list[str] = []
    calls: list[list[str]] = []

    def commit(units: list[str]) -> list[str]:
        calls.append(units)
        order.extend(f"{u} commits" for u in units)
        return [f"{u} done" for u in units]

    with r.unit() as routed:  # an early unit: the rest is still to start, no wait
        routed()
        assert r.commit("a", commit) == "a done"
    release_b = threading.Event()

    def b() -> None:
        with r.unit() as routed:
            release_b.wait(5)
            routed()
            order.append("b routed")
            assert r.commit("b", commit) == "b done"

    def c() -> None:
        try:
            with r.unit():  # routing, then fails: it stops routing all the same
                time.sleep(0.05)
                order.append("c failed")
                raise RuntimeError("c")
        except RuntimeError:
            pass

    threads = [threading.Thread(target=b), threading.Thread(target=c)]
    for t in threads:
        t.start()
    release_b.set()
    for t in threads:
        t.join(5)
    assert order[0] == "a commits" and order[-1] == "b commits"
    assert order.index("c failed") < order.index("b commits")
    assert r.in_flight == 0 and r.routing == 0
    assert calls == [["a"], ["b"]]


def test_the_last_round_is_one_commit_of_every_unit_waiting() -> None:
    r = Round()
    r.plan([("a",), ("b",), ("c",)])  # type: ignore[list-item]
    threads, go, calls, results = _units(r, "abc")
    for u in "abc":  # routed one after the other: nobody commits before the last
        time.sleep(0.02)
        assert calls == []
        go[u].set()
    for t in threads:
        t.join(5)
    assert calls == [["a", "b", "c"]]
    assert results == {u: f"{u} done" for u in "abc"}


def test_an_error_of_the_last_round_commit_reaches_every_unit_of_it() -> None:
    r = Round()
    r.plan([("a",), ("b",)])  # type: ignore[list-item]
    errors: list[str] = []

    def commit(units: list[str]) -> list[str]:
        raise RuntimeError("ledger gone")

    def unit(name: str) -> None:
        with r.unit() as routed:
            routed()
            try:
                r.commit(name, commit)
            except RuntimeError as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=unit, args=(u,)) for u in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert errors == ["ledger gone", "ledger gone"]


def test_final_is_set_once_every_planned_unit_has_started() -> None:
    r = Round()
    r.plan([("a",), ("b",)])  # type: ignore[list-item]
    with r.unit():
        assert not r.final
        with r.unit():
            assert r.final


def test_an_earlier_round_commits_its_units_in_groups_of_gather() -> None:
    r = Round(gather=2)
    r.plan([(u,) for u in "abcdefgh"])  # type: ignore[misc]
    threads, go, calls, results = _units(r, "abc")
    time.sleep(0.05)
    go["a"].set()  # b and c still routing: a waits for a second unit
    time.sleep(0.1)
    assert calls == []
    go["b"].set()
    threads[1].join(5)
    assert calls == [["a", "b"]]
    go["c"].set()  # alone, and nothing else routing: at once
    for t in threads:
        t.join(5)
    assert calls == [["a", "b"], ["c"]]
    assert results == {u: f"{u} done" for u in "abc"}


def test_a_unit_of_an_earlier_round_waits_for_others_at_most_gather_seconds(
        monkeypatch) -> None:
    monkeypatch.setattr(round_module, "GATHER_SECONDS", 0.2)
    r = Round(gather=4)
    r.plan([(u,) for u in "abcdefgh"])  # type: ignore[misc]
    calls: list[list[str]] = []
    release = threading.Event()

    def commit(units: list[str]) -> list[str]:
        calls.append(units)
        return [f"{u} done" for u in units]

    def slow() -> None:
        with r.unit() as routed:
            release.wait(5)
            routed()

    other = threading.Thread(target=slow)
    with r.unit() as routed:
        other.start()
        time.sleep(0.05)
        routed()
        started = time.monotonic()
        assert r.commit("a", commit) == "a done"  # b still routing: a goes after the wait
        waited = time.monotonic() - started
    release.set()
    other.join(5)
    assert calls == [["a"]]
    assert 0.1 <= waited < 3


def _units(r: Round, names: str) -> tuple[list[threading.Thread], dict[str, threading.Event],
                                          list[list[str]], dict[str, str]]:
    """A thread per unit of `names`, each routed once its event is set, then committed;
    the commits' calls (each sorted) and each unit's outcome."""
    calls: list[list[str]] = []
    results: dict[str, str] = {}
    go = {u: threading.Event() for u in names}

    def commit(units: list[str]) -> list[str]:
        calls.append(sorted(units))
        return [f"{u} done" for u in units]

    def unit(name: str) -> None:
        with r.unit() as routed:
            go[name].wait(5)
            routed()
            results[name] = r.commit(name, commit)

    threads = [threading.Thread(target=unit, args=(u,)) for u in names]
    for t in threads:
        t.start()
    return threads, go, calls, results
