"""A binlog row image read straight into TSV fields: one reader per column, made once per
table map (a table map repeats, byte for byte, before each statement of the table: its
readers are kept by those bytes), no dict or Python value per row.

Each reader takes the event's bytes and an offset and returns the field's TSV text and the
next offset: the server's text of the value (as the copy's SELECT prints it: a DECIMAL's
digits, a DATETIME(n) with n fractional digits), escaped for TSV; a zero date is NULL.
The table map's column metadata (types, signedness, character sets, ENUM/SET values,
names) is read by mysql-replication's TableMapEvent (binlog_row_metadata=FULL).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from typing import Any

from chload.errors import SourceError

Reader = Callable[[bytes, int], tuple[bytes, int]]
NULL = b"\\N"
_NEEDS_ESCAPE = re.compile(rb"[\\\t\n\r\0]")
_ESCAPES = ((b"\\", b"\\\\"), (b"\t", b"\\t"), (b"\n", b"\\n"), (b"\r", b"\\r"),
            (b"\0", b"\\0"))
_UTF8 = {None, "utf8", "utf8mb3", "utf8mb4", "binary", "ascii"}
_DIGITS = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes of a DECIMAL's leftover digits
_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # (a 29 February: datetime)
# the binlog's column types (mysql's enum_field_types)
TINY, SHORT, LONG, FLOAT, DOUBLE, TIMESTAMP, LONGLONG, INT24, DATE, TIME, DATETIME, YEAR = (
    1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13)
VARCHAR, BIT, TIMESTAMP2, DATETIME2, TIME2, JSON = 15, 16, 17, 18, 19, 245
NEWDECIMAL, ENUM, SET, BLOBS, VAR_STRING, STRING, GEOMETRY = (
    246, 247, 248, (249, 250, 251, 252), 253, 254, 255)


def escaped(raw: bytes) -> bytes:
    if _NEEDS_ESCAPE.search(raw) is None:
        return raw
    for a, b in _ESCAPES:
        raw = raw.replace(a, b)
    return raw


def _fixed(fmt: str) -> Reader:
    unpack, size = struct.Struct(fmt).unpack_from, struct.calcsize(fmt)

    def read(b: bytes, p: int) -> tuple[bytes, int]:
        return b"%d" % unpack(b, p)[0], p + size
    read.fixed = fmt[1:]  # type: ignore[attr-defined]  # (Image._compiled)
    return read


def _real(fmt: str) -> Reader:
    unpack, size = struct.Struct(fmt).unpack_from, struct.calcsize(fmt)

    def read(b: bytes, p: int) -> tuple[bytes, int]:
        return repr(unpack(b, p)[0]).encode(), p + size
    return read


def _int24(signed: bool) -> Reader:
    def read(b: bytes, p: int) -> tuple[bytes, int]:
        return b"%d" % int.from_bytes(b[p:p + 3], "little", signed=signed), p + 3
    return read


def _decimal(precision: int, scale: int) -> Reader:
    """MySQL's packed DECIMAL: groups of 9 digits in 4 big-endian bytes, the leftover
    digits in fewer, the sign in the first bit (a negative value's bytes inverted)."""
    whole = precision - scale
    head, full = _DIGITS[whole % 9], whole // 9
    frac_full, tail, tail_digits = scale // 9, _DIGITS[scale % 9], scale % 9
    size = head + 4 * full + 4 * frac_full + tail
    ones = (1 << (8 * size)) - 1

    seen: dict[bytes, bytes] = {}  # values repeat (prices, quantities): each read once

    def read(b: bytes, p: int) -> tuple[bytes, int]:
        raw = b[p:p + size]
        found = seen.get(raw)
        if found is not None:
            return found, p + size
        if len(seen) > 4096:
            seen.clear()
        seen[raw] = text = _packed(raw)
        return text, p + size

    def _packed(raw: bytes) -> bytes:
        value = int.from_bytes(raw, "big") ^ (1 << (8 * size - 1))
        negative = not raw[0] & 0x80
        if negative:
            value ^= ones
        raw = value.to_bytes(size, "big")
        at = head
        number = int.from_bytes(raw[:head], "big")
        for _ in range(full):
            number = number * 1_000_000_000 + int.from_bytes(raw[at:at + 4], "big")
            at += 4
        text = b"-%d" % number if negative else b"%d" % number
        if scale:
            parts = []
            for _ in range(frac_full):
                parts.append(b"%09d" % int.from_bytes(raw[at:at + 4], "big"))
                at += 4
            if tail:
                parts.append(b"%0*d" % (tail_digits, int.from_bytes(raw[at:], "big")))
            text += b"." + b"".join(parts)
        return text
    return read


def _fraction(fsp: int) -> tuple[int, Callable[[bytes], int]]:
    """(bytes, microseconds of them) of a DATETIME2/TIME2/TIMESTAMP2 fraction."""
    size = (fsp + 1) // 2

    def micros(raw: bytes) -> int:
        value = int.from_bytes(raw, "big")
        return (value // 10 if fsp % 2 else value) * 10 ** (6 - fsp)
    return size, micros


def _datetime_text(value: datetime, fsp: int) -> bytes:
    raw = value.strftime("%Y-%m-%d %H:%M:%S").encode()
    return raw + b"." + (b"%06d" % value.microsecond)[:fsp] if fsp else raw


def _datetime2(fsp: int) -> Reader:
    size, micros = _fraction(fsp)

    minutes: dict[int, bytes] = {}  # the text up to its minute: shared by many rows

    def read(b: bytes, p: int) -> tuple[bytes, int]:
        v = int.from_bytes(b[p:p + 5], "big")
        head = minutes.get(v >> 6)
        if head is not None:
            text = head + b"%02d" % (v & 63)
            if fsp:
                text += b"." + (b"%06d" % micros(b[p + 5:p + 5 + size]))[:fsp]
            return text, p + 5 + size
        ym = (v >> 22) & 0x1FFFF
        year, month, day = ym // 13, ym % 13, (v >> 17) & 31
        hour, minute, second = (v >> 12) & 31, (v >> 6) & 63, v & 63
        us = micros(b[p + 5:p + 5 + size]) if size else 0
        if year >= 1000 and 1 <= month <= 12 and 1 <= day <= _DAYS[month] and (
                hour < 24 and minute < 60 and second < 60):
            if len(minutes) > 4096:
                minutes.clear()
            minutes[v >> 6] = b"%04d-%02d-%02d %02d:%02d:" % (year, month, day, hour, minute)
            text = b"%04d-%02d-%02d %02d:%02d:%02d" % (year, month, day, hour, minute, second)
            if fsp:
                text += b"." + (b"%06d" % us)[:fsp]
            return text, p + 5 + size
        try:
            value = datetime(year, month, day, hour, minute, second, us)
        except ValueError:  # a zero date
            return NULL, p + 5 + size
        return _datetime_text(value, fsp), p + 5 + size
    return read


def _timestamp2(fsp: int) -> Reader:
    size, micros = _fraction(fsp)

    def read(b: bytes, p: int) -> tuple[bytes, int]:
        value = datetime.utcfromtimestamp(int.from_bytes(b[p:p + 4], "big"))
        if size:
            value = value.replace(microsecond=micros(b[p + 4:p + 4 + size]))
        return _datetime_text(value, fsp), p + 4 + size
    return read


def _date(b: bytes, p: int) -> tuple[bytes, int]:
    v = int.from_bytes(b[p:p + 3], "little")
    try:
        return date(v >> 9, (v >> 5) & 15, v & 31).isoformat().encode(), p + 3
    except ValueError:  # a zero date
        return NULL, p + 3


def _time2(fsp: int) -> Reader:
    """[-]H:MM:SS[.fraction], hours past 24 (the server's text of a TIME)."""
    size, micros = _fraction(fsp)

    def read(b: bytes, p: int) -> tuple[bytes, int]:
        v = int.from_bytes(b[p:p + 3], "big")
        sign = 1
        if not v & 0x800000:
            sign, v = -1, (~v + 1) & 0xFFFFFF
        us = micros(b[p + 3:p + 3 + size]) if size else 0
        value = timedelta(hours=(v >> 12) & 0x3FF, minutes=(v >> 6) & 63, seconds=v & 63,
                          microseconds=us) * sign
        total = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        sign_text, total = ("-" if total < 0 else ""), abs(total)
        seconds, fraction = divmod(total, 1_000_000)
        hours, rest = divmod(seconds, 3600)
        text = f"{sign_text}{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
        if fsp:
            text += f".{fraction:06d}"[:fsp + 1]
        return text.encode(), p + 3 + size
    return read


def _string(prefix: int, encoding: str | None) -> Reader:
    def read(b: bytes, p: int) -> tuple[bytes, int]:
        n = int.from_bytes(b[p:p + prefix], "little")
        start = p + prefix
        raw = b[start:start + n]
        if encoding is not None:
            raw = raw.decode(encoding).encode("utf-8", "surrogateescape")
        return escaped(raw), start + n
    if encoding is None:
        read.prefix = prefix  # type: ignore[attr-defined]  # (Image._compiled)
    read.text = (prefix, encoding)  # type: ignore[attr-defined]  # (mysql_binlog_native)
    return read


def _choice(size: int, values: Sequence[str] | None, many: bool) -> Reader:
    """An ENUM's value (its index, 0: '') or a SET's (a bit per value), by name."""
    names = [escaped(str(v).encode()) for v in values or ()]

    def read(b: bytes, p: int) -> tuple[bytes, int]:
        n = int.from_bytes(b[p:p + size], "little")
        if many:
            found = sorted(v for i, v in enumerate(names) if n >> i & 1)
            return (b",".join(found) if found else NULL), p + size
        return (names[n] if n < len(names) else b""), p + size
    return read


def _json(size: int) -> Reader:
    """MySQL's binary JSON (MariaDB's JSON is text), as JSON text: mysql-replication's
    parser, then its values as MySQL prints them (`{"a": [1, 2.5]}`)."""
    import json

    from pymysqlreplication.json_binary import parse_json

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {(k.decode() if isinstance(k, bytes) else k): plain(v)
                    for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value.decode() if isinstance(value, bytes) else value

    def read(b: bytes, p: int) -> tuple[bytes, int]:
        n = int.from_bytes(b[p:p + size], "little")
        start = p + size
        if not n:
            return NULL, start
        value = plain(parse_json(b[start], b[start + 1:start + n]))
        return escaped(json.dumps(value, ensure_ascii=False, default=str).encode()), start + n
    return read


def _bit(size: int) -> Reader:
    def read(b: bytes, p: int) -> tuple[bytes, int]:
        return b"%d" % int.from_bytes(b[p:p + size], "big"), p + size
    return read


def _year(b: bytes, p: int) -> tuple[bytes, int]:
    return b"%d" % (b[p] + 1900 if b[p] else 0), p + 1


def reader_of(column: Any, where: str) -> Reader:
    """One column's reader, from mysql-replication's Column of a table map."""
    t, unsigned = column.type, getattr(column, "unsigned", False)
    ints = {TINY: ("<B", "<b"), SHORT: ("<H", "<h"), LONG: ("<I", "<i"),
            LONGLONG: ("<Q", "<q")}
    if t in ints:
        return _fixed(ints[t][0 if unsigned else 1])
    if t == INT24:
        return _int24(not unsigned)
    if t in (FLOAT, DOUBLE):
        return _real("<f" if t == FLOAT else "<d")
    if t == NEWDECIMAL:
        return _decimal(column.precision, column.decimals)
    if t == DATETIME2:
        return _datetime2(column.fsp)
    if t == TIMESTAMP2:
        return _timestamp2(column.fsp)
    if t == TIME2:
        return _time2(column.fsp)
    if t == DATE:
        return _date
    if t == YEAR:
        return _year
    if t in (VARCHAR, VAR_STRING, STRING):
        return _string(2 if column.max_length > 255 else 1, _encoding(column))
    if t in BLOBS or t == GEOMETRY:
        return _string(column.length_size, _encoding(column))
    if t in (ENUM, SET):
        return _choice(column.size, column.enum_values if t == ENUM else column.set_values,
                       t == SET)
    if t == BIT:
        return _bit(column.bytes)
    if t == JSON:
        return _json(column.length_size)
    raise SourceError(f"{where}: column {column.name} has binlog type {t} (a DATETIME, "
                      "TIME or TIMESTAMP of the format before MySQL 5.6), which change "
                      "capture does not read; ALTER the column to a current type")


def _encoding(column: Any) -> str | None:
    """The codec to turn a text column's bytes into UTF-8 (None: they are already, or
    binary). mysql-replication names it as Python does (latin1: cp1252); a MySQL name is
    looked up by pymysql."""
    import codecs

    name = getattr(column, "character_set_name", None)
    if name in _UTF8:
        return None
    try:
        codec: str | None = codecs.lookup(str(name)).name
    except LookupError:
        from pymysql.charset import charset_by_name

        found = charset_by_name(name)
        codec = found.encoding if found else None
    return None if codec in (None, "utf-8") else codec


class Image:
    """A table map's columns, as readers, and its rows events read into TSV lines."""

    def __init__(self, columns: Sequence[Any], where: str) -> None:
        self.columns = list(columns)  # (mysql_binlog_native.kinds)
        self.names = [c.name for c in columns]
        self.readers = [reader_of(c, where) for c in columns]
        self.where = where
        count = len(columns)
        self._every = (1 << count) - 1  # (a null bitmap's spare bits may be set)
        self._width = (count + 7) // 8
        # a rows event's column count and bitmaps of every column, as the server writes
        bitmap = self._every.to_bytes(self._width, "little")
        self._heads = {n: bytes([count]) + bitmap * n for n in (1, 2)} if count < 251 else {}
        self._names: Sequence[str] | None = None
        self._key: Sequence[str] | None = None
        self._places: list[int] | None = None
        self._keys: list[int] = []
        self._fast = self._compiled()
        self._orders: dict[tuple[tuple[str, ...], tuple[str, ...]],
                           tuple[list[int] | None, list[int]]] = {}

    def order(self, names: Sequence[str], key: Sequence[str]
              ) -> tuple[list[int] | None, list[int]]:
        """Where each of the table's columns is in the image (None: in its order), and
        the key's places."""
        found = self._orders.get((tuple(names), tuple(key)))
        if found is None:
            if None in self.names:  # no names in the binlog: the image is in table order
                places = list(range(len(names)))
            else:
                places = [self.names.index(n) if n in self.names else -1 for n in names]
            same = places == list(range(len(self.names)))
            keys = [places[names.index(k)] for k in key if k in names]
            found = self._orders[(tuple(names), tuple(key))] = (None if same else places,
                                                                keys)
        return found

    def row(self, b: bytes, p: int, nulls: int) -> tuple[list[bytes], int]:
        if not int.from_bytes(b[p:p + nulls], "little") & self._every:
            return self._fast(b, p + nulls)
        nullmap = b[p:p + nulls]
        p += nulls
        fields = []
        for i, read in enumerate(self.readers):
            if nullmap[i >> 3] >> (i & 7) & 1:
                fields.append(NULL)
            else:
                value, p = read(b, p)
                fields.append(value)
        return fields, p

    def _compiled(self) -> Callable[[bytes, int], tuple[list[bytes], int]]:
        """A row without NULLs read by straight-line code: runs of fixed-size integers
        by one struct, UTF-8 strings sliced in place, the other columns by their reader."""
        scope: dict[str, Any] = {"escaped": escaped, "search": _NEEDS_ESCAPE.search}
        code, names = ["def fast(b, p):"], []
        i, count = 0, len(self.readers)
        while i < count:
            read = self.readers[i]
            fixed = getattr(read, "fixed", None)
            if fixed is not None:
                fmt, run = "<", []
                while i < count and getattr(self.readers[i], "fixed", None) is not None:
                    fmt += self.readers[i].fixed  # type: ignore[attr-defined]
                    run.append(f"v{i}")
                    i += 1
                scope[f"s{i}"] = struct.Struct(fmt).unpack_from
                code.append(f"    {', '.join(run)}, = s{i}(b, p)")
                code.append(f"    p += {struct.calcsize(fmt)}")
                names += [f'b"%d" % {v}' for v in run]
                continue
            prefix = getattr(read, "prefix", None)
            if prefix is not None:
                code.append(f"    n = int.from_bytes(b[p:p + {prefix}], 'little')"
                            if prefix > 1 else "    n = b[p]")
                code.append(f"    v{i} = b[p + {prefix}:p + {prefix} + n]")
                code.append(f"    p += {prefix} + n")
                code.append(f"    if search(v{i}) is not None: v{i} = escaped(v{i})")
            else:
                scope[f"r{i}"] = read
                code.append(f"    v{i}, p = r{i}(b, p)")
            names.append(f"v{i}")
            i += 1
        code.append(f"    return [{', '.join(names)}], p")
        exec("\n".join(code), scope)  # noqa: S102 - code made here, from column types
        return scope["fast"]

    def lines(self, b: bytes, p: int, end: int, kind: str, names: Sequence[str],
              key: Sequence[str], version: int) -> list[bytes]:
        """A rows event's body from its column count on, as TSV lines (see mysql_binlog):
        `kind` write, update or delete."""
        width, row = self._width, self.row
        images = 2 if kind == "update" else 1
        head = b[p:p + 1 + images * width]
        if head == self._heads.get(images):
            p += len(head)
        else:  # (251 columns or more, spare bits of the bitmap set, or not FULL)
            p = self._check(b, p, images)
        if names is not self._names or key is not self._key:
            self._places, self._keys = self.order(names, key)
            self._names, self._key = names, key
        places, keys = self._places, self._keys
        keep, gone = b"\t%d\t0\n" % version, b"\t%d\t1\n" % version
        out = []
        join = b"\t".join
        while p < end:
            fields, p = row(b, p, width)
            if kind == "update":
                after, p = row(b, p, width)
                if any(fields[k] != after[k] for k in keys):
                    out.append((join(fields) if places is None else join(
                        [fields[i] if i >= 0 else NULL for i in places])) + gone)
                fields = after
            out.append((join(fields) if places is None else join(
                [fields[i] if i >= 0 else NULL for i in places]))
                + (gone if kind == "delete" else keep))
        return out

    def _check(self, b: bytes, p: int, images: int) -> int:
        """A rows event must have every column in each image (binlog_row_image=FULL):
        where its rows start."""
        count, p = lenenc(b, p)
        width, every = (count + 7) // 8, (1 << count) - 1
        if count != len(self.readers) or any(
                int.from_bytes(b[p + i * width:p + (i + 1) * width], "little") & every
                != every for i in range(images)):
            raise SourceError(f"{self.where}: a rows event without every column: the "
                              "binlog needs binlog_row_image=FULL (set it, restart the "
                              "server, and load again into a new --table)")
        return p + images * width


def lenenc(b: bytes, p: int) -> tuple[int, int]:
    """A length-encoded integer at `p`: (value, next offset)."""
    first = b[p]
    if first < 251:
        return first, p + 1
    size = {252: 2, 253: 3, 254: 8}[first]
    return int.from_bytes(b[p + 1:p + 1 + size], "little"), p + 1 + size
