"""MySQL change capture without a server: binlog positions as one growing number, a row
as the TSV line the engine reads, which DDL names the followed table, and where a unit
of the binlog may end (between transactions only)."""

from __future__ import annotations

import io
import struct
from types import SimpleNamespace
from typing import Any

import pytest

from chload.errors import SourceError, UsageError
from chload.sources.changes import mysql_binlog, mysql_rows as mr, mysql_table
from chload.sources.changes.mysql_binlog import BinlogReader, Layout
from chload.sources.changes.mysql_rows import Image


def test_positions_grow_along_the_log_and_come_back() -> None:
    a = mysql_table.position("binlog.000002", 4_000_000)
    b = mysql_table.position("binlog.000003", 4)
    assert a < b
    assert mysql_table.log_of(a, "binlog.000007") == ("binlog.000002", 4_000_000)
    assert mysql_table.log_of(b, "mysql-bin.000123") == ("mysql-bin.000003", 4)
    with pytest.raises(UsageError, match="no sequence number"):
        mysql_table.position("binlog", 4)


def _col(name: str, typ: int, **meta: Any) -> Any:
    return SimpleNamespace(**{"name": name, "type": typ, "unsigned": False,
                              "character_set_name": None, **meta})


def _datetime2(y: int, mo: int, d: int, h: int, mi: int, s: int) -> bytes:
    v = 1 << 39 | (y * 13 + mo) << 22 | d << 17 | h << 12 | mi << 6 | s
    return v.to_bytes(5, "big")


def _rows(*rows: bytes, count: int, images: int = 1) -> bytes:
    """A rows event's body from its column count: every column present."""
    width = (count + 7) // 8
    every = ((1 << count) - 1).to_bytes(width, "little")
    return bytes([count]) + every * images + b"".join(rows)


def test_a_row_image_is_the_servers_text_escaped_for_tsv() -> None:
    columns = [_col("id", mr.LONGLONG), _col("d", mr.NEWDECIMAL, precision=12, decimals=3),
               _col("ts", mr.DATETIME2, fsp=6), _col("t", mr.DATETIME2, fsp=0),
               _col("b", 252, length_size=2), _col("s", mr.VARCHAR, max_length=400),
               _col("n", mr.LONG), _col("z", mr.DATETIME2, fsp=0)]
    columns[0].unsigned = True
    text = "a\tb\nc 😀".encode()
    image = (bytes([0b01000000]) + struct.pack("<Q", 2**64 - 1)
             + bytes.fromhex("80000001 01F4")  # 1.500
             + _datetime2(2024, 1, 2, 3, 4, 5) + (1).to_bytes(3, "big")
             + _datetime2(2024, 1, 2, 3, 4, 5) + struct.pack("<H", 4) + b"\x00\xff\t\\"
             + struct.pack("<H", len(text)) + text + _datetime2(0, 0, 0, 0, 0, 0))
    negative = (bytes([0b01000000]) + struct.pack("<Q", 7) + bytes.fromhex("7FFFFFFE FE0B")
                + _datetime2(999, 12, 31, 0, 0, 0) + bytes(3) + _datetime2(2024, 2, 29, 0, 0, 0)
                + struct.pack("<H", 0) + struct.pack("<H", 0) + _datetime2(2024, 1, 1, 0, 0, 0))
    body = _rows(image, negative, count=8)
    lines = Image(columns, "t").lines(body, 0, len(body), "delete",
                                      [c.name for c in columns], ["id"], 42)
    assert lines == [
        b"18446744073709551615\t1.500\t2024-01-02 03:04:05.000001\t2024-01-02 03:04:05\t"
        b"\\0\xff\\t\\\\\ta\\tb\\nc \xf0\x9f\x98\x80\t\\N\t\\N\t42\t1\n",
        b"7\t-1.500\t999-12-31 00:00:00.000000\t2024-02-29 00:00:00\t\t\t\\N\t"
        b"2024-01-01 00:00:00\t42\t1\n"]


