"""The ledger's rows of JSON (tables.json_rows, a format a row) are byte for byte what
json's encoder wrote of each event as a dict, and a value of another type than its
column's goes through that encoder still."""

from __future__ import annotations

import json

from chload.commit.ledger import FileEvent, Ledger

_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
_FIELDS = tuple(FileEvent.__dataclass_fields__)


class _Sql:
    def __init__(self) -> None:
        self.commands: list[str] = []

    def command(self, sql: str) -> None:
        self.commands.append(sql)

    def rows(self, sql: str) -> list[dict]:
        return [{"mark": "40"}]  # the table's mark (a group logged with it)

    def binary(self, sql: str, fmt: str) -> bytes:
        return b""


def _as_json_encoder_wrote(events: list[FileEvent], uuids: dict[str, str] | None = None,
                           top: int = 0) -> str:
    rows = []
    for e in events:
        row = {k: getattr(e, k) for k in _FIELDS}
        row["table_uuid"] = row["table_uuid"] or (uuids or {}).get(e.target_table, "")
        row["mark"] = row["mark"] + top if top else row["mark"]
        rows.append(_ENCODE(row))
    return "INSERT INTO chload.files FORMAT JSONEachRow\n" + "\n".join(rows) + "\n"


def _events() -> list[FileEvent]:
    texts = ['q"uote', "back\\slash", "new\nline\r", "\t", "nul\x00", "\x01\x1f\x7f", "é日🦆",
             "\\xe9", "\u2028", "", "'"]
    return [FileEvent(t, f"/d/{t}", t[::-1], 2**64 - 1, i, t, rows=10**30, error=t,
                      run_id=t, stage=t, mark=i, seq=i, table_uuid=t if i % 2 else "",
                      replaced=t) for i, t in enumerate(texts)]


def test_rows_are_what_the_json_encoder_wrote() -> None:
    sql = _Sql()
    ledger = Ledger(sql)
    uuids = {e.target_table: f"uuid of {e.target_table}" for e in _events()[::2]}
    for table, uuid in uuids.items():  # (events without a uuid of their own get these)
        ledger.stamp(table, uuid)
    ledger.record(_events())
    assert sql.commands == [_as_json_encoder_wrote(_events(), uuids)]
    assert "uuid of" in sql.commands[0]


def test_rows_with_a_mark_read_first_add_it() -> None:
    sql = _Sql()
    events = _events() * 2  # more than a statement holds inline
    Ledger(sql).record(events, mark_of=("db", "t"))
    assert sql.commands == [_as_json_encoder_wrote(events, top=40)]


def test_a_value_of_another_type_goes_through_the_json_encoder() -> None:
    for field, value in (("size", True), ("rows", 1.5), ("mark", "7"), ("uri", 12),
                         ("error", None)):
        sql = _Sql()
        events = _events()
        setattr(events[3], field, value)
        Ledger(sql).record(events)
        assert sql.commands == [_as_json_encoder_wrote(events)], field
