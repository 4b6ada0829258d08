"""HDFS: `hdfs://namenode:port/path/glob`, listed and read by the engine's hdfs().

Listing is `SELECT _path, _size, _time FROM hdfs(pattern, 'One')`: one row per file, no
data read, through the client and RPC port the load uses, so globs mean what they mean
to the load and a listing that works proves the load can connect (docs/sources-files.md).
A path without glob characters is one file or a directory (every file below it, except
hidden names: `.x`, `_SUCCESS`). Identity: size and modification time (whole seconds).

Invariant: the listing runs in the engine the caller passes (`SourceContext.query`), the
target's own: chDB allows one engine path per process, and that engine reads the files.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from chload.errors import ChloadError, NothingMatched, SourceError, UsageError
from chload.formats import detect
from chload.schema import quote_str
from chload.sources.base import Query, RemoteSource, SourceContext, SourceFile
from chload.sources.files.patterns import brace_list

_GLOB = re.compile(r"[*?{]")
_HIDDEN = (".", "_")


def split_uri(uri: str) -> tuple[str, str]:
    """`hdfs://host:port/path` -> (`hdfs://host:port`, `/path`)."""
    match = re.fullmatch(r"(hdfs://[^/]+)(/.*)", uri)
    if not match:
        raise UsageError(f"{uri}: write HDFS sources as hdfs://namenode:port/path/pattern")
    return match.group(1), match.group(2)


def list_hdfs(pattern: str, fmt: str | None, compression: str | None,
              query: Query) -> Iterator[SourceFile]:
    """Every file the pattern names, sorted (by the engine), each once with its
    identity; each row of the engine's answer is let go once its file is planned."""
    root, path = split_uri(pattern)
    if _GLOB.search(path):
        rows = _stat(query, pattern, root + path)
    else:
        rows = _directory_or_file(query, pattern, root, path)
    rows.reverse()  # popped from the end: in order
    found, last = 0, None
    while rows:
        row = rows.pop()
        if row["path"].endswith("/") or row["path"] == last:
            continue
        found, last = found + 1, row["path"]
        yield describe(root, row, fmt, compression)
    if not found:
        raise NothingMatched(f"{pattern}: no file matches (an empty directory, or a "
                             "pattern that matches nothing)")


def _directory_or_file(query: Query, pattern: str, root: str, path: str) -> list[dict]:
    """`dir/**` answers a directory's files, or for a file the file itself (as `file/`)."""
    directory = path.rstrip("/") + "/"
    below = _stat(query, pattern, root + directory + "**")
    if [r["path"] for r in below] == [directory] and not path.endswith("/"):
        return [{**below[0], "path": path}]  # a file
    files = [r for r in below if r["path"].startswith(directory) and r["path"] != directory]
    if not files:
        _stat(query, pattern, root + path)  # missing: the engine says "does not exist"
    return [r for r in files
            if not any(p.startswith(_HIDDEN) for p in r["path"][len(directory):].split("/"))]


def _stat(query: Query, pattern: str, url: str) -> list[dict]:
    sql = (f"SELECT _path AS path, _size AS size, toUnixTimestamp(_time) AS mtime "
           f"FROM hdfs({quote_str(url)}, 'One') ORDER BY path")
    try:
        return query(sql)
    except ChloadError as exc:
        reason = str(exc).partition(": ")[2] or str(exc)
        raise SourceError(f"{pattern}: {reason}") from exc


def describe(root: str, row: dict, fmt: str | None, compression: str | None) -> SourceFile:
    uri = root + row["path"]
    return SourceFile(
        uri=uri, size=int(row["size"] or 0), mtime_ns=int(row["mtime"] or 0) * 10**9,
        format=detect(row["path"], fmt, compression, strict=False), kind="hdfs",
    )


def table_function_many(files: Sequence[SourceFile], fmt: str,
                        structure: str | None) -> tuple[str, str] | None:
    """One hdfs() over a `{a,b,c}` list of one NameNode's files; rows' uri from `_path`."""
    roots = {split_uri(f.uri)[0] for f in files}
    listed = brace_list(files) if len(roots) == 1 else None
    if listed is None:
        return None
    one = SourceFile(listed, 0, 0, files[0].format, kind="hdfs")
    return table_function(one, fmt, structure), f"concat({quote_str(roots.pop())}, _path)"


def table_function(file: SourceFile, fmt: str, structure: str | None) -> str:
    """`hdfs('hdfs://host:port/path', 'Format', 'structure', 'compression')`."""
    args = [file.location or file.uri, fmt, structure or "auto", file.format.compression]
    return f"hdfs({', '.join(quote_str(a) for a in args)})"


class HdfsSource(RemoteSource):
    """hdfs://namenode:port/path: listed and read by the engine's hdfs()."""

    kind = "hdfs"
    schemes: tuple[str, ...] = ("hdfs",)
    options: tuple[str, ...] = ("follow", "poll")

    def list(self, pattern: str, context: SourceContext) -> Iterator[SourceFile]:
        if context.query is None:
            raise UsageError(f"{pattern}: listing HDFS needs an engine (SourceContext.query)")
        return list_hdfs(pattern, context.format, context.compression, context.query)

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        return table_function(file, fmt, structure)

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        return table_function_many(files, fmt, structure)


SOURCE = HdfsSource()
