"""The first line of a CSV/TSV file: read cheaply, split into fields, judged as names.

Whether a file starts with a header, and which columns that header names, is asked of
every CSV/TSV file a load takes (planner.check_headers): a file whose header names other
columns than the table's must fail alone, and a server as old as 18.16 reads a
header's columns by position. For a local file the line is read here (at most 64 KB,
decompressed by the standard library), which costs microseconds and spares starting
chDB; any doubt (another compression, a remote file, a line longer
than the limit) answers None and the engine reads the line (dialect.first_line).
Only the header line is read: no data row passes through Python.

What looks like a header when the engine cannot tell (every column text, so types do
not differ between the first line and the rest) is decided by `looks_like_names`.
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import functools
import gzip
import lzma
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

from chload.formats import MAGIC, FileFormat
from chload.sources.base import SourceFile

LIMIT = 1 << 16
BOM = "\ufeff"
_OPENERS: dict[str, Callable[[str], Any]] = {  # path -> a binary file object
    "none": lambda path: open(path, "rb"),
    "gzip": gzip.GzipFile,
    "bz2": bz2.BZ2File,
    "xz": lzma.LZMAFile,
    "deflate": lambda path: _Inflated(path),
}
_DELIMITERS = {"CSV": ",", "TSV": "\t", "TabSeparated": "\t"}
_TSV_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\", "0": "\0", "b": "\b",
                "f": "\f", "'": "'", '"': '"'}
# Values, not names: numbers, dates and times, booleans, NULL.
_VALUE = re.compile(
    r"^[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?$"  # 12, -3.5, 1e9
    r"|^(0x[0-9a-f]+|inf|-inf|nan|true|false|null|\\n|none)$"
    r"|^\d{1,4}[-/.]\d{1,2}[-/.]\d{1,4}([ t]\d{1,2}:\d{2}.*)?$"  # 2024-01-31, 31/01/2024
    r"|^\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?$",  # 12:30:00
    re.I,
)
MAX_NAME = 128  # a header field longer than this is a value


class _Inflated:
    """The start of a zlib (`deflate`) file, inflated: enough for its first line."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as raw:
            self.data = zlib.decompressobj().decompress(raw.read(LIMIT), LIMIT)
        self.at = 0

    def __enter__(self) -> _Inflated:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self, limit: int) -> bytes:
        out = self.data[self.at:self.at + limit]
        self.at += len(out)
        return out

    def readline(self, limit: int) -> bytes:
        end = self.data.find(b"\n", self.at, self.at + limit)
        out = self.data[self.at:self.at + limit if end < 0 else end + 1]
        self.at += len(out)
        return out


def delimiter(fmt: FileFormat) -> str | None:
    """`,` for CSV (or the delimiter the run reads it with), a tab for TSV (with or
    without names), None for other formats."""
    base = fmt.name.removesuffix("WithNamesAndTypes").removesuffix("WithNames")
    if base == "CSV" and fmt.delimiter:
        return fmt.delimiter
    return _DELIMITERS.get(base)


def header_names(file: SourceFile) -> list[str] | None:
    """The fields of a local file's first line, or None when that cannot be read cheaply."""
    if delimiter(file.format) is None:
        return None
    text = first_text(file)
    return None if text is None else split_line(text, file.format)


def split_line(text: str, fmt: FileFormat) -> list[str] | None:
    """A CSV/TSV line (as the file has it) as its fields: quotes and escapes undone, a
    byte order mark and the line end dropped. None for an empty line or another format."""
    fields = (_split if len(text) <= _KEPT_LINE else _split.__wrapped__)(text, fmt)
    return None if fields is None else list(fields)


_KEPT_LINE = 4096  # a longer first line is split anew each time (the cache stays small)


@functools.lru_cache(maxsize=256)
def _split(text: str, fmt: FileFormat) -> tuple[str, ...] | None:
    """split_line, once per distinct line: the files of one export share a header."""
    sep = delimiter(fmt)
    text = text.removeprefix(BOM).rstrip("\r\n")
    if sep is None or not text:
        return None
    if fmt.name.startswith("CSV"):  # the engine trims a CSV field's spaces
        return tuple(field.strip(" \t") for field in
                     next(csv.reader([text], delimiter=sep, skipinitialspace=sep != " ")))
    return tuple(_unescape_tsv(field) for field in text.split(sep))


