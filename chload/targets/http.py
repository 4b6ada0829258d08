"""HTTP to a ClickHouse server: the target URL, one client, and the one error boundary.

Why our own small client (on `http.client`) rather than a library: clickhouse-connect
fails against 18.16 ("Unknown identifier: readonly"), and a loader needs exactly three
things from HTTP that are easy to get right here: stream a request body from a file
(never holding it in memory), keep one keep-alive connection per thread, and turn every
failure into a chload error in one place:

    socket / TLS / http.client errors      -> TransientError (retry) or UsageError (TLS, DNS)
    HTTP 401/403, codes 192-195, 497, 516  -> AuthError (terminal, names the user only)
    5xx with a transient `Code: NNN`       -> TransientError (159, 209, 210, 252, ...)
    anything else the server answers       -> errors.from_engine_message (terminal kinds)

18.16 sends no exception headers, so the code comes from the body text
(`Code: 60, e.displayText() = DB::Exception: ...`). The password never leaves this
module except as a request header: every message passes through `TargetURL.scrub`.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import re
import socket
import ssl
import stat
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO

from chload.errors import (
    ChloadError,
    SourceError,
    TerminalError,
    TransientError,
    UsageError,
    from_engine_message,
    one_line,
)

PASSWORD_ENV = "CLICKHOUSE_PASSWORD"
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 900.0  # the server answers an INSERT only once it has parsed the whole body
BLOCK_SIZE = 1 << 20  # bytes per send() when streaming a file body
# A keep-alive connection idle longer than this is replaced before use: servers close
# idle ones (18.16's keep_alive_timeout is 3 s), and a request on a closed one fails
# with a broken pipe that could not be told from a real failure.
IDLE_REUSE_SECONDS = 1.0

# ClickHouse codes in a server's answer that a retry can cure.
_TRANSIENT_CODES = {159, 202, 203, 209, 210, 241, 242, 252, 285, 319, 394, 425}
# TIMEOUT_EXCEEDED, TOO_MANY_SIMULTANEOUS_QUERIES, NO_FREE_CONNECTION, SOCKET_TIMEOUT,
# NETWORK_ERROR, MEMORY_LIMIT_EXCEEDED, TABLE_IS_READ_ONLY, TOO_MANY_PARTS, ...
_AUTH_CODES = {192, 193, 194, 195, 497, 516}  # UNKNOWN_USER, WRONG_PASSWORD, ... ACCESS_DENIED
_CODE = re.compile(r"Code:\s*(\d+)")


class AuthError(TerminalError):
    """The server refused the user or password."""


@dataclass(frozen=True)
class TargetURL:
    """`http(s)://[user[:password]@]host:port[/database][?ca_file=/ca.pem&path=push]`."""

    scheme: str
    host: str
    port: int
    user: str
    database: str
    password: str = field(default="", repr=False)
    ca_file: str | None = None
    path: str = "auto"  # how files travel: auto (raw where the server parses), or push

    @property
    def secure(self) -> bool:
        return self.scheme == "https"

    @property
    def display(self) -> str:
        """The URL without the password (for messages, reports and the ledger)."""
        return f"{self.scheme}://{self.user}@{self.host}:{self.port}/{self.database}"

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return self.host in ("localhost", "::1") or self.host.startswith("127.")

    def auth_headers(self) -> dict[str, str]:
        return {"X-ClickHouse-User": self.user, "X-ClickHouse-Key": self.password}

    def scrubbed(self, error: ChloadError) -> ChloadError:
        """The same error (type and attributes kept) with the password masked."""
        error.args = tuple(self.scrub(a) if isinstance(a, str) else a for a in error.args)
        return error

    def scrub(self, text: str) -> str:
        """`text` with the password (and its URL-encoded and base64 forms) masked."""
        if not self.password:
            return text
        forms = {self.password, urllib.parse.quote(self.password, safe=""),
                 urllib.parse.quote_plus(self.password),
                 base64.b64encode(f"{self.user}:{self.password}".encode()).decode()}
        for secret in sorted(forms, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text


def parse_target_url(value: str, env: Mapping[str, str] | None = None) -> TargetURL:
    """Parse a --target URL; the password may come from $CLICKHOUSE_PASSWORD instead."""
    env = os.environ if env is None else env
    parts = urllib.parse.urlsplit(value)
    safe = f"{parts.scheme}://{parts.hostname or '?'}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--target {safe}: use http(s)://[user@]host:port[/database]")
    try:
        port = parts.port or (8443 if parts.scheme == "https" else 8123)
    except ValueError:
        raise UsageError(f"--target {safe}: the port is not a number") from None
    database = parts.path.strip("/") or "default"
    if "/" in database or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", database):
        raise UsageError(f"--target {safe}: '{database}' is not a database name")
    options = urllib.parse.parse_qs(parts.query)
    unknown = sorted(set(options) - {"ca_file", "path"})
    if unknown:
        raise UsageError(f"--target {safe}: unknown option {', '.join(unknown)} "
                         "(known: ca_file, path)")
    path = options.get("path", ["auto"])[-1]
    if path not in ("auto", "push"):
        raise UsageError(f"--target {safe}: path={path}; use auto or push")
    ca_file = options.get("ca_file", [None])[-1]
    if ca_file and not os.path.isfile(ca_file):
        raise UsageError(f"--target {safe}: ca_file {ca_file} is not a file")
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return TargetURL(
        parts.scheme, parts.hostname, port, urllib.parse.unquote(parts.username or "default"),
        database, password if password is not None else env.get(PASSWORD_ENV, ""), ca_file,
        path,
    )


Body = bytes | BinaryIO | Iterable[bytes] | None


class HttpClient:
    """Thread-safe: each thread keeps its own keep-alive connection."""

    def __init__(self, url: TargetURL) -> None:
        self.url = url
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._guard = threading.Lock()
        self._tls = _tls_context(url.ca_file) if url.secure else None

    # -- requests --------------------------------------------------------------------
    def post(self, sql: str, *, context: str, params: Mapping[str, str] | None = None,
             fmt: str | None = None, query_id: str | None = None,
             in_database: bool = False) -> bytes:
        """Run one statement (sent as the body, so its length is not limited).

        chload's own statements name every table in full, so they work before the URL's
        database exists; `in_database` makes it the default one (the user's SQL).
        """
        args = dict(params or {})
        if in_database:
            args["database"] = self.url.database
        if fmt:
            args["default_format"] = fmt
        if query_id:
            args["query_id"] = query_id
        return self.request(None, sql.encode(), params=args, context=context)

    def request(self, query: str | None, body: Body, *, context: str,
                params: Mapping[str, str] | None = None,
                headers: Mapping[str, str] | None = None, length: int | None = None) -> bytes:
        """POST `body` (bytes, a file object, or an iterable of chunks) and return the answer.

        With `query`, the statement goes in the URL and `body` is its data (INSERT).
        """
        args = dict(params or {})
        if query is not None:
            args["query"] = query
        path = "/?" + urllib.parse.urlencode(args)
        head: dict[str, str | bytes] = {k: v.encode() for k, v in self.url.auth_headers().items()}
        head.update(headers or {})  # (auth as UTF-8 bytes: http.client would try latin-1)
        if isinstance(body, bytes):
            head["Content-Length"] = str(len(body))
        elif length is not None:
            head["Content-Length"] = str(length)
        elif body is not None:
            head["Transfer-Encoding"] = "chunked"
        try:
            status, data = self._send(path, body, head, chunked="Transfer-Encoding" in head,
                                      length=length)
        except (OSError, http.client.HTTPException) as exc:
            raise _network_error(exc, self.url, context) from None
        if status != 200:
            error = server_error(status, data.decode(errors="replace"), context)
            raise self.url.scrubbed(error) from None
        return data

    def _send(self, path: str, body: Body, headers: dict[str, str | bytes],
              chunked: bool, length: int | None) -> tuple[int, bytes]:
        conn = self._connection()
        try:
            if _sendfile(body, length) and self._tls is None:
                # A local file of known length: the kernel copies it to the socket
                # (os.sendfile), no pass through Python's buffers.
                conn.request("POST", path, body=None, headers=headers)
                assert conn.sock is not None and length is not None
                sent = conn.sock.sendfile(body, body.tell(), length)  # type: ignore[arg-type,union-attr]
                if sent != length:
                    raise SourceError(f"{body.name}: {sent:,} bytes where {length:,} were "  # type: ignore[union-attr]
                                      "listed; the file changed while loading")
            else:
                conn.request("POST", path, body=body, headers=headers,
                             encode_chunked=chunked)
            response = conn.getresponse()
            data = response.read()
        except BaseException:
            self._drop(conn)
            raise
        if response.will_close:
            self._drop(conn)
        self._local.used = time.monotonic()
        return response.status, data

    # -- connections -----------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and time.monotonic() - self._local.used > IDLE_REUSE_SECONDS:
            self._drop(conn)
            conn = None
        if conn is None:
            if self._tls is not None:
                conn = http.client.HTTPSConnection(self.url.host, self.url.port,
                                                   timeout=CONNECT_TIMEOUT, context=self._tls,
                                                   blocksize=BLOCK_SIZE)
            else:
                conn = http.client.HTTPConnection(self.url.host, self.url.port,
                                                  timeout=CONNECT_TIMEOUT, blocksize=BLOCK_SIZE)
            conn.connect()
            if conn.sock is not None:
                conn.sock.settimeout(READ_TIMEOUT)
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._guard:
                self._all.append(conn)
            self._local.conn = conn
        self._local.used = time.monotonic()
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    def close(self) -> None:
        with self._guard:
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()


def _sendfile(body: Body, length: int | None) -> bool:
    """A regular file whose `length` bytes from here on can go by os.sendfile."""
    if length is None or not hasattr(body, "fileno") or not hasattr(body, "tell"):
        return False
    try:
        return stat.S_ISREG(os.fstat(body.fileno()).st_mode)  # type: ignore[union-attr]
    except (OSError, ValueError):
        return False


def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Verification on, always; `ca_file` adds a private CA to the system's."""
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def error_code(text: str) -> int | None:
    match = _CODE.search(text)
    return int(match.group(1)) if match else None


def normalize(text: str) -> str:
    """An 18.16 error body in the modern shape `errors.one_line` expects."""
    text = text.strip()
    text = re.sub(r"^Code:\s*(\d+),\s*e\.displayText\(\) = ", r"Code: \1. ", text)
    text = re.sub(r",\s*e\.what\(\) = DB::\w*Exception\s*$", "", text, flags=re.M)
    return text


def server_error(status: int, body: str, context: str) -> ChloadError:
    """The chload error for a non-200 answer; `context` starts the message."""
    code = error_code(body)
    text = normalize(body) or f"HTTP {status}"
    if status in (401, 403) or code in _AUTH_CODES:
        return AuthError(f"{context}: authentication failed ({one_line(text)}); check the "
                         f"user and password in --target or ${PASSWORD_ENV}")
    if code in _TRANSIENT_CODES or (code is None and status >= 500):
        return TransientError(f"{context}: {one_line(text)}")
    return from_engine_message(text, context)


def _network_error(exc: BaseException, url: TargetURL, context: str) -> ChloadError:
    server = f"server {url.host}:{url.port}"
    where = context if context == server else f"{context}: {server}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return UsageError(f"{where}: TLS certificate not trusted ({exc.verify_message}); "
                          "pass ?ca_file=/path/ca.pem in --target")
    if isinstance(exc, socket.gaierror):
        return UsageError(f"{where}: cannot resolve host name ({exc.strerror})")
    if isinstance(exc, ssl.SSLError):
        return UsageError(f"{where}: TLS failed ({exc.reason or exc}); is it an https port?")
    reason = getattr(exc, "strerror", None) or type(exc).__name__
    if isinstance(exc, TimeoutError | socket.timeout):
        reason = "timed out"
    elif isinstance(exc, http.client.RemoteDisconnected | http.client.IncompleteRead):
        reason = "connection closed by the server"
    return TransientError(url.scrub(f"{where} unreachable: {reason}"))
