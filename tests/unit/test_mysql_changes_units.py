"""MySQL change capture without a server: binlog positions as one growing number, a row
as the TSV line the engine reads, which DDL names the followed table, and where a unit
of the binlog may end (between transactions only)."""

from __future__ import annotations

import io
from datetime import datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from pymysqlreplication import event as ev, row_event as rev

from chload.errors import UsageError
from chload.sources.changes import mysql_binlog, mysql_table
from chload.sources.changes.mysql_binlog import BinlogReader, Layout, layout_of, line


def test_positions_grow_along_the_log_and_come_back() -> None:
    a = mysql_table.position("binlog.000002", 4_000_000)
    b = mysql_table.position("binlog.000003", 4)
    assert a < b
    assert mysql_table.log_of(a, "binlog.000007") == ("binlog.000002", 4_000_000)
    assert mysql_table.log_of(b, "mysql-bin.000123") == ("mysql-bin.000003", 4)
    with pytest.raises(UsageError, match="no sequence number"):
        mysql_table.position("binlog", 4)


def test_a_row_is_the_servers_text_escaped_for_tsv() -> None:
    layout = layout_of([("id", "bigint(20) unsigned"), ("d", "decimal(12,3)"),
                        ("ts", "datetime(6)"), ("t", "datetime"), ("b", "blob"),
                        ("s", "text"), ("n", "int(11)")], ["id"])
    row = {"id": 18446744073709551615, "d": Decimal("1.500"),
           "ts": datetime(2024, 1, 2, 3, 4, 5, 1), "t": datetime(2024, 1, 2, 3, 4, 5),
           "b": b"\x00\xff\t\\", "s": "a\tb\nc 😀", "n": None}
    assert line(row, layout, 42, 1) == (
        b"18446744073709551615\t1.500\t2024-01-02 03:04:05.000001\t2024-01-02 03:04:05\t"
        b"\\0\xff\\t\\\\\ta\\tb\\nc \xf0\x9f\x98\x80\t\\N\t42\t1\n")


def test_a_time_is_hours_minutes_seconds_past_a_day() -> None:
    layout = layout_of([("t", "time(3)"), ("u", "time")], ["t"])
    row = {"t": timedelta(hours=30, microseconds=5000), "u": -timedelta(seconds=61)}
    assert line(row, layout, 1, 0) == b"30:00:00.005\t-00:01:01\t1\t0\n"


def test_ddl_of_the_followed_table_only() -> None:
    reader = object.__new__(BinlogReader)
    reader.schema, reader.table = "shop", "orders"
    assert reader._touches("ALTER TABLE orders ADD COLUMN x INT", b"shop")
    assert reader._touches("alter table `shop`.`orders` drop column x", b"other")
    assert reader._touches("TRUNCATE orders", "shop")
    assert not reader._touches("ALTER TABLE orders_old ADD COLUMN x INT", b"shop")
    assert not reader._touches("ALTER TABLE orders ADD COLUMN x INT", b"other")
    assert not reader._touches("CREATE TABLE my_orders (id INT)", b"shop")


# --------------------------------------------------------------------------- units

def _event(cls: type, log_pos: int, **fields: Any) -> Any:
    e = object.__new__(cls)
    e.packet = SimpleNamespace(log_pos=log_pos)
    for k, v in fields.items():
        if k == "rows":  # a property over the decoded rows (RowsEvent._RowsEvent__rows)
            k = "_RowsEvent__rows"
        setattr(e, k, v)
    return e


def _insert(log_pos: int, key: int) -> Any:
    return _event(rev.WriteRowsEvent, log_pos, schema="shop", table="orders",
                  rows=[{"values": {"id": key}}])


def _reader(events: list[Any]) -> BinlogReader:
    reader = object.__new__(BinlogReader)
    reader.schema, reader.table = "shop", "orders"
    reader.stream = SimpleNamespace(log_file="binlog.000001")
    reader.at = mysql_table.position("binlog.000001", 4)
    reader._events = iter(events)
    return reader


def _at(pos: int) -> int:
    return mysql_table.position("binlog.000001", pos)


