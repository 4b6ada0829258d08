"""Local files: paths, directories and globs (`*`, `?`, `**`, `{a,b}`, `{1..10}`), and stdin."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from chload.errors import SourceError, UsageError
from chload.formats import detect
from chload.schema import quote_str
from chload.sources import SourceFile, expand_braces
from chload.sources.remote import brace_list

_GLOB_CHARS = set("*?[")


def list_local(pattern: str, fmt: str | None, compression: str | None) -> list[SourceFile]:
    """Every regular file the pattern names, sorted, each with its identity."""
    paths: list[str] = []
    for expanded in expand_braces(os.path.expanduser(pattern)):
        paths.extend(_resolve(expanded))
    if not paths:
        raise SourceError(f"{pattern}: no such file, or the pattern matches nothing")
    unique = sorted(set(os.path.abspath(p) for p in paths))
    return [_describe(p, fmt, compression) for p in unique]


def _resolve(path: str) -> list[str]:
    if _GLOB_CHARS & set(path):
        return [p for p in glob.glob(path, recursive=True) if os.path.isfile(p)]
    if os.path.isdir(path):
        return _walk(path)
    if os.path.exists(path):
        return [path]
    raise SourceError(f"{path}: no such file or directory")


def _walk(directory: str) -> list[str]:
    """Every non-hidden file under a directory, recursively."""
    found: list[str] = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(os.path.join(root, n) for n in names if not n.startswith("."))
    return found


def _describe(path: str, fmt: str | None, compression: str | None) -> SourceFile:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read it ({exc.strerror})") from exc
    return SourceFile(
        uri=path, size=st.st_size, mtime_ns=st.st_mtime_ns,
        format=detect(path, fmt, compression), local_path=path,
    )


def spool_stdin(fmt: str | None, compression: str | None, workdir: str) -> SourceFile:
    """Standard input, copied in chunks to a file the engine can read more than once.

    Schema inference reads the start of the data and the load reads all of it, so a
    pipe is spooled (bytes only, bounded memory; no row is parsed in Python).
    """
    if not fmt:
        raise UsageError("-: reading standard input needs --format (e.g. --format CSVWithNames)")
    os.makedirs(workdir, exist_ok=True)
    handle, path = tempfile.mkstemp(prefix="stdin-", dir=workdir)
    with os.fdopen(handle, "wb") as out:
        shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
    st = os.stat(path)
    return SourceFile(
        uri="stdin", size=st.st_size, mtime_ns=st.st_mtime_ns,
        format=detect("stdin", fmt, compression or "none"), local_path=path, is_stream=True,
    )


def table_function(file: SourceFile, fmt: str, structure: str | None) -> str:
    """`file('path', 'Format', 'structure', 'compression')`."""
    args = [file.local_path or file.uri, fmt, structure or "auto", file.format.compression]
    return f"file({', '.join(quote_str(a) for a in args)})"


def table_function_many(files: Sequence[SourceFile], fmt: str,
                        structure: str | None) -> tuple[str, str] | None:
    """One file() over a `dir/{a,b,c}` list of one directory's files; each row's uri is
    the directory's plus `_file`. Measured: 50 gzip JSON files (8.6 MB) parsed in
    0.18-0.22 s this way, 0.36-0.40 s as a UNION ALL of one file() each."""
    if any(f.is_stream or not f.local_path or f.local_path != f.uri for f in files):
        return None
    listed = brace_list(files)
    directory = os.path.dirname(files[0].uri) + "/"
    if listed is None or "/" in listed[len(directory):]:
        return None  # the engine matches a list within one directory only
    one = SourceFile(listed, 0, 0, files[0].format, local_path=listed)
    return table_function(one, fmt, structure), f"concat({quote_str(directory)}, _file)"
