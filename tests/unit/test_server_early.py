"""server_early: what a thread asks of a server while the loader imports is used only
for its own URL, and a failure there leaves nothing (the load asks again)."""

from __future__ import annotations

import socket

from chload.targets.server import early as server_early
from chload.targets.server.http import parse_target_url
from chload.targets.server.target import ServerTarget


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_failed_start_leaves_nothing_to_claim() -> None:
    target = f"http://127.0.0.1:{_closed_port()}/db"
    server_early.begin(target, "t", {})
    assert server_early.claim(parse_target_url(target)) is None
    assert server_early._EARLY == []


def test_only_the_same_url_claims_and_the_rest_is_discarded() -> None:
    target = f"http://127.0.0.1:{_closed_port()}/db"
    server_early.begin(target, "t", {"CLICKHOUSE_PASSWORD": "a"})
    other = parse_target_url(target, {"CLICKHOUSE_PASSWORD": "b"})
    assert server_early.claim(other) is None
    assert len(server_early._EARLY) == 1
    server_early.discard()
    assert server_early._EARLY == []


def test_a_bad_url_begins_nothing() -> None:
    server_early.begin("http://127.0.0.1:1/not-a-db!", "t", {})
    assert server_early._EARLY == []


def test_answers_asked_ahead_go_once_and_not_past_a_write() -> None:
    class Client:
        posted: list[str] = []

        def post(self, sql: str, **_: object) -> bytes:
            Client.posted.append(sql)
            return b'{"n": 2}\n'

    target = ServerTarget.__new__(ServerTarget)
    target.client, target.where = Client(), "server h:1"  # type: ignore[assignment]
    target._ahead = {"SELECT a": [{"n": 1}], "SELECT b": [{"n": 1}]}
    assert target.rows("SELECT a") == [{"n": 1}] and Client.posted == []
    assert target.rows("SELECT a") == [{"n": 2}] and Client.posted == ["SELECT a"]
    target.command("DROP TABLE x")
    assert target.rows("SELECT b") == [{"n": 2}] and target._ahead == {}
