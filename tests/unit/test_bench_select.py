"""scripts/bench --only with --chload-vs: the A/B methods of another commit run with the
methods --only names, on their targets (they were dropped, so an A/B with --only could
not run)."""

from __future__ import annotations

from suite.main import select
from suite.methods import all_methods, vs_methods


def _keys(only: str | None) -> set[str]:
    return {m.key for m in select(all_methods(4) + vs_methods("abc", "/tmp/x"), only)}


def test_only_chload_on_the_server_keeps_both_commits_and_nothing_embedded() -> None:
    assert _keys("chload [server]") == {"chload [server]", "chload --audit [server]",
                                        "chload @abc [server]", "chload @abc --audit [server]"}


def test_only_a_rival_brings_both_chloads_of_its_target() -> None:
    keys = _keys("chDB SQL push (Native)")
    assert {"chDB SQL push (Native) [server]", "chload [server]",
            "chload @abc [server]"} <= keys
    assert not any("embedded" in k or "curl" in k for k in keys)


def test_without_only_every_method_runs() -> None:
    assert len(_keys(None)) == len(all_methods(4)) + 4
