"""The ledger's rows as the engine stores them: events written by `Ledger.record` (rows of
JSON built a format a row) hold exactly the values a dict a row through json's encoder
stored, awkward text and the largest UInt64 included, on chDB and on the 18.16 server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import target_spec

from chload.commit.ledger import COMMITTING, LOADED, FileEvent
from chload.targets.base import Target
from chload.targets.registry import open_target

pytestmark = pytest.mark.integration

# Text a file name, an error or a run id may hold: quotes, backslashes (and a name whose
# undecodable bytes were spelled `\xNN`), line and field separators, NUL and the other
# control characters, DEL, non-ASCII (two, three and four bytes of UTF-8), U+2028
AWKWARD = ['say "hi"', "it's", "back\\slash\\", "caf\\xe9 \\x00.csv", "line\nbreak\r\n",
           "tab\there", "nul\x00byte", "".join(map(chr, range(1, 32))) + "\x7f",
           "héllo wörld", "日本語/ファイル.csv", "emoji 🦆", "sep\u2028\u2029", "{\"k\": [1]}",
           "", " ", "\\", "\"", "'"]
BIG = 2**64 - 1  # the largest UInt64


@pytest.fixture(params=["embedded", "server"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    t = open_target(target_spec(request, request.param, tmp_path))
    yield t
    t.close()


def _events(table: str, seq: int) -> list[FileEvent]:
    """An event of every awkward value in every text column, the ints at their extremes."""
    events = []
    for i, text in enumerate(AWKWARD):
        other = AWKWARD[-1 - i]
        events.append(FileEvent(
            table, f"/d/{text}/{i}", text, BIG if i % 2 else 0, BIG - i, other,
            rows=i * 10**15, bytes=BIG if i % 3 else 1, error=text, run_id=other, stage=text,
            mark=BIG - 7 if i % 2 else i, seq=seq + i, table_uuid=other, replaced=text))
    return events


_STRINGS = ("uri", "identity", "state", "error", "run_id", "stage", "table_uuid", "replaced")
_INTS = ("size", "mtime_ns", "rows", "bytes", "mark", "seq")


def _stored(target: Target, table: str) -> list[tuple]:
    """Each stored row of `table`: its text columns' bytes (hex), its ints as text."""
    columns = ", ".join([*(f"hex({c}) AS {c}" for c in _STRINGS),
                         *(f"toString({c}) AS {c}" for c in _INTS)])
    rows = target.rows(f"SELECT {columns} FROM chload.files WHERE target_table = "
                       f"'{table}' ORDER BY seq")
    return [tuple(r[c] for c in (*_STRINGS, *_INTS)) for r in rows]


def _expected(events: list[FileEvent], uuid: str = "") -> list[tuple]:
    return [(*(str(getattr(e, c) or (uuid if c == "table_uuid" else "")).encode().hex().upper()
               for c in _STRINGS), *(str(getattr(e, c)) for c in _INTS)) for e in events]


def test_ledger_rows_store_awkward_values_as_the_json_encoder_did(target: Target) -> None:
    new, old = _events("t.new", 1000), _events("t.old", 1000)
    target.ledger.record(new)
    encode = json.JSONEncoder(ensure_ascii=False).encode  # (how every row was written)
    rows = [{k: getattr(e, k) for k in FileEvent.__dataclass_fields__} for e in old]
    target.command("INSERT INTO chload.files FORMAT JSONEachRow\n"
                   + "\n".join(encode(r) for r in rows) + "\n")

    stored = _stored(target, "t.new")
    assert len(stored) == len(AWKWARD)
    assert stored == _stored(target, "t.old") == _expected(new)


def test_ledger_rows_with_the_tables_mark_and_uuid_hold_the_same_values(
        target: Target, table_name: str) -> None:
    """A group's `committing` events logged with the table's mark (a few in the statement
    that reads it; more than it holds inline after reading it first), then `loaded` ones
    without a uuid of their own: the one stamped for the table."""
    table = f"default.{table_name}"
    target.text(f"CREATE TABLE {table} (x UInt8) ENGINE = MergeTree ORDER BY x", "TSV")
    try:
        target.command(f"INSERT INTO {table} VALUES (1)")
        top = int(target.rows(f"SELECT toUInt64(max(max_block_number)) AS m FROM "
                              f"system.parts WHERE active AND database = 'default' AND "
                              f"table = '{table_name}'")[0]["m"])
        committing = _events(table, 5000)
        for event in committing:
            event.state, event.mark = COMMITTING, event.mark % 1000
        target.ledger.record(committing[:5], mark_of=("default", table_name))  # inline
        target.ledger.record(committing[5:], mark_of=("default", table_name))
        marked = [FileEvent(**{**{k: getattr(e, k) for k in FileEvent.__dataclass_fields__},
                               "mark": e.mark + top}) for e in committing]

        target.ledger.stamp(table, "stamped-uuid")
        loaded = _events(table, 9000)
        for event in loaded:
            event.state, event.table_uuid = LOADED, ""
        target.ledger.record(loaded)

        assert _stored(target, table) == _expected(marked) + _expected(loaded, "stamped-uuid")
    finally:
        target.command(f"DROP TABLE IF EXISTS {table}")
