"""Values a column cannot hold, found in the start of a text file before it loads.

ClickHouse's text formats store such a value as another without a word (NULL as the
type's default, `300` into UInt8 as 44, an out-of-range date clamped, `1.239` into
Decimal(10, 2) as 1.23), and the error budget never sees them: they parse. So the start
of a local CSV/TSV/JSON-lines file (16 KB, decompressed) is held against the table's
types, and a value that does not fit fails that file alone, naming the line, column,
value and what to change. docs/reading-files.md ("Values a column cannot hold") lists
the cases and what is checked where.

A clean start costs a few substring searches (over many files' starts at once:
check_many); only one that may hold a misfit is split into values. `--setting
input_format_null_as_default=1` (or the CSV empty-as-default setting) means defaults
for NULL are wanted: then NULLs are not refused.
"""

from __future__ import annotations

import csv
import functools
import json
import re
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from chload.core.reading.heads import by_format
from chload.core.reading.ranges import CHDB, bounds, wider
from chload.core.reading.sniff import BOM, _unescape_tsv, delimiter, start, starts
from chload.formats import JSON_LINES, FileFormat
from chload.schema import Column, bare_type, quote_ident, quote_str
from chload.sources.base import SourceFile

_INT = re.compile(r"^(U?)Int(8|16|32|64|128|256)$")
_DECIMAL = re.compile(r"^Decimal(?:(32|64|128|256)\((\d+)\)|\((\d+),\s*(\d+)\))$")
_DIGITS = re.compile(r"^\s*[-+]?\d+\s*$")
# (`0000-00-00`, ClickHouse's own zero date as 18.16 writes it, reads back as that zero.)
_DATE = re.compile(r"^\s*(\d{4})-(\d{2})-(\d{2})")
SAMPLE = 1 << 14  # bytes of a file checked (decompressed): see the module doc
_FLOAT32_MAX = 3.4028234663852886e38
_WIDER_INT = {8: "16", 16: "32", 32: "64", 64: "128", 128: "256"}


@dataclass(frozen=True, slots=True)
class Misfit:
    """The first value of a file that its column cannot hold, and what to do."""

    line: int
    column: str
    value: str
    why: str  # e.g. "is outside UInt8 (0 to 255): it would be stored wrapped"
    fix: str  # e.g. "give the column a type that holds it, e.g. UInt16 (ALTER TABLE ...)"

    def message(self) -> str:
        return f"line {self.line}, column {self.column}: {self.value} {self.why}; {self.fix}"


def check(file: SourceFile, columns: Sequence[Column], read: Sequence[str],
          settings: Mapping[str, str], table: str, engine: str = CHDB,
          head: bytes | None = None) -> Misfit | None:
    """The first misfit in the start of a local text file, or None (also when the file
    cannot be read cheaply: a remote file, a pipe, a compression the standard library
    lacks; the load then goes as ever). `engine`: the target's (Target.engine),
    which bounds its date types (db_range.bounds: one table for every source). `head`:
    the file's first bytes, decompressed, where they were read another way (a remote
    object streamed as stored: server/relay.py)."""
    data = _start(file, head)
    if data is None:
        return None
    types = {c.name: c.type for c in columns}
    defaults = {c.name for c in columns if c.default_kind}  # an empty field means DEFAULT
    nulls_ok = _told(settings, "input_format_null_as_default")
    empty_ok = nulls_ok or _told(settings, "input_format_csv_empty_as_default")
    if not _may_misfit(data, file.format, list(types.values()), nulls_ok and empty_ok, engine):
        return None
    try:
        text = data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError:
        return None  # the load reports it
    if file.format.name in JSON_LINES:
        rows = _json_rows(text)
    else:
        rows = _text_rows(text, file, read)
    if rows is None:
        return None
    names, line_of, columns_read = rows
    for name, values in zip(names, columns_read, strict=True):
        kind = types.get(name)
        if kind is None:
            continue
        found = _column(name, kind, values, table, nulls_ok, empty_ok or name in defaults,
                        engine)
        if found:
            at, why, fix = found
            return Misfit(line_of(at), name, _shown(values[at]), why, fix)
    return None