def test_a_time_is_hours_minutes_seconds_past_a_day() -> None:
    columns = [_col("t", mr.TIME2, fsp=3), _col("u", mr.TIME2, fsp=0)]
    image = (b"\x00" + (0x800000 | 30 << 12).to_bytes(3, "big") + (50).to_bytes(2, "big")
             + (0x800000 - 65).to_bytes(3, "big"))
    body = _rows(image, count=2)
    assert Image(columns, "t").lines(body, 0, len(body), "write", ["t", "u"], ["t"], 1) == [
        b"30:00:00.005\t-00:01:01\t1\t0\n"]


def test_a_table_of_251_columns_or_more_has_a_longer_column_count() -> None:
    columns = [_col(f"c{i}", mr.LONG) for i in range(260)]
    width = (260 + 7) // 8
    body = (b"\xfc" + (260).to_bytes(2, "little") + ((1 << 260) - 1).to_bytes(width, "little")
            + bytes(width) + b"".join(struct.pack("<i", i) for i in range(260)))
    line = Image(columns, "t").lines(body, 0, len(body), "write",
                                     [c.name for c in columns], ["c0"], 5)
    assert line == [b"\t".join(b"%d" % i for i in range(260)) + b"\t5\t0\n"]


def test_a_column_the_reader_cannot_read_is_one_line() -> None:
    with pytest.raises(SourceError, match="column t has binlog type 12"):
        Image([_col("t", mr.DATETIME)], "binlog of shop.t")


def test_mysqls_binary_json_is_its_text() -> None:
    # {"a": [1, "x"]}: a small object of one key, its value a small array
    array = bytes([2, 0, 12, 0, 5, 1, 0, 0xC, 10, 0, 1]) + b"x"  # 1 inline, "x" at 10
    value = bytes([1, 0, 24, 0, 11, 0, 1, 0, 2, 12, 0]) + b"a" + array  # key at 11
    body = _rows(b"\x00" + struct.pack("<I", len(value) + 1) + b"\x00" + value, count=1)
    lines = Image([_col("j", mr.JSON, length_size=4)], "t").lines(
        body, 0, len(body), "write", ["j"], ["j"], 1)
    assert lines == [b'{"a": [1, "x"]}\t1\t0\n']


def test_text_of_a_latin1_or_gbk_column_is_turned_into_utf8() -> None:
    # mysql-replication names a column's codec as Python does (latin1: cp1252)
    columns = [_col("l", mr.VARCHAR, max_length=20, character_set_name="cp1252"),
               _col("g", mr.VARCHAR, max_length=20, character_set_name="gbk"),
               _col("u", mr.VARCHAR, max_length=20, character_set_name="utf8")]
    values = ["caf\u00e9 \u20ac".encode("cp1252"), "\u4e2d".encode("gbk"), "\u00e9".encode()]
    body = _rows(b"\x00" + b"".join(bytes([len(v)]) + v for v in values), count=3)
    assert Image(columns, "t").lines(body, 0, len(body), "write", ["l", "g", "u"], ["l"],
                                     1) == ["caf\u00e9 \u20ac\t\u4e2d\t\u00e9\t1\t0\n".encode()]


def test_a_rows_event_without_every_column_is_refused() -> None:
    body = bytes([2, 0b01]) + b"\x00" + struct.pack("<i", 1)
    with pytest.raises(SourceError, match="binlog_row_image=FULL"):
        Image([_col("a", mr.LONG), _col("b", mr.LONG)], "t").lines(
            body, 0, len(body), "write", ["a", "b"], ["a"], 1)


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

class _Image:
    """Rows events as their keys (the unit's logic only counts lines)."""

    def lines(self, data: list[int], first: int, last: int, kind: str, names: Any,
              key: Any, version: int) -> list[bytes]:
        return [b"%d\t%d\t0\n" % (k, version) for k in data]


def _insert(log_pos: int, key: int) -> Any:
    return ("rows", _at(log_pos), (_Image(), "write", [key], 0, 0))


def _xid(log_pos: int) -> Any:
    return ("xid", _at(log_pos), None)


def _reader(events: list[Any]) -> BinlogReader:
    reader = object.__new__(BinlogReader)
    reader.schema, reader.table = "shop", "orders"
    reader.at = mysql_table.position("binlog.000001", 4)
    reader._events = iter(events)
    return reader


