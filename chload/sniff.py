"""The first line of a local CSV/TSV file, read without the engine.

Into a table whose columns are known (it exists, or `--schema` names them), whether a
file starts with a header needs no engine: a first line made of exactly those column
names is one. Reading it here (at most 64 KB, decompressed by the standard library)
spares the ~0.4 s it takes to start chDB, which a server target otherwise needs for
nothing else on the raw path. Any doubt (another compression, a remote file, a line
that is not all known names) answers None and the engine decides, as before.
Only the header line is read: no data row passes through Python.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import lzma
import zlib
from collections.abc import Callable, Collection
from typing import Any

from chload.sources import SourceFile

LIMIT = 1 << 16
_OPENERS: dict[str, Callable[[str], Any]] = {  # path -> a binary file object
    "none": lambda path: open(path, "rb"),
    "gzip": gzip.GzipFile,
    "bz2": bz2.BZ2File,
    "xz": lzma.LZMAFile,
}
_DELIMITERS = {"CSV": ",", "TSV": "\t", "TabSeparated": "\t"}


def header_names(file: SourceFile) -> list[str] | None:
    """The fields of the file's first line, or None when that cannot be read cheaply."""
    delimiter = _DELIMITERS.get(file.format.name.removesuffix("WithNames"))
    opener = _OPENERS.get(file.format.compression)
    if delimiter is None or opener is None or not file.local_path or file.is_stream:
        return None
    try:
        with opener(file.local_path) as stream:
            line = stream.readline(LIMIT)
        text = line.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError, lzma.LZMAError, zlib.error, ValueError):
        return None
    if not text.endswith("\n"):
        return None  # longer than the limit, or a file of one line: let the engine say
    text = text.rstrip("\r\n")
    if delimiter == ",":
        return next(csv.reader([text]), None)
    return None if "\\" in text else text.split(delimiter)


def starts_with_names(file: SourceFile, names: Collection[str]) -> bool | None:
    """True when the first line is exactly some of `names` (each once); None: unknown."""
    fields: Any = header_names(file)
    if not fields or len(set(fields)) != len(fields):
        return None
    return True if set(fields) <= set(names) else None
