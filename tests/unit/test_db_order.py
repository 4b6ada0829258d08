"""How a PostgreSQL range is read: in primary key order only where that is an ordered
read of the table (postgres.PostgresSession._order): by a one-column primary key, on a
table whose statistics say it lies in key order; by psql writing 1 MiB at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from chload.sources.base import SourceContext
from chload.sources.databases import postgres_psql as postgres
from chload.sources.databases.postgres import PostgresSession, PostgresSource
from chload.sources.databases.table import DbColumn, TableInfo, parse_url

URL = "postgresql://loader@db:5432/shop/public.orders"


class _Control:
    def __init__(self, correlation: str | None, found: bool = True) -> None:
        self.answer = [[correlation]] if found else []
        self.asked: list[str] = []

    def rows(self, sql: str) -> list[list[str | None]]:
        self.asked.append(sql)
        return self.answer


def _session(control: _Control, key: list[str], axis: str, query: str | None = None
             ) -> PostgresSession:
    session = PostgresSession.__new__(PostgresSession)
    session.url = parse_url(URL if query is None else URL.rsplit("/", 1)[0], query)
    session.query = query
    session.control = control  # type: ignore[assignment]
    session.info = TableInfo([DbColumn("id", "Int64", '"id"')], key, axis)
    return session


@pytest.mark.parametrize("correlation", ["1", "0.93", "-0.99"])
def test_a_table_in_key_order_is_read_in_key_order(correlation: str) -> None:
    control = _Control(correlation)
    assert _session(control, ["id"], "id")._order() == ' ORDER BY "id"'
    assert "pg_stats" in control.asked[0] and "'orders'" in control.asked[0]


@pytest.mark.parametrize("control", [_Control("0.2"), _Control(None), _Control("1", False)],
                         ids=["scattered", "no-correlation", "never-analyzed"])
def test_a_table_not_known_to_lie_in_key_order_is_read_as_it_lies(control: _Control) -> None:
    assert _session(control, ["id"], "id")._order() == ""


@pytest.mark.parametrize(("key", "axis", "query"), [
    (["id", "line"], "", None),  # no one-column key: one unit
    (["id"], "updated_at", None),  # --incremental-by another column: no index known
    ([], "", "SELECT 1"),  # --query
], ids=["composite-key", "other-axis", "query"])
def test_no_order_without_a_one_column_key_axis(key: list[str], axis: str,
                                                query: str | None) -> None:
    control = _Control("1")
    assert _session(control, key, axis, query)._order() == ""
    assert control.asked == []  # and nothing asked of the database


@pytest.mark.parametrize("asked", [True, False])
def test_only_a_target_that_asks_gets_ranges_in_key_order(
        asked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    control = _Control("1")
    session = _session(control, ["id"], "id")
    session.order, session.snapshot = "", "s-1"
    monkeypatch.setattr(PostgresSource, "_session", lambda self, url, context: session)
    monkeypatch.setattr(PostgresSession, "bounds", lambda self, axis: ("1", "10", 10))
    context = SourceContext(patterns=(URL,), workers=1, key_order=asked)
    [unit] = PostgresSource().open().list(URL, context)
    script = session._script(unit.location).decode()
    assert script.count("ORDER BY") == (1 if asked else 0)


def test_psql_writes_a_range_1_mib_at_a_time_where_stdbuf_can_run_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    library = tmp_path / "coreutils" / "libstdbuf.so"
    monkeypatch.setattr(postgres, "_LIBEXEC", (str(tmp_path),))
    monkeypatch.setattr(postgres.shutil, "which", lambda name: f"/bin/{name}")
    assert postgres.buffered("/pg/psql") == ["/pg/psql"]  # no library: stdbuf would fail
    library.parent.mkdir()
    library.write_bytes(b"")
    assert postgres.buffered("/pg/psql") == ["/bin/stdbuf", "--output=1048576", "/pg/psql"]
    monkeypatch.setattr(postgres.shutil, "which", lambda name: None)
    assert postgres.buffered("/pg/psql") == ["/pg/psql"]