# What a CSV file's first line may be separated by instead of `,`, in the order asked.
OTHER_DELIMITERS = (";", "\t", "|")


def guess_delimiter(text: str) -> str | None:
    """The separator of a CSV first line that `,` does not split but another does:
    `a;b;c` -> `;`. None when `,` splits it, or nothing else does (one column).

    Only a first line is weighed (no data row passes through Python); the header check
    then judges every file by the delimiter chosen here (planner.check_headers).
    """
    comma = split_line(text, FileFormat("CSV", "none"))
    if not comma or len(comma) > 1:
        return None
    for sep in OTHER_DELIMITERS:
        fields = split_line(text, FileFormat("CSV", "none", sep))
        if fields and len(fields) > 1:
            return sep
    return None


def read_again(file: SourceFile) -> bool:
    """Whether reading the start of `file` leaves it whole for the load: a remote object
    or a regular file, not a pipe (what is read from one is gone)."""
    try:
        return not file.local_path or stat.S_ISREG(os.stat(file.local_path).st_mode)
    except OSError:
        return False


def start(file: SourceFile) -> bytes | None:
    """The first LIMIT bytes of a local file, decompressed, or None when they cannot be
    read cheaply (a remote file, a pipe, a compression the standard library lacks, an
    error: the engine then says). Read once: the header, its checks and the values'
    fit (fit.py) each ask for it, so a load of many small files opens each one once:
    kept within `kept_starts` (a file rewritten later is read anew), at most
    _KEPT_BYTES of them."""
    opener = _OPENERS.get(file.format.compression)
    if opener is None or not file.local_path:
        return None
    key = (file.local_path, file.format.compression, file.size, file.mtime_ns)
    with _STARTS_GUARD:
        if key in _STARTS:
            return _STARTS[key]
    data = None if not read_again(file) else _read_plain(file.local_path) \
        if file.format.compression == "none" else _read_start(opener, file.local_path)
    if _kept[1]:
        _keep(key, data)
    return data


def stored_start(file: SourceFile) -> bytes | None:
    """The first bytes of a local file as stored, for its compression's magic
    (formats.magic), None when it cannot be read. The listing saw a regular file
    (sources/files/local.py), so it is read without another stat. Within `kept_starts`
    the first LIMIT bytes are read, and kept for `start` when they show no compression:
    the header and values checks then read no file again; outside it, six bytes."""
    assert file.local_path
    if not _kept[1]:
        return _read_plain(file.local_path, 6)
    key = (file.local_path, "none", file.size, file.mtime_ns)
    with _STARTS_GUARD:
        if key in _STARTS:
            return _STARTS[key]
    data = _read_plain(file.local_path)
    if data is not None and not any(data.startswith(sign) for sign, _ in MAGIC):
        _keep(key, data)
    return data


def keeping() -> bool:
    """Whether starts read now would be kept (within `kept_starts`, room left)."""
    return bool(_kept[1]) and _kept[0] < _KEPT_BYTES


def keep_whole(files: Sequence[tuple[SourceFile, bytes]]) -> None:
    """Local files' bytes, each read whole as listed (walk.c), kept as `stored_start`
    keeps what it reads (not those that show a compression), within `kept_starts`; a
    file whose bytes are not its listed size (changed meanwhile) is read again later."""
    signs = tuple(sign for sign, _ in MAGIC)
    with _STARTS_GUARD:
        for file, data in files:
            if not _kept[1] or _kept[0] + len(data) + _KEPT_EACH > _KEPT_BYTES:
                return  # (no room left: the rest are read when asked, as ever)
            if len(data) == file.size and not data.startswith(signs):
                _STARTS[(file.local_path or "", "none", file.size, file.mtime_ns)] = data
                _kept[0] += len(data) + _KEPT_EACH


