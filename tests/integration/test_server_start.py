"""A load's first requests into 18.16, asked while the loader imports (server_early):
the answers are the ones the load would have read itself, each used once."""

from __future__ import annotations

import uuid

import pytest
import services

from chload.commit.known import KnownUnits
from chload.targets.server import early as server_early
from chload.targets.server.http import parse_target_url
from chload.targets.server.target import ServerTarget

pytestmark = pytest.mark.integration


def test_reads_asked_ahead_are_the_loads_own(clickhouse: services.Service) -> None:
    table = f"early_{uuid.uuid4().hex[:8]}"
    services.clickhouse_query(clickhouse, f"CREATE TABLE default.{table} (id UInt64) "
                              "ENGINE = MergeTree ORDER BY id")
    services.clickhouse_query(clickhouse, f"INSERT INTO default.{table} VALUES (1), (2)")
    url = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    env = {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    sql_table = f"`default`.`{table}`"
    first = ServerTarget(parse_target_url(url, env))  # the ledger, as a first load makes
    try:  # it, and the stages of dead loaders other tests left dropped, as its start does
        first.recover(sql_table)
    finally:
        first.close()

    server_early.begin(url, table, env)
    early = ServerTarget(parse_target_url(url, env))
    try:
        asked = dict(early._ahead)
        assert len(asked) == 4  # columns, the commit survey, the table's state, the count
        # of its units loaded
        before = early.client.stats.calls
        assert [c.name for c in early.table_columns(sql_table) or []] == ["id"]
        state = early.ledger.table_state("default", table)
        assert state.exists and state.rows == 2
        assert early.ledger.known(f"default.{table}", state) == (KnownUnits(), "")
        assert early.recover(sql_table) == 0
        assert early.client.stats.calls == before and early._ahead == {}
    finally:
        early.close()
    fresh = ServerTarget(parse_target_url(url, env))  # the same reads, asked now
    try:
        for sql, answer in asked.items():  # (a leftover stage's age may have grown)
            assert _ageless(fresh.rows(sql)) == _ageless(answer), sql
    finally:
        fresh.close()


def _ageless(rows: list[dict]) -> list[dict]:
    """The rows without a stage's age, in an order of their own: a UNION ALL's parts
    come in either order (the load reads them by name)."""
    return sorted(({k: v for k, v in row.items() if k != "age"} for row in rows), key=repr)