_EMPTY_CSV = (b",,", b",\n", b",\r\n", b"\n,")
# Bytes that may begin a NULL or an empty field, by format (a CSV field of spaces only
# is not looked for).
_NULL_HINTS = {
    "CSV": (b"\\N", b'""', *_EMPTY_CSV),
    "TSV": (b"\\N", b"\t\t", b"\t\n", b"\t\r\n", b"\n\t"),
    "JSON": (b"null",),
}
_ZEROS = bytes.maketrans(b"123456789", b"000000000")  # every digit a 0
_ZERO_DATE = re.compile(rb"0000-00-00")  # a date, every digit a 0
_EXPONENTS = (b"0e0", b"0e+0", b"0e-0", b"0E0", b"0E+0", b"0E-0")


def _may_misfit(data: bytes, fmt: FileFormat, kinds: Sequence[str], nulls_ok: bool,
                engine: str) -> bool:
    """Whether the start could hold a misfit, asked of its bytes with substring searches
    (cheaper than a regular expression), so that a clean file of common types (Int64,
    Float64, String, DateTime of these centuries) is never split into values. False only
    where the full check would find nothing; True sends the start to it. What to look
    for is worked out once for a run's format and columns (_probe)."""
    return bool(_flagged([data], _probe(fmt, tuple(kinds), nulls_ok, engine)))


def check_many(files: Sequence[SourceFile], columns: Sequence[Column], read: Sequence[str],
               settings: Mapping[str, str], table: str, engine: str = CHDB,
               ) -> list[Misfit | None]:
    """`check` of each of `files`: the starts of a format searched _BATCH at a time
    (_flagged), one that may hold a misfit checked alone."""
    kinds = tuple({c.name: c.type for c in columns}.values())
    nulls_ok = _told(settings, "input_format_null_as_default")  # (check's `nulls_ok and
    found: list[Misfit | None] = [None] * len(files)  # empty_ok`: the same)
    for fmt, at in by_format(files):
        if delimiter(fmt) is None and fmt.name not in JSON_LINES:
            continue
        probe = _probe(fmt, kinds, nulls_ok, engine)
        for first in range(0, len(at), _BATCH):  # (so many starts held at once, at most)
            some = at[first:first + _BATCH]
            heads = starts([files[i] for i in some])
            cut = [None if d is None or (end := d.rfind(b"\n", 0, SAMPLE)) < 0
                   else d[:end + 1] for d in heads]  # (as _start cuts one)
            for k in sorted(_flagged(cut, probe)):
                found[some[k]] = check(files[some[k]], columns, read, settings, table,
                                       engine, heads[k])
    return found


_BATCH = 512  # starts searched at once


def _flagged(starts: Sequence[bytes | None], probe: _Probe) -> set[int]:
    """The indexes of `starts` (each cut as _start cuts it; None: not read) that may
    hold a misfit (_may_misfit), searched over their concatenation (_flagged_in)."""
    at = [i for i, data in enumerate(starts) if data]
    return {at[k] for k in _flagged_in([starts[i] or b"" for i in at], probe)} if at else set()


def _flagged_in(parts: list[bytes], probe: _Probe) -> set[int]:
    """_flagged over the concatenation of `parts`: a hit flags the part it begins in, and
    the search goes on from the next part. A part ends in a line end, which no digit
    pattern holds, so only a hint can span two parts (a line end, then the second's first
    byte: a delimiter, tested alone), flagging the first: a false alarm."""
    joined, ends = b"".join(parts), list(accumulate(map(len, parts)))
    flagged = {k for k, d in enumerate(parts) if probe.first and d[:1] == probe.first} \
        if probe.hints else set()
    for hint in probe.hints:
        _hits(functools.partial(joined.find, hint), ends, flagged)
    digits = joined.translate(_ZEROS) if probe.needles or probe.spans else b""
    for needle in probe.needles:
        _hits(functools.partial(digits.find, needle), ends, flagged)

    def odd_year(pos: int) -> int:  # where a date of a year out of a column's span begins
        while (m := _ZERO_DATE.search(digits, pos)):
            year = joined[m.start():m.start() + 4].decode()
            if year != "0000" and any(year < lo or year > hi for lo, hi in probe.spans):
                return m.start()
            pos = m.end()
        return -1
    if probe.spans:
        _hits(odd_year, ends, flagged)
    return flagged


