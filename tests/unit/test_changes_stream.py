"""The replication stream's spool and positions (sources/changes/postgres/replication.py),
over a scripted connection: what a unit holds, where it is sealed, what is reported
flushed. The real server: tests/integration/test_changes_postgres.py."""

from __future__ import annotations

import socket
import struct
import threading
from collections import deque
from pathlib import Path

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


def _stream(tmp_path: Path, server: Server, start: int = 10) -> Stream:
    return Stream(URL, "chload_x", ("public", "t"), start, str(tmp_path), conn=server)


INSERT = '{"action":"I","lsn":"0/20","columns":[{"name":"id","value":1}]}'
UPDATE = '{"action":"U","lsn":"0/30","columns":[{"name":"id","value":"a\\\\b\\"c"}]}'


def test_a_unit_holds_whole_transactions_up_to_where_the_server_said_it_stood(
        tmp_path: Path) -> None:
    server = Server(position=200)
    stream = _stream(tmp_path, server)
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


def test_only_what_is_confirmed_is_reported_flushed_and_never_back(tmp_path: Path) -> None:
    server = Server(position=500)
    stream = _stream(tmp_path, server, start=10)
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
