"""HTTP to a ClickHouse server: the target URL, one client, and the one error boundary.

Our own small client (docs/target-server.md, "How it works inside", says why not
clickhouse-connect or http.client): HTTP/1.1 POST on a plain socket, the body streamed
from a file (os.sendfile where it can), keep-alive connections shared by the threads (a
request takes an idle one), the answer read whole; `ssl` imported for https targets only.

Invariants: every failure becomes a chload error here: socket / TLS / protocol errors ->
TransientError or UsageError (TLS, DNS); any non-200 answer -> errors.server_error, the
only reader of its text (18.16 sends no exception headers). The password leaves this
module only as a request header: every message passes through `TargetURL.scrub`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import socket
import stat
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, cast

if TYPE_CHECKING:
    import ssl

from chload.errors import (
    PASSWORD_ENV,
    ChloadError,
    SourceError,
    TransientError,
    UsageError,
    server_error,
)
from chload.runtime.monitor import CallStats

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 900.0  # the server answers an INSERT only once it has parsed the whole body
BLOCK_SIZE = 1 << 20  # bytes per send() when streaming a file body
# A keep-alive connection idle longer than this is replaced before use: servers close
# idle ones (18.16's keep_alive_timeout is 3 s), and a request on a closed one fails
# with a broken pipe that could not be told from a real failure.
IDLE_REUSE_SECONDS = 1.0



@dataclass(frozen=True, slots=True)
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
        """The same error (type and fields kept) with the password masked."""
        return error.masked(self.scrub)

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
    """Parse a --target URL; the password may come from `env`'s CLICKHOUSE_PASSWORD
    instead (the caller's environment, read once: targets.TargetSpec)."""
    env = {} if env is None else env
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
    """Thread-safe: a request takes an idle keep-alive connection (or opens one) and
    gives it back after the answer, so the connections open are at most the requests
    at once, whichever threads make them (a thread's own connection would outlive the
    thread: one per short-lived thread, each with its socket and read buffer, until
    close)."""

    def __init__(self, url: TargetURL) -> None:
        self.url = url
        self.stats = CallStats()  # requests; data: an INSERT with a body
        self._all: set[_Connection] = set()  # open: in use or idle
        self._idle: list[_Connection] = []  # kept alive, the last given back last
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
        head.update(headers or {})  # (auth as UTF-8 bytes: a header is latin-1 otherwise)
        if isinstance(body, bytes):
            head["Content-Length"] = str(len(body))
        elif length is not None:
            head["Content-Length"] = str(length)
        elif body is not None:
            head["Transfer-Encoding"] = "chunked"
        else:
            head["Content-Length"] = "0"
        data_request, began = query is not None, time.monotonic()
        try:
            status, data = self._send(path, body, head, length)
        except OSError as exc:
            raise _network_error(exc, self.url, context) from None
        finally:
            self.stats.add(time.monotonic() - began, data_request)
        if status != 200:
            error = server_error(status, data.decode(errors="replace"), context)
            raise self.url.scrubbed(error) from None
        return data

    def _send(self, path: str, body: Body, headers: dict[str, str | bytes],
              length: int | None) -> tuple[int, bytes]:
        conn = self._connection()
        try:
            status, data, keep = conn.post(path, headers, body, length)
        except BaseException:
            self._drop(conn)
            raise
        if keep:
            self._give_back(conn)
        else:
            self._drop(conn)
        return status, data

    # -- connections -----------------------------------------------------------------
    def _connection(self) -> _Connection:
        """The connection last given back, if idle for less than IDLE_REUSE_SECONDS
        (those given back before it then too long: closed), else a new one."""
        stale: list[_Connection] = []
        conn = None
        with self._guard:
            if self._idle:
                conn = self._idle.pop()
                if time.monotonic() - conn.used > IDLE_REUSE_SECONDS:
                    stale, self._idle, conn = [*self._idle, conn], [], None
                    self._all.difference_update(stale)
        for old in stale:
            old.close()
        if conn is None:
            conn = _Connection(self.url.host, self.url.port, self._tls)
            with self._guard:
                self._all.add(conn)
        return conn

    def _give_back(self, conn: _Connection) -> None:
        conn.used = time.monotonic()
        with self._guard:
            if conn in self._all:  # (not closed meanwhile: close)
                self._idle.append(conn)
                return
        conn.close()

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        with self._guard:
            self._all.discard(conn)

    def close(self) -> None:
        with self._guard:
            conns, self._all, self._idle = self._all, set(), []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()


class ConnectionClosed(ConnectionError):
    """The server closed the connection before a whole answer (or sent no HTTP)."""


class _Connection:
    """One HTTP/1.1 connection: POST with a body, the answer read whole."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        # An ASCII name goes as bytes (the resolver takes both; typeshed says str): as
        # str, it imports the idna codec first (at every start) to encode ASCII.
        address = (host.encode() if host.isascii() else host, port)
        sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT)  # type: ignore[arg-type]
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
            sock.settimeout(READ_TIMEOUT)
        except BaseException:
            sock.close()
            raise
        self.sock, self.tls = sock, tls is not None
        self.answers = sock.makefile("rb", buffering=1 << 16)
        self.host = (f"[{host}]" if ":" in host else host) + f":{port}"
        self.used = time.monotonic()  # when its last answer was read (_give_back)

    def post(self, path: str, headers: Mapping[str, str | bytes], body: Body,
             length: int | None) -> tuple[int, bytes, bool]:
        """Send one request; return (status, answer body, whether the connection stays)."""
        head = [f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n".encode()]
        for name, value in headers.items():
            head.append(name.encode() + b": " + (value if isinstance(value, bytes)
                                                 else value.encode("latin-1")) + b"\r\n")
        head.append(b"\r\n")
        self._body(b"".join(head), body, length)
        return self._answer()

    def _body(self, head: bytes, body: Body, length: int | None) -> None:
        sock = self.sock
        if body is None or isinstance(body, bytes):
            small = body is None or len(body) < 1 << 16  # one packet with the head
            sock.sendall(head + (body or b"") if small else head)
            if not small:
                sock.sendall(body)  # type: ignore[arg-type]
            return
        sock.sendall(head)
        if length is not None:  # a file object of known length
            source = cast(BinaryIO, body)
            sent = (sock.sendfile(source, source.tell(), length)  # (sendfile refuses 0)
                    if length and not self.tls and _is_regular(source)
                    else _copy(source, sock, length))
            if sent != length:
                raise SourceError(f"{getattr(body, 'name', 'body')}: {sent:,} bytes where "
                                  f"{length:,} were listed; the file changed while loading "
                                  "(load it again once it is complete)")
            return
        chunks: Iterable[bytes] = body
        if hasattr(body, "read"):  # a file object, length unknown
            chunks = iter(lambda: cast(BinaryIO, body).read(BLOCK_SIZE), b"")
        for chunk in chunks:
            if chunk:
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        sock.sendall(b"0\r\n\r\n")

    def _answer(self) -> tuple[int, bytes, bool]:
        while True:
            line = self.answers.readline(1 << 16)
            if not line:
                raise ConnectionClosed("connection closed by the server")
            version, _, rest = line.partition(b" ")
            if not version.startswith(b"HTTP/") or not rest[:3].isdigit():
                raise ConnectionClosed(f"not an HTTP answer: {line[:40]!r}")
            status = int(rest[:3])
            fields = self._fields()
            if status >= 200:
                break  # (1xx: informational, another status line follows)
        keep = (fields.get("connection", "").lower() != "close"
                and (version != b"HTTP/1.0" or "keep-alive" in fields.get("connection", "")))
        if "chunked" in fields.get("transfer-encoding", "").lower():
            return status, self._chunks(), keep
        if "content-length" in fields:
            size = int(fields["content-length"])
            data = self.answers.read(size)
            if len(data) != size:
                raise ConnectionClosed("connection closed by the server mid-answer")
            return status, data, keep
        return status, self.answers.read(), False  # to the close

    def _fields(self) -> dict[str, str]:
        fields: dict[str, str] = {}
        for _ in range(200):
            line = self.answers.readline(1 << 16)
            if line in (b"\r\n", b"\n"):
                return fields
            if not line:
                raise ConnectionClosed("connection closed by the server mid-answer")
            name, _, value = line.decode("latin-1").partition(":")
            fields[name.strip().lower()] = value.strip()
        raise ConnectionClosed("more than 200 header lines in an answer")

    def _chunks(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = self.answers.readline(1 << 16)
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise ConnectionClosed("connection closed by the server mid-answer") from None
            if size == 0:
                self._fields()  # trailers, up to the blank line
                return b"".join(parts)
            part = self.answers.read(size + 2)
            if len(part) != size + 2:
                raise ConnectionClosed("connection closed by the server mid-answer")
            parts.append(part[:size])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.answers.close()
        self.sock.close()


def _copy(source: BinaryIO, sock: socket.socket, length: int) -> int:
    """Send `length` bytes of `source` (TLS: no sendfile); return how many there were."""
    sent = 0
    while sent < length:
        block = source.read(min(BLOCK_SIZE, length - sent))
        if not block:
            break
        sock.sendall(block)
        sent += len(block)
    return sent


def _is_regular(body: object) -> bool:
    """A regular file (not a pipe): its bytes can go by os.sendfile."""
    try:
        return stat.S_ISREG(os.fstat(body.fileno()).st_mode)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False


def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Verification on, always; `ca_file` adds a private CA to the system's."""
    import ssl

    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def _network_error(exc: BaseException, url: TargetURL, context: str) -> ChloadError:
    server = f"server {url.host}:{url.port}"
    where = context if context == server else f"{context}: {server}"
    ssl = sys.modules.get("ssl")  # imported for https targets only
    if ssl is not None and isinstance(exc, ssl.SSLCertVerificationError):
        return UsageError(f"{where}: TLS certificate not trusted ({exc.verify_message}); "
                          "pass ?ca_file=/path/ca.pem in --target")
    if isinstance(exc, socket.gaierror):
        return UsageError(f"{where}: cannot resolve host name ({exc.strerror})")
    if ssl is not None and isinstance(exc, ssl.SSLError):
        return UsageError(f"{where}: TLS failed ({exc.reason or exc}); is it an https port?")
    reason = getattr(exc, "strerror", None) or type(exc).__name__
    if isinstance(exc, TimeoutError | socket.timeout):
        reason = "timed out"
    elif isinstance(exc, ConnectionClosed):
        reason = str(exc)
    return TransientError(url.scrub(f"{where} unreachable: {reason}"))
