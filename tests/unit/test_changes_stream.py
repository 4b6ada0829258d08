"""The replication stream's spool and positions (sources/changes/postgres/replication.py),
over a scripted connection: what a unit holds, where it is sealed, what is reported
flushed; read by the Python loop and by the C reader (stream_reader.c, given the scripted
connection as its libpq functions). The real server: tests/integration/
test_changes_postgres.py and test_changes_stream_reader.py."""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest

from chload.sources.changes.postgres import stream_native
from chload.sources.changes.postgres.replication import Stream, conninfo, start_command
from chload.sources.databases.table import DbUrl

URL = DbUrl("postgresql", "loader", "127.0.0.1", 5432, "shop", "public", "t", "p'w\\d")


def _w(start: int, text: str) -> bytes:
    return b"w" + struct.pack(">qqq", start, start, 0) + text.encode()


def _k(end: int, reply: bool = False) -> bytes:
    return b"k" + struct.pack(">qqB", end, 0, int(reply))


class Server:
    """A replication connection's libpq side, scripted: messages queued by the test; a
    status update that asks for a reply answered by a keepalive at `position`."""

    def __init__(self, position: int) -> None:
        self.position = position
        self.queue: deque[bytes] = deque()
        self.ours, self.theirs = socket.socketpair()
        self.socket = self.ours.fileno()
        self.statuses: list[tuple[int, int, int]] = []  # (written, flushed, reply)
        self.lock = threading.Lock()
        self.error_message = b""

    def send(self, *messages: bytes) -> None:
        with self.lock:
            self.queue.extend(messages)
        self.theirs.send(b"x")

    def get_copy_data(self, async_: int) -> tuple[int, bytes]:
        with self.lock:
            if self.queue:
                data = self.queue.popleft()
                return len(data), data
        return 0, b""

    def consume_input(self) -> None:
        self.ours.recv(4096)

    def put_copy_data(self, body: bytes) -> int:
        _, written, flushed, _, _, reply = struct.unpack(">cqqqqB", body)
        self.statuses.append((written, flushed, reply))
        if reply:
            self.send(_k(self.position))
        return 1

    def flush(self) -> int:
        return 0

    def finish(self) -> None:
        self.ours.close()
        self.theirs.close()


_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                        ctypes.c_int)
_ONE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Libpq:
    """The scripted connection as the four libpq functions the C reader calls."""

    def __init__(self, server: Server) -> None:
        self.held: dict[int, ctypes.Array[ctypes.c_char]] = {}

        def get(conn: int, out: ctypes._Pointer[ctypes.c_void_p], async_: int) -> int:
            n, data = server.get_copy_data(async_)
            if n > 0:
                buf = ctypes.create_string_buffer(bytes(data), n)
                self.held[ctypes.addressof(buf)] = buf
                out[0] = ctypes.addressof(buf)
            return n

        def consume(conn: int) -> int:
            server.consume_input()
            return 1

        self.funcs = [_GET(get), _ONE(consume), _ONE(lambda conn: server.socket),
                      _FREE(lambda at: self.held.pop(at, None))]

    def addresses(self) -> list[int | None]:
        return [ctypes.cast(f, ctypes.c_void_p).value for f in self.funcs]


@pytest.fixture(params=["python", "native"])
def stream_of(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
              tmp_path: Path) -> Callable[..., Stream]:
    """A Stream over a scripted connection, read by the Python loop or the C reader."""
    native = request.param == "native"

    def make(server: Server, start: int = 10) -> Stream:
        if native:
            lib, why = stream_native.library()
            assert lib is not None, why
            libpq = Libpq(server)
            server.pgconn_ptr = None  # type: ignore[attr-defined]
            server.libpq = libpq  # type: ignore[attr-defined]  # (its callbacks kept alive)
            monkeypatch.setattr(stream_native.Native, "open", staticmethod(
                lambda: (stream_native.Native.over(lib, libpq.addresses()), "")))
        stream = Stream(URL, "chload_x", ("public", "t"), start, str(tmp_path), conn=server)
        assert (stream.native is not None) == native
        return stream
    return make


INSERT = '{"action":"I","lsn":"0/20","columns":[{"name":"id","value":1}]}'
UPDATE = '{"action":"U","lsn":"0/30","columns":[{"name":"id","value":"a\\\\b\\"c"}]}'


