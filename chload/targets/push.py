"""The loader's own engine for a server target: chDB in memory, for what the server can't do.

Two jobs: infer a schema (an old server cannot `DESCRIBE file(...)`), and read a file
the server cannot parse (Parquet, ORC, Avro; zstd, xz ... into 18.16), converting it to
`Native` and streaming that to the server:

    INSERT INTO FUNCTION url('http://host:port/?query=INSERT INTO stage (...) FORMAT Native',
                             'Native', '<the table's exact types>', '<body compression>',
                             headers(...))
    SELECT <columns, CAST to the table's types where they differ> FROM file(...)

Types must be the table's own: 18.16 does not convert Native columns (`Bad cast from
type ColumnVector<UInt32> to ColumnVector<UInt64>`, code 368). Text-to-DateTime
conversions run in the server's time zone (`session_timezone`) so both paths agree.
Over https the bytes go through our own client instead (chDB's url() cannot be given a
private CA): chDB streams Native blocks to Python, which forwards them, bounded.

No data path here: chDB keeps nothing (`:memory:`), one session per thread (a session
runs one query at a time; several run in parallel, see engine.py).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from chload.errors import ChloadError, TransientError, UsageError, from_engine_message
from chload.schema import AUDIT_COLUMNS, Column, quote_ident, quote_str, structure
from chload.sources import SourceFile, table_function
from chload.targets.http import HttpClient, TargetURL, server_error

# Settings of every push query (chDB side); user --setting values come after and win.
PUSH_SETTINGS: tuple[tuple[str, str], ...] = (
    ("input_format_parallel_parsing", "1"),
    ("http_receive_timeout", "900"),
    ("http_send_timeout", "900"),
)
_REMOTE_ERROR = re.compile(r"HTTP status code: (\d+)[^\n]*?body: '(.*)'", re.S)
_NETWORK = re.compile(r"Connection (refused|reset)|Timeout|timed out|Broken pipe|"
                      r"Network is unreachable|No route to host", re.I)


class LoaderEngine:
    """chDB in memory, one session per thread; imported on first use (~0.3 s)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._sessions: list[Any] = []
        self._guard = threading.Lock()

    def _session(self) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            _import_chdb()
            import chdb.session

            try:
                session = chdb.session.Session()
            except Exception as exc:  # chDB allows one data path per process
                raise UsageError(
                    f"cannot start the loader's engine ({str(exc).splitlines()[0]}); a process "
                    "can use an embedded target or a server target, not both") from exc
            with self._guard:
                self._sessions.append(session)
            self._local.session = session
        return session

    def rows(self, sql: str, context: str) -> list[dict[str, Any]]:
        text = self._run(sql, "JSONEachRow", context).bytes().decode()
        return [json.loads(line) for line in text.splitlines() if line]

    def execute(self, sql: str, context: str, url: TargetURL | None = None) -> tuple[int, int]:
        """Run a write (a push); return (rows written, bytes read from the source)."""
        result = self._run(sql, "TSV", context, url)
        return int(result.rows_written()), int(result.storage_bytes_read())

    def stream(self, sql: str, context: str) -> Iterator[bytes]:
        """The answer of `sql` in Native, block by block (bounded memory)."""
        try:
            for chunk in self._session().send_query(sql, "Native"):
                yield chunk.bytes()
        except Exception as exc:
            raise from_engine_message(str(exc), context) from exc

    def _run(self, sql: str, fmt: str, context: str, url: TargetURL | None = None) -> Any:
        try:
            return self._session().query(sql, fmt)
        except ChloadError:
            raise
        except Exception as exc:  # chdb raises ChdbError / RuntimeError with the engine text
            raise push_error(str(exc), context, url) from exc

    def close(self) -> None:
        with self._guard:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()


def _import_chdb() -> None:
    """Import chDB without pyarrow: chDB treats it as optional (Arrow results only, which
    chload never asks for), and importing it (and numpy) costs 0.1-0.3 s of every run's
    start. Only while chDB imports; a later `import pyarrow` works as usual."""
    if "chdb.session" in sys.modules or "pyarrow" in sys.modules:
        return
    sys.modules["pyarrow"] = None  # type: ignore[assignment]
    try:
        import chdb.session  # noqa: F401
    finally:
        if sys.modules.get("pyarrow", 0) is None:
            del sys.modules["pyarrow"]


def push_error(message: str, context: str, url: TargetURL | None) -> ChloadError:
    """A chDB error, which may carry the server's answer to the push (`body: '...'`)."""
    remote = _REMOTE_ERROR.search(message)
    if remote:
        error = server_error(int(remote.group(1)), remote.group(2), context)
    elif "POCO_EXCEPTION" in message and _NETWORK.search(message) and url is not None:
        reason = _NETWORK.search(message).group(0).lower()  # type: ignore[union-attr]
        error = TransientError(f"{context}: server {url.host}:{url.port} unreachable: {reason}")
    else:
        error = from_engine_message(message, context)
    return url.scrubbed(error) if url is not None else error


def select_sql(file: SourceFile, columns: Sequence[Column], read_columns: Sequence[Column],
               audit_types: dict[str, str] | None) -> str:
    """`SELECT <table columns> FROM <file>`: cast where the read type is not the table's."""
    read = {c.name: c.type for c in read_columns}
    exprs = []
    for c in columns:
        ident = quote_ident(c.name)
        same = read.get(c.name, c.type) == c.type
        exprs.append(ident if same else f"CAST({ident}, {quote_str(c.type)}) AS {ident}")
    if audit_types is not None:
        source = "_path" if not file.is_stream else quote_str(file.uri)
        for name, expr in zip(AUDIT_COLUMNS, (source, "now()"), strict=True):
            exprs.append(f"CAST({expr}, {quote_str(audit_types[name])}) AS {quote_ident(name)}")
    reader = table_function(file, file.format.name, structure(read_columns))
    return f"SELECT {', '.join(exprs)} FROM {reader}"


def push_sql(url: TargetURL, insert: str, columns: Sequence[Column], select: str,
             compression: str, settings: Sequence[tuple[str, str]],
             server_settings: Mapping[str, str] | None = None) -> str:
    """chDB's INSERT INTO FUNCTION url(...) that sends `select` as Native to `insert`
    (`server_settings` apply to the server's INSERT)."""
    params = urllib.parse.urlencode({"query": insert, **(server_settings or {})})
    headers = ", ".join(f"{quote_str(k)}={quote_str(v)}" for k, v in url.auth_headers().items())
    target = (f"url({quote_str(f'{url.base}/?{params}')}, 'Native', "
              f"{quote_str(structure(columns))}, {quote_str(compression)}, headers({headers}))")
    return f"INSERT INTO FUNCTION {target} {select} SETTINGS {settings_sql(settings)}"


def settings_sql(settings: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{k} = {_value(v)}" for k, v in settings)


def _value(value: str) -> str:
    return value if value.lstrip("-").replace(".", "", 1).isdigit() else quote_str(value)


def stream_push(engine: LoaderEngine, client: HttpClient, insert: str, select: str,
                settings: Sequence[tuple[str, str]], context: str,
                server_settings: Mapping[str, str] | None = None) -> None:
    """Push through our own client: chDB -> Native blocks -> chunked HTTP body (https)."""
    blocks = engine.stream(f"{select} SETTINGS {settings_sql(settings)}", context)
    client.request(insert, blocks, context=context, params=server_settings)