def _at(pos: int) -> int:
    return mysql_table.position("binlog.000001", pos)


def test_a_unit_ends_between_transactions_never_inside_one() -> None:
    events = [_insert(100, 1), _xid(120),  # one transaction, one row
              _insert(200, 2), _insert(300, 3), _xid(320),  # two rows
              _insert(400, 4), _xid(420)]
    reader = _reader(events)
    layout = Layout(["id"], ["id"])
    first = io.BytesIO()
    cut = reader.unit(first, layout, 2, 60.0, None, lambda: False)
    assert (cut.end, cut.rows) == (_at(320), 3)  # the limit is met at a transaction's end
    assert first.getvalue().count(b"\n") == 3
    second = io.BytesIO()
    cut = reader.unit(second, layout, 2, 60.0, None, lambda: False)
    assert (cut.end, cut.rows, cut.exhausted) == (_at(420), 1, True)
    assert second.getvalue() == b"4\t%d\t0\n" % _at(400)


def test_a_unit_out_of_time_still_ends_its_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000, 10))  # each look at the clock: 10 s later
    monkeypatch.setattr(mysql_binlog.time, "monotonic", lambda: float(next(clock)))
    events = [_insert(100, 1), _xid(120), _insert(200, 2), _insert(300, 3), _xid(320)]
    out = io.BytesIO()
    cut = _reader(events).unit(out, Layout(["id"], ["id"]), 1000, 25.0, None,
                               lambda: False)
    # the time is up while the second transaction is read: it is read to its end
    assert (cut.end, cut.rows) == (_at(320), 3)
    assert out.getvalue().count(b"\n") == 3


def test_a_connection_dropped_inside_a_transaction_reads_it_again_once() -> None:
    events = [_insert(100, 1), _xid(120), _insert(200, 2),
              ("restart", _at(120), None),  # connected again from the last whole transaction
              _insert(200, 2), _insert(300, 3), _xid(320)]
    out = io.BytesIO()
    cut = _reader(events).unit(out, Layout(["id"], ["id"]), 1000, 60.0, None, lambda: False)
    assert (cut.end, cut.rows) == (_at(320), 3)
    assert [line.split(b"\t")[0] for line in out.getvalue().splitlines()] == [b"1", b"2", b"3"]


def test_a_unit_stops_before_ddl_of_its_table() -> None:
    events = [_insert(100, 1), _xid(120),
              ("query", _at(200), ("ALTER TABLE orders ADD c INT", "shop")),
              _insert(300, 2), _xid(320)]
    reader = _reader(events)
    cut = reader.unit(io.BytesIO(), Layout(["id"], ["id"]), 1000, 60.0, None,
                      lambda: False)
    assert (cut.end, cut.rows, cut.ddl) == (_at(120), 1, "ALTER TABLE orders ADD c INT")


def test_an_update_that_moves_the_key_deletes_the_old_one() -> None:
    columns = [_col("id", mr.LONG), _col("v", mr.VARCHAR, max_length=10)]

    def row(key: int, v: bytes) -> bytes:
        return b"\x00" + struct.pack("<i", key) + bytes([len(v)]) + v

    body = _rows(row(1, b"a"), row(2, b"a"), row(3, b"a"), row(3, b"b"), count=2, images=2)
    image = Image(columns, "t")
    assert image.lines(body, 0, len(body), "update", ["id", "v"], ["id"], 9) == [
        b"1\ta\t9\t1\n", b"2\ta\t9\t0\n", b"3\tb\t9\t0\n"]
    # the table's columns in another order than the binlog's
    assert image.lines(body, 0, len(body), "update", ["v", "id"], ["id"], 9)[0] == (
        b"a\t1\t9\t1\n")


@pytest.mark.parametrize("awaited, expected", [(True, (120, 1)), (False, (220, 2))])
def test_a_unit_past_its_time_grows_while_the_commit_before_it_runs(
        monkeypatch: pytest.MonkeyPatch, awaited: bool, expected: tuple[int, int]) -> None:
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(mysql_binlog.time, "monotonic", lambda: float(next(clock)))
    events = [_insert(100, 1), _xid(120), _insert(200, 2), _xid(220)]
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