def _hits(find: Callable[[int], int], ends: list[int], flagged: set[int]) -> None:
    """Flag the part each hit of `find` (where the next hit from a position begins, -1:
    none) is in (`ends`: where each part ends), going on from the next part."""
    pos = 0
    while (hit := find(pos)) >= 0:
        flagged.add(k := bisect_right(ends, hit))
        pos = ends[k]


@dataclass(frozen=True, slots=True)
class _Probe:
    """What `_may_misfit` looks for in a start: bytes that may begin a NULL or an empty
    field (none when the columns take them) and a first byte that is a delimiter;
    digit patterns (every digit a 0) too long or too precise for a column; the years
    a date column holds (first, last)."""

    hints: tuple[bytes, ...]
    first: bytes
    needles: tuple[bytes, ...]
    spans: tuple[tuple[str, str], ...]


@functools.lru_cache(maxsize=64)
def _probe(fmt: FileFormat, kinds: tuple[str, ...], nulls_ok: bool, engine: str) -> _Probe:
    family = "JSON" if fmt.name in JSON_LINES else "CSV" if fmt.name.startswith("CSV") \
        else "TSV"
    hints, sep = _NULL_HINTS[family], (delimiter(fmt) or ",").encode()
    if family == "CSV" and sep != b",":
        hints = tuple(h.replace(b",", sep) for h in hints)
    if nulls_ok or all("Nullable(" in k for k in kinds):
        hints = ()
    needles: list[bytes] = []
    spans: list[tuple[str, str]] = []
    for base in map(bare_type, kinds):
        if (m := _INT.match(base)):
            needles.append(b"0" * len(str(_bounds(int(m.group(2)), bool(m.group(1)))[1])))
        elif (span := _days(base, engine)):
            spans.append((span[0][:4], span[1][:4]))
        elif base == "Float32":
            needles += [*_EXPONENTS, b"0" * 39]
        elif (m := _DECIMAL.match(base)):
            needles.append(b"." + b"0" * (int(m.group(2) or m.group(4)) + 1))
    return _Probe(hints,
                  b"" if family == "JSON" else sep, tuple(needles), tuple(spans))


def empty_fields(file: SourceFile, head: bytes | None = None) -> bool:
    """Whether the start of a local CSV file (or `head`, as `check`) has an unquoted
    empty field (`a,,b`): chDB reads one as NULL in a Nullable column, 18.16 as the
    type's default (fill.py pushes such a file through chDB). False when the start
    cannot be read."""
    data = _start(file, head)
    if data is None or not file.format.name.startswith("CSV"):
        return False
    sep = (delimiter(file.format) or ",").encode()
    return data[:1] == sep or any(h.replace(b",", sep) in data for h in _EMPTY_CSV)


def _told(settings: Mapping[str, str], name: str) -> bool:
    return settings.get(name, "").lower() in ("1", "true")


def _start(file: SourceFile, head: bytes | None = None) -> bytes | None:
    """The first SAMPLE bytes of a local file (or of `head`), decompressed, cut after
    its last whole line (read once for the header too: sniff.start)."""
    if delimiter(file.format) is None and file.format.name not in JSON_LINES:
        return None
    data = start(file) if head is None else head
    if data is None:
        return None
    data = data[:SAMPLE]
    end = data.rfind(b"\n")
    return data[:end + 1] if end >= 0 else None


# The column names, the line of the row at an index (asked only of a misfit), and the
# values by column.
Rows = tuple[list[str], Callable[[int], int], list[list]]


