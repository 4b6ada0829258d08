"""The server target's HTTP boundary: target URLs, secrets, and every failure turned into
one chload error (fakes: a scripted local HTTP(S) server; the real 18.16 is in
tests/integration/test_server_target.py)."""

from __future__ import annotations

import gzip
import http.server
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chload.errors import (
    AuthError,
    DataError,
    SchemaError,
    SourceError,
    TransientError,
    UsageError,
    normalize,
    server_error,
)
from chload.runtime.retry import RetryPolicy, call_with_retries
from chload.targets.server.http import HttpClient, TargetURL, parse_target_url

# -- target URLs ----------------------------------------------------------------------

def test_url_parts_and_defaults() -> None:
    url = parse_target_url("http://loader:s%40cret@ch.example:8123/analytics", env={})
    assert (url.user, url.password, url.host, url.port, url.database) == (
        "loader", "s@cret", "ch.example", 8123, "analytics")
    assert url.display == "http://loader@ch.example:8123/analytics"
    bare = parse_target_url("https://ch.example", env={})
    assert (bare.user, bare.port, bare.database, bare.secure) == ("default", 8443, "default", True)
    assert bare.path == "auto" and parse_target_url("http://h/d?path=push", env={}).path == "push"


def test_password_from_the_environment_never_in_display_or_repr() -> None:
    url = parse_target_url("http://loader@h:1/db", env={"CLICKHOUSE_PASSWORD": "hunter2"})
    assert url.password == "hunter2"
    assert "hunter2" not in url.display + repr(url)
    assert parse_target_url("http://u:inline@h:1/", env={"CLICKHOUSE_PASSWORD": "x"}).password \
        == "inline"


