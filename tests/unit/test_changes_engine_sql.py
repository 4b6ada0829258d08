"""engine_rows.py's SQL over wal2json lines in chDB: the rows sql.py's changes_query makes
(new values by position or name, a moved key's delete, messages left out), COPY's text
for the types it prints otherwise, the STOP lines, and which tables it takes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import chdb
import pytest

from chload.errors import SourceError, from_engine_message
from chload.sources.changes.postgres import engine_rows
from chload.sources.changes.postgres.sql import SourceColumn


def _follow(*columns: tuple[str, str], key: tuple[str, ...] = ("id",)) -> Any:
    return SimpleNamespace(described=SimpleNamespace(columns=[
        SourceColumn(n, t, f'"{n}"') for n, t in columns]), url=SimpleNamespace(
        display="pg/shop/public.t"), key=list(key))


def _rows(tmp_path: Path, follow: Any, changes: list[dict[str, Any]]) -> list[list[str]]:
    spool = tmp_path / "stream-1.json"
    # (a number as wal2json prints it, beyond a float's digits: "@" + its text)
    spool.write_text(re.sub(r'"@([-0-9.e]+)"', r"\1",
                            "".join(json.dumps(c) + "\n" for c in changes)))
    sql = engine_rows.rows_sql(follow, str(spool), "unused")
    text = chdb.query(sql[sql.index("SELECT"):], "TSV").data()
    return [line.split("\t") for line in text.splitlines()]


def _change(action: str, lsn: str, columns: list[tuple[str, Any]] | None = None,
            identity: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
    change: dict[str, Any] = {"action": action, "lsn": lsn, "schema": "public", "table": "t"}
    if columns is not None:
        change["columns"] = [{"name": n, "value": v} for n, v in columns]
    if identity is not None:
        change["identity"] = [{"name": n, "value": v} for n, v in identity]
    return change


def test_each_change_gives_the_rows_changes_query_gives(tmp_path: Path) -> None:
    follow = _follow(("id", "bigint"), ("note", "text"))
    rows = _rows(tmp_path, follow, [
        _change("I", "0/16B3748", [("id", 1), ("note", "a\tb\\c\n😀")]),
        _change("U", "0/16B3750", [("id", 2), ("note", None)], [("id", 1)]),  # key moved
        _change("U", "0/16B3758", [("note", "y"), ("id", 2)], [("id", 2)]),  # by name
        _change("U", "1/0", [("note", "z")], [("id", 2), ("note", "old")]),  # identity's
        _change("D", "A/F0000001", None, [("id", 2)]),
        {"action": "M", "lsn": "A/F0000002", "transactional": False, "prefix": "p",
         "content": "c"},
    ])
    assert rows == [
        ["1", "a\\tb\\\\c\\n😀", str(0x16B3748), "0"],
        ["2", "\\N", str(0x16B3750), "0"], ["1", "\\N", str(0x16B3750), "1"],
        ["2", "y", str(0x16B3758), "0"],
        ["2", "z", str(1 << 32), "0"],
        ["2", "\\N", str(0xAF0000001), "1"]]


def test_values_are_printed_as_the_snapshots_copy_prints_them(tmp_path: Path) -> None:
    follow = _follow(("id", "integer"), ("tz", "timestamp(3) with time zone"),
                     ("b", "boolean"), ("raw", "bytea"), ("n", "numeric(38,10)"),
                     ("f", "double precision"))
    rows = _rows(tmp_path, follow, [
        _change("I", "0/1", [("id", 1), ("tz", "2024-02-29 23:59:59.999+00"), ("b", True),
                             ("raw", "00ff5c"), ("n", "@1234567890123456789012345678.5"),
                             ("f", 1.5e-7)]),
        _change("I", "0/2", [("id", 2), ("tz", "0044-03-15 12:00:00+00 BC"), ("b", False),
                             ("raw", None), ("n", None), ("f", None)])])
    assert rows[0][:5] == ["1", "2024-02-29 23:59:59.999", "1", "\\\\x00ff5c",
                           "1234567890123456789012345678.5"]
    assert float(rows[0][5]) == 1.5e-7
    assert rows[1][:6] == ["2", "0044-03-15 12:00:00 BC", "0", "\\N", "\\N", "\\N"]


@pytest.mark.parametrize("change, said", [
    (_change("T", "0/3"), "pg/shop/public.t was truncated at the source"),
    (_change("U", "0/3", [("id", 1)], [("id", 1)]), "pg/shop/public.t: an update left a "
                                                    "column out")])
def test_a_truncate_or_a_column_left_out_fails_with_its_stop_line(
        tmp_path: Path, change: dict[str, Any], said: str) -> None:
    follow = _follow(("id", "bigint"), ("note", "text"))
    with pytest.raises(Exception) as failed:
        _rows(tmp_path, follow, [_change("I", "0/1", [("id", 1), ("note", "x")]), change])
    line = engine_rows._stopped(str(failed.value))
    assert line is not None and line.startswith(said) and "chload sources --drop" in line


def test_only_tables_whose_values_it_prints_alike_are_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _follow(("id", "bigint"), ("at", "timestamp(6) with time zone"),
                    ("n", "numeric(12,2)"), ("v", "character varying(20)"))
    assert engine_rows.eligible(plain, "UTF8", True)
    assert not engine_rows.eligible(plain, "LATIN1", True)
    assert not engine_rows.eligible(plain, "UTF8", False)  # (the session's zone unknown)
    for other in ("jsonb", "integer[]", "interval", "t_mood"):
        assert not engine_rows.eligible(_follow(("id", "bigint"), ("x", other)), "UTF8", True)
    assert not engine_rows.eligible(_follow(("n", "numeric(12,2)"), key=("n",)), "UTF8", True)
    monkeypatch.setenv(engine_rows.CONVERT, "psql")
    assert not engine_rows.eligible(plain, "UTF8", True)


def test_a_line_the_engine_cannot_read_fails_naming_the_psql_way(tmp_path: Path) -> None:
    def infer_rows(sql: str) -> list[dict[str, Any]]:
        try:
            chdb.query(sql, "TSV")
        except Exception as exc:
            raise from_engine_message(str(exc), "changes") from exc
        return []

    follow = _follow(("id", "bigint"), ("note", "text"))
    follow.target = SimpleNamespace(infer_rows=infer_rows)
    spool = tmp_path / "stream-1.json"
    spool.write_text('{"action":"I","lsn":"0/1","columns":[{"name":"id","value":1}\n')
    with pytest.raises(SourceError) as failed:
        engine_rows.convert(follow, str(spool), str(tmp_path / "unit.native"))
    said = str(failed.value)
    assert said.startswith("pg/shop/public.t: the engine could not make the streamed")
    assert said.endswith("run again with CHLOAD_PG_CONVERT=psql to make them through psql")
    assert "\n" not in said and not (tmp_path / "unit.native.tsv").exists()