def _text_rows(text: str, file: SourceFile, read: Sequence[str]) -> Rows | None:
    """A CSV/TSV start as columns of fields (`\\N` kept as written) named by the file's
    header, else by the run's columns. Rows of another width are left out (the load
    reports them). Split in C (csv.reader, str.split), not by a loop a row."""
    sep = delimiter(file.format) or ","
    csv_like = file.format.name.startswith("CSV")
    lines = text.splitlines()
    rows = list(csv.reader(lines, delimiter=sep, skipinitialspace=sep != " ")) if csv_like \
        else [line.split(sep) for line in lines]
    first = 1 if file.format.has_header else 0
    if len(rows) <= first:
        return None
    names = list(read) if not first else rows[0] if csv_like else \
        [_unescape_tsv(n) for n in rows[0]]
    rows = rows[first:]
    kept: Sequence[int] = range(len(rows))
    if set(map(len, rows)) != {len(names)}:
        kept = [i for i, row in enumerate(rows) if len(row) == len(names)]
        rows = [rows[i] for i in kept]
    if not rows:
        return None
    columns = [list(c) for c in zip(*rows, strict=True)]
    if not csv_like and "\\" in text:  # TSV escapes undone, \N kept as written
        columns = [[_unescape_tsv(v) if "\\" in v and v != "\\N" else v for v in c]
                   for c in columns]

    def line_of(at: int) -> int:
        """The line the row starts on (a quoted CSV field may hold line ends)."""
        wanted = kept[at] + first
        if not csv_like:
            return wanted + 1
        reader = csv.reader(text.splitlines(keepends=True), delimiter=sep)
        start = 1
        for n, _ in enumerate(reader):
            if n == wanted:
                return start
            start = reader.line_num + 1
        return wanted + 1
    return names, line_of, columns