@pytest.mark.parametrize("value, message", [
    ("ftp://h/db", r"use http\(s\)://"),
    ("http://u:pw@h:notaport/", "not a number"),
    ("http://h:1/a/b", "not a database name"),
    ("http://h:1/db?verify=0", "unknown option verify"),
    ("http://h:1/db?ca_file=/nonexistent.pem", "is not a file"),
    ("http://h:1/db?path=fast", "path=fast; use auto or push"),
])
def test_bad_urls_are_usage_errors_without_the_password(value: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_target_url(value, env={})
    assert "pw" not in str(info.value)


def test_scrub_masks_every_form_of_the_password() -> None:
    url = TargetURL("http", "h", 1, "u", "db", password="p@ss word")
    text = "a p@ss word b p%40ss%20word c p%40ss+word d " + "dTpwQHNzIHdvcmQ="
    assert url.scrub(text) == "a *** b *** c *** d ***"


# -- server answers ---------------------------------------------------------------------

OLD = "Code: {}, e.displayText() = DB::Exception: {}, e.what() = DB::Exception\n"


def test_18_16_bodies_become_one_modern_line() -> None:
    body = OLD.format(60, "Table db.t doesn't exist.")
    assert normalize(body) == "Code: 60. DB::Exception: Table db.t doesn't exist."
    error = server_error(404, body, "trips.csv.gz")
    assert isinstance(error, SchemaError)
    assert str(error) == "trips.csv.gz: Table db.t doesn't exist"


@pytest.mark.parametrize("status, code, kind", [
    (500, 252, TransientError), (500, 159, TransientError), (500, 209, TransientError),
    (500, 210, TransientError), (503, None, TransientError), (500, 27, DataError),
    (401, 193, AuthError), (500, 192, AuthError), (500, 516, AuthError),
])
def test_codes_decide_transient_or_terminal(status: int, code: int | None, kind: type) -> None:
    body = OLD.format(code, "something") if code else "Service Unavailable"
    assert isinstance(server_error(status, body, "f"), kind)


def test_auth_error_names_the_user_source_of_password_not_the_password() -> None:
    error = server_error(401, OLD.format(193, "Wrong password for user loader"), "server h:1")
    assert str(error) == ("server h:1: authentication failed (Wrong password for user "
                          "loader); check the user and password in --target or "
                          "$CLICKHOUSE_PASSWORD")


# -- the client against a scripted server ------------------------------------------------

class Script(http.server.BaseHTTPRequestHandler):
    answers: list[tuple[int, bytes]] = []
    seen: list[dict] = []
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while (size := int(self.rfile.readline().strip(), 16)) > 0:
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append({"path": self.path, "headers": dict(self.headers), "body": body,
                          "peer": self.client_address})
        status, answer = self.answers.pop(0) if self.answers else (200, b"ok\n")
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[http.server.ThreadingHTTPServer]:
    Script.answers, Script.seen = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def client_for(server: http.server.ThreadingHTTPServer, password: str = "pw") -> HttpClient:
    port = server.server_address[1]
    return HttpClient(TargetURL("http", "127.0.0.1", port, "loader", "db", password=password))


def test_statements_go_in_the_body_with_auth_headers(fake: http.server.ThreadingHTTPServer) \
        -> None:
    client = client_for(fake)
    assert client.post("SELECT 1", context="x", fmt="TSV") == b"ok\n"
    request = Script.seen[0]
    assert request["body"] == b"SELECT 1" and "default_format=TSV" in request["path"]
    assert request["headers"]["X-ClickHouse-User"] == "loader"
    assert request["headers"]["X-ClickHouse-Key"] == "pw"
    assert "database=" not in request["path"]  # chload's own SQL names tables in full
    client.post("SELECT 2", context="x", in_database=True)
    assert "database=db" in Script.seen[1]["path"]
    client.close()


def test_threads_that_come_and_go_reuse_one_connection(
        fake: http.server.ThreadingHTTPServer) -> None:
    """A cluster load asks each shard from threads that end after the unit: a connection
    per thread would stay open (socket and read buffer) until the run's end."""
    client = client_for(fake)
    for i in range(20):  # one short-lived thread after another
        thread = threading.Thread(target=lambda i=i: client.post(f"SELECT {i}", context="x"))
        thread.start()
        thread.join()
    assert len(Script.seen) == 20
    assert len({r["peer"] for r in Script.seen}) == 1
    client.close()
    assert client.post("SELECT 1", context="x") == b"ok\n"  # (a new one after close)
    assert len({r["peer"] for r in Script.seen}) == 2
    client.close()


def test_requests_at_once_each_have_a_connection_of_their_own(
        fake: http.server.ThreadingHTTPServer) -> None:
    client = client_for(fake)
    ready = threading.Barrier(3)

    def ask(i: int) -> None:
        conn = client._connection()  # (held, as during a request)
        ready.wait()
        client._give_back(conn)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(client._idle) == 3 and len(client._all) == 3
    for i in range(6):
        client.post(f"SELECT {i}", context="x")
    assert len({r["peer"] for r in Script.seen}) == 1  # (the last given back, reused)
    client.close()


def test_a_file_streams_with_its_content_encoding(fake: http.server.ThreadingHTTPServer,
                                                   tmp_path: Path) -> None:
    data = gzip.compress(b"a,b\n1,2\n" * 1000)
    (tmp_path / "f.csv.gz").write_bytes(data)
    client = client_for(fake)
    with open(tmp_path / "f.csv.gz", "rb") as body:
        client.request("INSERT INTO t FORMAT CSV", body, length=len(data), context="f",
                       headers={"Content-Encoding": "gzip"})
    request = Script.seen[0]
    assert request["body"] == data and request["headers"]["Content-Encoding"] == "gzip"
    assert "query=INSERT+INTO+t+FORMAT+CSV" in request["path"]
    client.request("INSERT INTO t FORMAT Native", iter([b"ab", b"cd"]), context="push")
    assert Script.seen[1]["body"] == b"abcd"  # chunked


def test_a_file_shorter_than_listed_is_a_source_error(fake: http.server.ThreadingHTTPServer,
                                                     tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_bytes(b"a,b\n1,2\n")
    with open(tmp_path / "f.csv", "rb") as body, pytest.raises(SourceError) as info:
        client_for(fake).request("INSERT INTO t FORMAT CSV", body, length=100, context="f")
    assert str(info.value).endswith("f.csv: 8 bytes where 100 were listed; the file changed "
                                    "while loading (load it again once it is complete)")


def test_server_errors_are_one_line_and_scrubbed(fake: http.server.ThreadingHTTPServer) -> None:
    Script.answers = [(500, OLD.format(27, "Cannot parse input: pw-is-secret at row 3")
                       .encode())]
    client = client_for(fake, password="pw-is-secret")
    with pytest.raises(DataError) as info:
        client.post("INSERT", context="bad.csv")
    assert str(info.value) == "bad.csv: Cannot parse input: *** at row 3"


def test_transient_answers_are_retried_then_succeed(fake: http.server.ThreadingHTTPServer) \
        -> None:
    Script.answers = [(500, OLD.format(252, "Too many parts").encode()),
                      (500, OLD.format(210, "Connection reset").encode()), (200, b"1\n")]
    client = client_for(fake)
    sleeps: list[float] = []
    got = call_with_retries(lambda: client.post("SELECT 1", context="q"),
                            RetryPolicy(attempts=5), sleeps.append)
    assert got == b"1\n" and len(sleeps) == 2


def test_terminal_answers_are_not_retried(fake: http.server.ThreadingHTTPServer) -> None:
    Script.answers = [(404, OLD.format(60, "Table x.y doesn't exist.").encode())]
    client = client_for(fake)
    sleeps: list[float] = []
    with pytest.raises(SchemaError):
        call_with_retries(lambda: client.post("INSERT", context="f"), RetryPolicy(), sleeps.append)
    assert sleeps == []


def test_refused_connection_is_transient_and_one_line() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = HttpClient(TargetURL("http", "127.0.0.1", port, "u", "db", password="pw"))
    with pytest.raises(TransientError) as info:
        client.post("SELECT 1", context=f"server 127.0.0.1:{port}")
    assert str(info.value) == f"server 127.0.0.1:{port} unreachable: Connection refused"


def test_dropped_connection_mid_answer_is_transient(fake: http.server.ThreadingHTTPServer) \
        -> None:
    class Drop(Script):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            self.close_connection = True

    fake.RequestHandlerClass = Drop
    with pytest.raises(TransientError, match="unreachable: connection closed by the server"):
        client_for(fake).post("SELECT 1", context="q")


# -- TLS: verification on, a private CA through ?ca_file= --------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("openssl"):
        pytest.fail("openssl is needed to make a test CA (apt-get install openssl)")
    d = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test CA",
        "-keyout", "ca.key", "-out", "ca.pem")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout",
        "server.key", "-out", "server.csr")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.pem")
    return d