def _read_plain(path: str, limit: int = LIMIT) -> bytes | None:
    """An uncompressed file's first `limit` bytes (what `_read_start` gives it a line at
    a time), in one read by descriptor: a load of many small files asks it of each."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        parts: list[bytes] = []
        size = 0
        while size < limit:
            part = os.read(fd, limit - size)
            if not part:
                break
            parts.append(part)
            size += len(part)
    except OSError:
        if not parts:
            return None
    finally:
        os.close(fd)
    return b"".join(parts)


def _read_start(opener: Callable[[str], Any], path: str) -> bytes | None:
    """Up to LIMIT bytes from the start, decompressed, a line at a time: a stream cut
    short (a truncated gzip) still gives the lines before the cut, as its first line is
    all a header needs; None when not even one line could be read (b"": empty)."""
    lines: list[bytes] = []
    size = 0
    try:
        with opener(path) as stream:
            while size < LIMIT:
                line = stream.readline(LIMIT - size)
                if not line:
                    break
                lines.append(line)
                size += len(line)
    except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError):
        if not lines:
            return None
    return b"".join(lines)


@contextlib.contextmanager
def kept_starts() -> Iterator[None]:
    """Within it, `start` keeps what it read (planner.check_headers' reads of a run)."""
    with _STARTS_GUARD:
        _kept[1] += 1
    try:
        yield
    finally:
        with _STARTS_GUARD:
            _kept[1] -= 1
            if not _kept[1]:
                _STARTS.clear()
                _kept[0] = 0


# Starts of files kept (start), oldest dropped first: a load's header pass and its checks
# pass come one after the other, so this holds every small file of 100,000 or so.
_KEPT_BYTES = 64 << 20
_KEPT_EACH = 200  # bytes a kept start costs beside its data (key, entry)
_STARTS: dict[tuple[str, str, int, int], bytes | None] = {}
_STARTS_GUARD = threading.Lock()
_kept = [0, 0]  # bytes kept, scopes open (kept_starts)


def _keep(key: tuple[str, str, int, int], data: bytes | None) -> None:
    size = len(data or b"") + _KEPT_EACH
    with _STARTS_GUARD:
        while _STARTS and _kept[0] + size > _KEPT_BYTES:
            _kept[0] -= len(_STARTS.pop(next(iter(_STARTS))) or b"") + _KEPT_EACH
        if key not in _STARTS:
            _STARTS[key] = data
            _kept[0] += size


def starts(files: Sequence[SourceFile]) -> list[bytes | None]:
    """`start` of each of `files`, those kept looked up under one lock (a run's checks
    ask it of every file: core/reading/heads.py)."""
    with _STARTS_GUARD:  # (the key `start` keeps a start by, made in C)
        kept: list[Any] = list(map(_STARTS.get, map(_START_KEY, files), repeat(_UNKEPT)))
    for i in [i for i, data in enumerate(kept) if data is _UNKEPT]:
        kept[i] = start(files[i])
    return kept


_START_KEY = attrgetter("local_path", "format.compression", "size", "mtime_ns")
_UNKEPT = object()  # (a start not kept: `start` reads it)


def _first_line(file: SourceFile) -> bytes | None:
    """A local file's first line as its bytes (with its end), as readline(LIMIT)."""
    data = start(file)
    if data is None:
        return None
    end = data.find(b"\n")
    return data if end < 0 else data[:end + 1]


def remote_first_text(file: SourceFile, start: Callable[[SourceFile, int], bytes | None],
                      ) -> str | None:
    """A remote file's first line as text, from its first LIMIT bytes as stored
    (`start`: one ranged read by its source) decompressed here, or None when that
    cannot tell (another compression, no such read, a line longer than what was read):
    the engine then reads it. Only the header line is kept."""
    inflate = _INFLATERS.get(file.format.compression)
    if inflate is None or delimiter(file.format) is None or not read_again(file):
        return None
    raw = start(file, LIMIT)
    if raw is None:
        return None
    try:
        data = inflate(raw)
    except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError):
        return None
    end = data.find(b"\n")
    whole = len(raw) < LIMIT  # (the object was shorter than the read: all of it came)
    if end < 0 and (not whole or len(data) >= LIMIT):
        return None  # longer than the read: let the engine say
    try:
        return (data if end < 0 else data[:end + 1]).decode("utf-8")
    except UnicodeDecodeError:
        return None