def _json_rows(text: str) -> Rows | None:
    """A JSON-lines start as columns, one per key of any object: numbers and
    strings as text, null as `\\N`, a missing key as None (the column's default is what
    the format means by it), objects, arrays and booleans as None (no rule reads them).
    Parsed in one call, not a call a line."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    try:
        objects = json.loads("[" + ",".join(line for _, line in lines) + "]")
    except ValueError:
        return None  # the load reports it
    kept = [(n, o) for (n, _), o in zip(lines, objects, strict=True) if isinstance(o, dict)]
    if not kept:
        return None
    names = list(dict.fromkeys(k for _, o in kept for k in o))  # every key, first seen first
    columns = [[_json_text(o.get(k, _ABSENT)) for _, o in kept] for k in names]
    return names, lambda at: kept[at][0], columns


_ABSENT = object()


def _json_text(value: object) -> str | None:
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return None


def _column(name: str, kind: str, values: list, table: str, nulls_ok: bool,
            empty_ok: bool, engine: str) -> tuple[int, str, str] | None:
    """(index of the first misfit, why, fix) for one column's values, or None. Each
    rule first narrows the values to those that can misfit in one comprehension (a
    16 KB start has a thousand), then judges those."""
    base = bare_type(kind)
    if base.startswith(("Array", "Map", "Tuple", "Nested")):
        return None
    if "Nullable(" not in kind:
        present = set(values)
        marks = ({"\\N"} if not nulls_ok else set()) | \
            ({""} if not empty_ok and not base.startswith(("String", "FixedString")) else set())
        if present & marks:
            at = next(i for i, v in enumerate(values) if v in marks)
            return (at, f"in a column that is not Nullable ({kind}) would be stored as the "
                        "type's default", _nullable_fix(table, name, kind))
    rule = _rule(base, engine)
    found = rule(values) if rule else None
    return (found[0], found[1], _wider_fix(table, name, base, engine)) if found else None


def _first(values: list, candidates: Iterable[int],
           why: Callable[[str], str]) -> tuple[int, str] | None:
    for at in candidates:
        reason = why(values[at])
        if reason:
            return at, reason
    return None


Rule = Callable[[list], "tuple[int, str] | None"]


def _rule(base: str, engine: str) -> Rule | None:
    """The check of a column's values (text; None for an absent JSON key) against
    `base`: the first that does not fit and why, or None. Each first asks, in C (max,
    min, join, a regular expression over the joined values), whether any value could
    misfit, so a clean column is never checked value by value."""
    if (m := _INT.match(base)):
        return _integers(base, int(m.group(2)), bool(m.group(1)))
    kind = base.split("(")[0]
    if (span := _days(base, engine)):
        return _dates(kind, *span)
    if base == "Float32":
        return _float32
    if (m := _DECIMAL.match(base)):
        return _decimals(base, int(m.group(2) or m.group(4)))
    return None


def _days(base: str, engine: str) -> tuple[str, str] | None:
    """The first and last day `base` (a Date or DateTime type) holds on `engine`, or
    None for another type. A DateTime's last day is whole where its last second is not
    (2106-02-07 06:28:15 on chDB): a value on that day past that time is not caught."""
    span = bounds(base, engine)
    return (span[0][:10], span[1][:10]) if span else None


def _texts(values: list) -> list[str]:
    return [v for v in values if isinstance(v, str)] if None in values else values


def _bounds(bits: int, unsigned: bool) -> tuple[int, int]:
    return (0, 2 ** bits - 1) if unsigned else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)


def _integers(base: str, bits: int, unsigned: bool) -> Rule:
    lo, hi = _bounds(bits, unsigned)
    safe = len(str(hi))  # a value this long with its sign can hold no more digits

    def integers(values: list) -> tuple[int, str] | None:
        texts = _texts(values)
        if not texts or max(map(len, texts)) < safe:
            return None
        return _first(values, (i for i, v in enumerate(values) if v and len(v) >= safe),
                      lambda v: "" if not _DIGITS.match(v) or lo <= int(v) <= hi
                      else f"is outside {base} ({lo} to {hi}): it would be stored wrapped")
    return integers


def _dates(kind: str, lo: str, hi: str) -> Rule:
    def dates(values: list) -> tuple[int, str] | None:
        texts = _texts(values)
        if not texts or (min(texts) >= lo and max(texts)[:10] <= hi):
            return None
        out = (i for i, v in enumerate(values) if v and v[:1].isdigit()
               and (v[:10] < lo or v[:10] > hi) and not v.startswith("0000-00-00"))
        return _first(values, out, lambda v: (
            f"is outside the dates {kind} holds ({lo} to {hi}): it would be stored as "
            "another date") if _DATE.match(v) else "")
    return dates


def _float32(values: list) -> tuple[int, str] | None:
    joined = "\x00".join(_texts(values))
    if "e" not in joined and "E" not in joined and len(joined) < 40 or \
            not re.search(r"[eE]|[^\x00]{40}", joined):
        return None
    big = (i for i, v in enumerate(values) if v and ("e" in v or "E" in v or len(v) > 39))
    return _first(values, big, _beyond_float32)


def _beyond_float32(v: str) -> str:
    try:
        x = float(v)
    except ValueError:
        return ""
    return "is beyond Float32's range: it would be stored as inf" \
        if _FLOAT32_MAX < abs(x) < float("inf") else ""


def _decimals(base: str, scale: int) -> Rule:
    places = re.compile(r"\.\d{" + str(scale + 1) + ",}")

    def decimals(values: list) -> tuple[int, str] | None:
        if not places.search("\x00".join(_texts(values))):
            return None
        long = (i for i, v in enumerate(values) if v and places.search(v))
        return _first(values, long, lambda v: (
            f"has more decimal places than {base} keeps ({scale}): it would be stored "
            "cut short") if "e" not in v.lower()
            and len(v.strip()[v.strip().index(".") + 1:].rstrip("0")) > scale else "")
    return decimals


def _nullable_fix(table: str, name: str, kind: str) -> str:
    wanted = f"Nullable({bare_type(kind)})"
    return (f"make the column {wanted} (ALTER TABLE {table} MODIFY COLUMN {quote_ident(name)} "
            f"{wanted}, "
            "or in --schema), or pass --setting input_format_null_as_default=1 to store the "
            "default for it")


def _wider_fix(table: str, name: str, base: str, engine: str) -> str:
    m = _INT.match(base)
    family = base.split("(")[0]
    if family in ("Date", "DateTime", "Date32", "DateTime64"):
        bigger = wider(base, engine)  # (db_range: on chDB the wider type, else String)
        if bigger == "String":
            return (f"no date type of this target holds it: keep the column as text (ALTER "
                    f"TABLE {table} MODIFY COLUMN {quote_ident(name)} String, or in --schema)")
    else:
        bigger = f"{m.group(1)}Int{_WIDER_INT[int(m.group(2))]}" if m and \
            int(m.group(2)) < 256 else {"Float32": "Float64"}.get(family, "")
    if not bigger:
        return (f"give the column a type that holds it (ALTER TABLE {table} MODIFY COLUMN "
                f"{quote_ident(name)} ..., or in --schema); String keeps any value as written")
    return (f"give the column a type that holds it, e.g. {bigger} (ALTER TABLE {table} MODIFY "
            f"COLUMN {quote_ident(name)} {bigger}, or in --schema); String keeps any value "
            "as written")


def _shown(value: object) -> str:
    if value is None or value == "\\N":
        return "NULL"
    if value == "":
        return "an empty value"
    text = str(value)
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


# -- typed files: a number read at a width its column cannot hold -------------------------
# A Parquet/ORC/Arrow/Avro/Native file's Int64 read into a UInt8 column wraps (300 -> 44):
# the reader casts to the type it is told. So such a column is read as Int64, the file's
# own width or wider, and inserted through accurateCast, which refuses a value that does
# not fit (code 70) instead of wrapping it. Integers only: accurateCast refuses a Float64
# that Float32 holds with less precision (1.1), which a Float32 column is for.
_NARROW_INTS = re.compile(r"^(U?Int(8|16|32))$")


def widened(columns: Sequence[Column], names: Collection[str]) -> list[Column]:
    """`columns` with the narrow integer type (8 to 32 bits, Nullable kept) of each of
    `names` as Int64: how a typed file is read, so that insert_expr can refuse a value
    out of range."""
    return [Column(c.name, _wide(c.type), c.default_kind) if c.name in names else c
            for c in columns]


def narrow_int(kind: str) -> bool:
    return bool(_NARROW_INTS.match(bare_type(kind)))


def _wide(kind: str) -> str:
    base = bare_type(kind)
    if not _NARROW_INTS.match(base):
        return kind
    return "Nullable(Int64)" if "Nullable(" in kind else "Int64"


def insert_expr(ident: str, read_type: str, table_type: str) -> str | None:
    """`accurateCast(ident, 'UInt8') AS ident` where `read_type` is `table_type` widened
    (widened); None otherwise (the caller's plain expression stands)."""
    cast = cast_expr(ident, read_type, table_type)
    return f"{cast} AS {ident}" if cast else None


def in_table_types(text: str, column: str | None, read: Sequence[Column],
                   table: Sequence[Column]) -> str:
    """An engine's error `text` about `column` (errors.locate), where that column was
    read wider than the table holds it (widened): named by the table's type, the one the
    user knows ("'true' is not UInt8", not "... Int64")."""
    was = {c.name: c.type for c in read}.get(column or "")
    kind = {c.name: c.type for c in table}.get(column or "")
    if not was or not kind or was == kind or _wide(kind) != was:
        return text
    return text.replace(f" is not {was}", f" is not {kind}").replace(
        f" is not {bare_type(was)}", f" is not {bare_type(kind)}")


def cast_expr(ident: str, read_type: str, table_type: str) -> str | None:
    """insert_expr's cast without its name (core/validate.py checks values with it)."""
    if read_type == table_type or _wide(table_type) != read_type:
        return None
    return f"accurateCast({ident}, {quote_str(table_type)})"
