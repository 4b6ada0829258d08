"""When a cluster load's units commit (targets/cluster_round.py)."""

from __future__ import annotations

import threading
import time

from chload.targets.cluster_round import Round


def test_the_last_round_commits_once_every_unit_is_routed_or_failed() -> None:
    r = Round()
    r.plan([("a",), ("b",), ("c",)])  # type: ignore[list-item]
    order: list[str] = []
    with r.unit() as routed:  # an early unit: the rest is still to start, no wait
        routed()
        r.wait_if_last()
        order.append("a commits")
    release_b = threading.Event()

    def b() -> None:
        with r.unit() as routed:
            release_b.wait(5)
            routed()
            order.append("b routed")
            r.wait_if_last()
            order.append("b commits")

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
