"""The loader's own engine for a server target: chDB in memory, for what the server can't do.

Two jobs: infer a schema (an old server cannot `DESCRIBE file(...)`), and read a file the
server cannot parse (Parquet, ORC, Avro; zstd, xz ... into 18.16) into `Native` streamed
to the server by `INSERT INTO FUNCTION url(...) SELECT ... FROM file(...)`; over https
chDB streams Native blocks to Python, which forwards them, bounded.

Invariants: columns are sent in the table's own types (18.16 does not convert Native
columns: code 368); text-to-DateTime runs in the server's time zone (`session_timezone`)
so both paths agree; one engine session per thread (a session runs one query at a time).
docs/target-server.md ("How it works inside") says why.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence

from chload.core.reading import fit
from chload.errors import ChloadError, from_push_message
from chload.runtime.engine import Engine
from chload.schema import (
    AUDIT_COLUMNS,
    Column,
    quote_ident,
    quote_str,
    settings_sql,
    structure,
)
from chload.sources.base import SourceFile
from chload.sources.registry import table_function, table_function_many
from chload.targets.server.http import HttpClient, TargetURL

# Settings of every push query (chDB side); user --setting values come after and win.
PUSH_SETTINGS: tuple[tuple[str, str], ...] = (
    ("input_format_parallel_parsing", "1"),
    ("http_receive_timeout", "900"),
    ("http_send_timeout", "900"),
)


def push_error(message: str, context: str, url: TargetURL | None) -> ChloadError:
    """A chDB error, which may carry the server's answer to the push
    (errors.from_push_message), with the password masked."""
    error = from_push_message(message, context, f"{url.host}:{url.port}" if url else None)
    return url.scrubbed(error) if url is not None else error


def select_sql(file: SourceFile, columns: Sequence[Column], read_columns: Sequence[Column],
               audit_types: dict[str, str] | None) -> str:
    """`SELECT <table columns> FROM <file>`: cast where the read type is not the table's."""
    source = "_path" if file.local_path in (None, file.uri) else quote_str(file.uri)
    exprs = _exprs(columns, read_columns, audit_types, source)
    reader = table_function(file, file.format.name, structure(read_columns))
    return f"SELECT {', '.join(exprs)} FROM {reader}"


def select_many_sql(files: Sequence[SourceFile], columns: Sequence[Column],
                    read_columns: Sequence[Column], audit_types: dict[str, str] | None,
                    tag: str) -> str | None:
    """select_sql over several files read by one table function, each row's uri as
    `tag`; None when they cannot share one (sources.table_function_many)."""
    if len({f.format for f in files}) != 1:
        return None
    many = table_function_many(files, files[0].format.name, structure(read_columns))
    if many is None:
        return None
    reader, uri = many
    exprs = _exprs(columns, read_columns, audit_types, "_path")
    return f"SELECT {', '.join(exprs)}, {uri} AS {tag} FROM {reader}"


def _exprs(columns: Sequence[Column], read_columns: Sequence[Column],
           audit_types: dict[str, str] | None, source: str) -> list[str]:
    read = {c.name: c.type for c in read_columns}
    exprs = []
    for c in columns:
        ident = quote_ident(c.name)
        same = read.get(c.name, c.type) == c.type
        checked = fit.insert_expr(ident, read.get(c.name, c.type), c.type)
        exprs.append(ident if same else checked or f"CAST({ident}, {quote_str(c.type)}) AS {ident}")
    if audit_types is not None:
        for name, expr in zip(AUDIT_COLUMNS, (source, "now()"), strict=True):
            exprs.append(f"CAST({expr}, {quote_str(audit_types[name])}) AS {quote_ident(name)}")
    return exprs


def push_sql(url: TargetURL, insert: str, columns: Sequence[Column], select: str,
             compression: str, settings: Sequence[tuple[str, str]],
             server_settings: Mapping[str, str] | None = None) -> str:
    """chDB's INSERT INTO FUNCTION url(...) that sends `select` as Native to `insert`
    (`server_settings` apply to the server's INSERT)."""
    target = (f"url({_url_args(url, insert, server_settings)}, 'Native', "
              f"{quote_str(structure(columns))}, {quote_str(compression)}, "
              f"{_headers(url)})")
    return f"INSERT INTO FUNCTION {target} {select} SETTINGS {settings_sql(settings)}"


def push_url(url: TargetURL, insert: str, compression: str,
             server_settings: Mapping[str, str] | None = None) -> str:
    """`URL(...)`: the engine of a table in the loader's engine whose inserts the
    server runs as `insert` (FORMAT Native), one request per INSERT."""
    return (f"URL({_url_args(url, insert, server_settings)}, 'Native', "
            f"{quote_str(compression)}, {_headers(url)})")


def _url_args(url: TargetURL, insert: str, server_settings: Mapping[str, str] | None) -> str:
    params = urllib.parse.urlencode({"query": insert, **(server_settings or {})})
    return quote_str(f"{url.base}/?{params}")


def _headers(url: TargetURL) -> str:
    pairs = ", ".join(f"{quote_str(k)}={quote_str(v)}" for k, v in url.auth_headers().items())
    return f"headers({pairs})"




def stream_push(engine: Engine, client: HttpClient, insert: str, select: str,
                settings: Sequence[tuple[str, str]], context: str,
                server_settings: Mapping[str, str] | None = None) -> None:
    """Push through our own client: chDB -> Native blocks -> chunked HTTP body (https)."""
    blocks = engine.stream(f"{select} SETTINGS {settings_sql(settings)}", context)
    client.request(insert, blocks, context=context, params=server_settings)