def test_a_unit_holds_whole_transactions_up_to_where_the_server_said_it_stood(
        stream_of: Callable[..., Stream]) -> None:
    server = Server(position=200)
    stream = stream_of(server)
    try:
        server.send(_w(20, '{"action":"B","lsn":"0/40"}'), _w(20, INSERT),
                    _w(100, '{"action":"C","lsn":"0/40"}'), _w(150, '{"action":"B"}'),
                    _w(150, UPDATE))  # (a transaction whose commit has not come)
        assert stream.take(1.0) is None  # (the server answered amid it: sealed at its commit)
        server.position = 300  # (nothing more of the table: then a unit with no change)
        server.send(_w(180, '{"action":"C"}'))
        segment = stream.take(5.0)
        assert segment is not None
        assert segment.upto == 180 and segment.changes == 2
        assert Path(segment.path).read_text() == INSERT + "\n" + UPDATE + "\n"
        segment = stream.take(5.0)
        assert segment is not None
        assert segment.upto == 300 and segment.changes == 0
    finally:
        stream.close()


def test_a_unit_asked_for_amid_a_transaction_ends_at_its_commit_whatever_follows(
        stream_of: Callable[..., Stream]) -> None:
    server = Server(position=200)
    stream = stream_of(server)
    try:
        server.send(_w(20, '{"action":"B"}'), _w(20, INSERT))
        assert stream.take(1.0) is None  # (the server answered amid it)
        server.position = 300  # (where the next answers say the server stands)
        server.send(_w(180, '{"action":"C"}'), _w(190, '{"action":"B"}'), _w(190, UPDATE),
                    _w(195, '{"action":"C"}'))  # (the next transaction right behind)
        segment = stream.take(5.0)
        assert segment is not None
        assert segment.upto == 180 and segment.changes == 1
        assert Path(segment.path).read_text() == INSERT + "\n"
        segment = stream.take(5.0)
        assert segment is not None
        assert segment.upto == 300 and Path(segment.path).read_text() == UPDATE + "\n"
    finally:
        stream.close()


def test_only_what_is_confirmed_is_reported_flushed_and_never_back(
        stream_of: Callable[..., Stream]) -> None:
    server = Server(position=500)
    stream = stream_of(server, start=10)
    try:
        server.send(_w(20, '{"action":"B"}'), _w(20, INSERT), _w(100, '{"action":"C"}'))
        segment = stream.take(5.0)
        assert segment is not None and segment.upto == 500
        assert all(flushed == 10 for _, flushed, _ in server.statuses)
        stream.confirm(500)
        stream.confirm(300)  # (an older position: not reported)
        server.send(_k(600, reply=True))
        assert stream.take(5.0) is not None  # (a round trip: the statuses are sent)
    finally:
        stream.close()
    flushed = [f for _, f, _ in server.statuses]
    assert flushed[-1] == 500 and sorted(flushed) == flushed


def test_the_start_command_and_connection_string_quote_what_they_carry() -> None:
    command = start_command("chload_x", (1 << 32) + 16, ("public", "o'rders"))
    assert command.startswith('START_REPLICATION SLOT "chload_x" LOGICAL 1/10 (')
    assert "\"add-tables\" 'public.o\\''rders'" in command
    assert "\"include-transaction\" '1'" in command
    info = conninfo(URL).decode()
    assert "password='p\\'w\\\\d'" in info and "replication='database'" in info


def test_the_python_loop_reads_when_asked_for_or_when_the_c_reader_cannot_be_had(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = Server(position=100)
    server.pgconn_ptr = None  # type: ignore[attr-defined]  # (as psycopg's PGconn)
    monkeypatch.setenv("CHLOAD_PG_STREAM_READER", "python")
    stream = Stream(URL, "chload_x", ("public", "t"), 10, str(tmp_path), conn=server)
    stream.close()
    assert stream.native is None and stream.native_why == stream_native.CHOSEN
    monkeypatch.delenv("CHLOAD_PG_STREAM_READER")
    monkeypatch.setattr(stream_native, "library", lambda: (None, "no C compiler (cc)"))
    stream = Stream(URL, "chload_x", ("public", "t"), 10, str(tmp_path), conn=Server(100))
    stream.close()
    assert stream.native is None and stream.native_why == ""  # (a scripted connection)
    server = Server(position=100)
    server.pgconn_ptr = None  # type: ignore[attr-defined]
    stream = Stream(URL, "chload_x", ("public", "t"), 10, str(tmp_path), conn=server)
    stream.close()
    assert stream.native is None and stream.native_why == "no C compiler (cc)"


def test_the_libpq_found_is_the_one_psycopg_loaded() -> None:
    pq = pytest.importorskip("psycopg.pq")
    path, why = stream_native.psycopg_libpq()
    assert path, why
    assert os.path.basename(path).startswith("libpq") and os.path.exists(path)
    if pq.__impl__ == "binary":
        import psycopg_binary
        assert os.path.dirname(path).startswith(
            os.path.dirname(os.path.dirname(psycopg_binary.__file__ or "")))