@pytest.fixture
def tls_fake(certs: Path, fake: http.server.ThreadingHTTPServer) \
        -> http.server.ThreadingHTTPServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs / "server.pem", certs / "server.key")
    fake.socket = context.wrap_socket(fake.socket, server_side=True)
    return fake


def test_tls_is_verified_and_a_ca_file_makes_it_trusted(
        tls_fake: http.server.ThreadingHTTPServer, certs: Path) -> None:
    port = tls_fake.server_address[1]
    untrusted = parse_target_url(f"https://u:pw@127.0.0.1:{port}/db", env={})
    with pytest.raises(UsageError, match="TLS certificate not trusted.*ca_file"):
        HttpClient(untrusted).post("SELECT 1", context="q")
    trusted = parse_target_url(f"https://u:pw@127.0.0.1:{port}/db?ca_file={certs}/ca.pem",
                               env={})
    client = HttpClient(trusted)
    assert client.post("SELECT 1", context="q") == b"ok\n"
    data = gzip.compress(b"a,b\n1,2\n" * 50_000)  # over TLS a file is copied, not sendfile'd
    (certs / "f.csv.gz").write_bytes(data)
    with open(certs / "f.csv.gz", "rb") as body:
        client.request("INSERT INTO t FORMAT CSV", body, length=len(data), context="f")
    assert Script.seen[-1]["body"] == data


# -- the wire: answers as servers send them -------------------------------------------

def scripted(answers: list[bytes]) -> tuple[int, list[bytes]]:
    """A raw TCP server on one connection: reads each request whole, sends the next
    scripted bytes; returns its port and the requests it read."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn, conn.makefile("rb") as reader:
            for answer in answers:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    head += reader.readline()
                size = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                requests.append(head + reader.read(size))
                conn.sendall(answer)
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], requests


def test_chunked_sized_and_informational_answers_on_one_connection() -> None:
    port, requests = scripted([
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-ClickHouse-Summary: {}\r\n\r\n"
        b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nTrailer: x\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
        b"HTTP/1.0 200 OK\r\n\r\nto the close",
    ])
    client = HttpClient(TargetURL("http", "127.0.0.1", port, "u", "db", password="pw"))
    assert client.post("SELECT 1", context="q") == b"abcdefg"
    assert client.post("SELECT 2", context="q") == b"hi"
    assert client.post("SELECT 3", context="q") == b"to the close"
    assert len(requests) == 3  # one connection, kept alive until the 1.0 answer
    assert requests[0].startswith(b"POST /? HTTP/1.1\r\nHost: 127.0.0.1:")
    assert requests[0].endswith(b"\r\n\r\nSELECT 1")


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    b"SSH-2.0-OpenSSH\r\n",
    b"",
])
def test_a_cut_or_foreign_answer_is_transient(answer: bytes) -> None:
    port, _ = scripted([answer])
    client = HttpClient(TargetURL("http", "127.0.0.1", port, "u", "db", password="pw"))
    with pytest.raises(TransientError, match=f"server 127.0.0.1:{port} unreachable"):
        client.post("SELECT 1", context=f"server 127.0.0.1:{port}")


@pytest.mark.parametrize("files, cores, streams", [
    (10, 2, 5),  # two even rounds, not 8 then 2
    (8, 2, 8), (16, 2, 8), (20, 2, 7), (3, 2, 3), (1, 2, 1), (0, 2, 1),
    (10, 1, 4),  # 4 per core at most
    (100, 64, 8),  # 8 in all at most
])
def test_streams_fill_the_server_in_even_rounds(files: int, cores: int, streams: int) -> None:
    from chload.targets.server.stages import streams_for

    assert streams_for(files, cores) == streams


def test_files_beyond_the_streams_create_their_stage_once_every_stream_has_begun() -> None:
    from chload.targets.server.stages import Streams

    streams = Streams(2)
    streams.stage_turn()
    streams.stage_turn()  # the two streams' files: at once
    staged = threading.Event()
    extra = threading.Thread(target=lambda: (streams.stage_turn(), staged.set()))
    extra.start()
    assert not staged.wait(0.1)  # the third file waits ...
    with streams.data():
        assert not staged.wait(0.1)
        with streams.data():
            assert staged.wait(5)  # ... until both streams have begun
    extra.join(5)