# compression -> the start of a stream decompressed (as much as the bytes give, at most
# LIMIT): a stream cut short is what a ranged read gives. Not bz2: its blocks (up to
# 900 KB) give nothing until whole.
_INFLATERS: dict[str, Callable[[bytes], bytes]] = {
    "none": lambda raw: raw,
    "gzip": lambda raw: zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, LIMIT),
    "deflate": lambda raw: zlib.decompressobj().decompress(raw, LIMIT),
    "xz": lambda raw: lzma.LZMADecompressor().decompress(raw, LIMIT),
}


def inflate_start(raw: bytes, compression: str) -> bytes | None:
    """The start of a file's text from its first bytes as stored (at most LIMIT of
    it), or None: a compression not inflated here, or bytes that do not inflate."""
    inflate = _INFLATERS.get(compression)
    if inflate is None:
        return None
    try:
        return inflate(raw)
    except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError):
        return None


def first_text(file: SourceFile) -> str | None:
    """A local file's first line as text, or None when that cannot be read cheaply."""
    line = _first_line(file)
    return None if line is None else line_text(line)


def line_text(line: bytes) -> str | None:
    """A first line (as `_first_line` gives it) as text, or None: not UTF-8, or longer
    than the limit."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(line) >= LIMIT and not text.endswith("\n"):
        return None  # longer than the limit: let the engine say
    return text


def unreadable(file: SourceFile) -> str | None:
    """Why a local CSV/TSV file cannot be read as written, from one read of its first
    line, or None: UTF-16 text (a UTF-16 byte order mark, as Windows tools write
    "Unicode" text; the engine reads UTF-8 only, and said "Rows have different amount
    of values"), or Excel's delimiter hint as the first line (`sep=;`, which no engine
    skips: it became the header, and the real header a row)."""
    line = _first_line(file) if delimiter(file.format) is not None else None
    return None if line is None else unreadable_line(line)


def unreadable_line(line: bytes) -> str | None:
    """unreadable, from a file's first line (as `_first_line` gives it)."""
    # (longer than 16 bytes, a line is no `sep=;` hint: its first two bytes tell the rest)
    return _unreadable_line(line if len(line) <= 16 else line[:2])


@functools.lru_cache(maxsize=256)
def _unreadable_line(line: bytes) -> str | None:
    """unreadable, once per distinct first line."""
    if line[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return ("the file is UTF-16 text (it begins with a UTF-16 byte order mark, as "
                "Windows tools write 'Unicode' text); convert it to UTF-8, e.g. iconv -f "
                "UTF-16 -t UTF-8 FILE > FILE.utf8, and load that")
    hint = line.decode("utf-8", errors="replace").removeprefix(BOM).rstrip("\r\n")
    if re.fullmatch(r"sep=.", hint):
        return (f"its first line {hint!r} is Excel's delimiter hint, not data or a header; "
                f"remove it (e.g. tail -n +2 FILE > FILE.csv) and load that, with --setting "
                f"format_csv_delimiter={hint[4:]} if the delimiter is not guessed")
    return None


def _unescape_tsv(field: str) -> str:
    return re.sub(r"\\(.)", lambda m: _TSV_ESCAPES.get(m.group(1), m.group(0)), field)


def starts_with_names(file: SourceFile, names: Collection[str]) -> bool | None:
    """True when the first line is exactly some of `names` (each once); None: unknown."""
    fields: Any = header_names(file)
    if not fields or len(set(fields)) != len(fields):
        return None
    return True if set(fields) <= set(names) else None


def looks_like_names(fields: Sequence[str], unique: bool = True) -> bool:
    """Whether a first line reads as column names rather than values.

    Every field is text that is not a number, a date, a time, a boolean or NULL, at
    most 128 characters on one line; fewer than half the fields are empty (a header
    with one empty field is still a header); with `unique`, no name comes twice.
    A line of words (`Paris,France`) passes: the caller weighs that (core/plan.py).
    """
    named = [f.strip() for f in fields if f.strip()]
    if not named or (len(fields) - len(named)) * 2 >= len(fields):
        return False
    if unique and len(set(named)) != len(named):
        return False
    return all(len(f) <= MAX_NAME and "\n" not in f and not _VALUE.match(f) for f in named)