def test_a_unit_ends_between_transactions_never_inside_one() -> None:
    events = [_insert(100, 1), _event(ev.XidEvent, 120),  # one transaction, one row
              _insert(200, 2), _insert(300, 3), _event(ev.XidEvent, 320),  # two rows
              _insert(400, 4), _event(ev.XidEvent, 420)]
    reader = _reader(events)
    layout = Layout(["id"], ["id"])
    first = io.BytesIO()
    cut = reader.unit(first, layout, 2, 60.0, None, lambda: False)
    assert (cut.end, cut.rows) == (_at(320), 3)  # the limit is met at a transaction's end
    assert first.getvalue().count(b"\n") == 3
    second = io.BytesIO()
    cut = reader.unit(second, layout, 2, 60.0, None, lambda: False)
    assert (cut.end, cut.rows, cut.exhausted) == (_at(420), 1, True)
    assert second.getvalue() == line({"id": 4}, layout, _at(400), 0)


def test_a_unit_out_of_time_still_ends_its_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000, 10))  # each look at the clock: 10 s later
    monkeypatch.setattr(mysql_binlog.time, "monotonic", lambda: float(next(clock)))
    events = [_insert(100, 1), _event(ev.XidEvent, 120), _insert(200, 2), _insert(300, 3),
              _event(ev.XidEvent, 320)]
    out = io.BytesIO()
    cut = _reader(events).unit(out, Layout(["id"], ["id"]), 1000, 25.0, None,
                               lambda: False)
    # the time is up while the second transaction is read: it is read to its end
    assert (cut.end, cut.rows) == (_at(320), 3)
    assert out.getvalue().count(b"\n") == 3


def test_a_unit_stops_before_ddl_of_its_table() -> None:
    events = [_insert(100, 1), _event(ev.XidEvent, 120),
              _event(ev.QueryEvent, 200, query="ALTER TABLE orders ADD c INT", schema=b"shop"),
              _insert(300, 2), _event(ev.XidEvent, 320)]
    reader = _reader(events)
    cut = reader.unit(io.BytesIO(), Layout(["id"], ["id"]), 1000, 60.0, None,
                      lambda: False)
    assert (cut.end, cut.rows, cut.ddl) == (_at(120), 1, "ALTER TABLE orders ADD c INT")


def test_an_update_that_moves_the_key_deletes_the_old_one() -> None:
    layout = Layout(["id", "v"], ["id"])
    moved = _event(rev.UpdateRowsEvent, 100, schema="shop", table="orders", rows=[
        {"before_values": {"id": 1, "v": "a"}, "after_values": {"id": 2, "v": "a"}},
        {"before_values": {"id": 3, "v": "a"}, "after_values": {"id": 3, "v": "b"}}])
    assert mysql_binlog._lines(moved, layout, 9) == [b"1\ta\t9\t1\n", b"2\ta\t9\t0\n",
                                                     b"3\tb\t9\t0\n"]


@pytest.mark.parametrize("awaited, expected", [(True, (120, 1)), (False, (220, 2))])
def test_a_unit_past_its_time_grows_while_the_commit_before_it_runs(
        monkeypatch: pytest.MonkeyPatch, awaited: bool, expected: tuple[int, int]) -> None:
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(mysql_binlog.time, "monotonic", lambda: float(next(clock)))
    events = [_insert(100, 1), _event(ev.XidEvent, 120), _insert(200, 2),
              _event(ev.XidEvent, 220)]
    cut = _reader(events).unit(io.BytesIO(), Layout(["id"], ["id"]), 1000, 5.0, None,
                               lambda: False, lambda: awaited)
    assert (cut.end, cut.rows) == (_at(expected[0]), expected[1])


def test_the_lag_of_a_follow_sums_the_binlog_files_between_its_position_and_the_servers() -> None:
    from chload.sources.changes.mysql_status import lag_bytes

    logs = [("binlog.000003", 1000), ("binlog.000004", 500), ("binlog.000005", 70)]
    assert lag_bytes(logs, ("binlog.000005", 30), ("binlog.000005", 70)) == 40
    assert lag_bytes(logs, ("binlog.000003", 400), ("binlog.000005", 70)) == 600 + 500 + 70
    # a file purged since: its rest is unknown, the files kept after it count
    assert lag_bytes(logs[1:], ("binlog.000003", 400), ("binlog.000005", 70)) == 500 + 70
