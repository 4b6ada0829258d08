"""A followed table's changes streamed once, over a replication connection.

`START_REPLICATION SLOT s LOGICAL <confirmed> (wal2json's options)` on a connection of
its own (libpq through psycopg's `pq` layer: its authentication, TLS and ~/.pgpass, as
psql's): the server decodes each change once and sends it as one CopyData message. A
thread (`Stream`) writes each change's JSON, as sent, as one line of a spool segment
(one `write` of bytes per message: no parsing, no row object), and knows two positions:

- `safe`: every transaction whose commit record starts before it is in the spool. A
  commit message gives its record's end; a keepalive gives the server's sent position
  (`sentPtr`: every record before it decoded and its output sent ahead of the keepalive)
  unless a transaction's messages are still coming, whose commit starts past it anyway.
- `flushed`: what the status updates report as flushed, so the slot's confirmed position
  (`LogicalConfirmReceivedLocation`). It moves only by `confirm`, which the follow calls
  after the ledger committed the units up to there, never back (PostgreSQL 15 takes a
  lower one as it comes).

On restart the server leaves out every transaction whose commit record starts before
the slot's confirmed position: a segment sealed at `safe` holds exactly those between
the last one and it, so a unit named by the range neither loses nor doubles a change
whatever instant a kill comes at (the ledger's end, to which the next run moves the slot
first, is a unit's `safe`).

The loop that reads the messages is C (stream_native.py: the GIL released; it comes back
at a commit whose position matters, a keepalive, when woken, once a second), or this
module's Python when that reader cannot be had: both write the same spool bytes, and
every position rule above is this module's in both.

The wire: CopyData `w` (start, end, time, the plugin's text), `k` (the sent position,
time, reply asked), and our `r` (written, flushed, applied, time, reply asked); times in
microseconds since 2000-01-01.
"""

from __future__ import annotations

import os
import select
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from chload.errors import SourceError, TransientError
from chload.sources.changes.postgres import stream_native as sn
from chload.sources.changes.postgres.slot import lsn_text
from chload.sources.changes.postgres.sql import ident, option_pairs
from chload.sources.databases.table import DbUrl

# the replication session's settings before it streams: dates printed as ISO, instants in
# UTC (the decoding prints each value in this session), as the snapshot's COPY reads them
SESSION = b"SET DateStyle = ISO; SET TimeZone = 'UTC'; SET extra_float_digits = 1"
STATUS_SECONDS = 10.0  # a status update at least this often (the server's timeout: 60 s)
SEGMENT_BYTES = 256 << 20  # a segment sealed by itself past this much spool
_EPOCH_2000_US = 946_684_800 * 1_000_000
_HEADER = 25  # 'w', start, end, time
_BEGIN, _COMMIT = b'{"action":"B"', b'{"action":"C"'


class Unavailable(Exception):
    """No replication connection could be had (no psycopg, no free WAL sender): the
    follow reads by SQL."""


@dataclass(slots=True)
class Segment:
    """Spooled changes of whole transactions, up to `upto` (a safe position)."""

    path: str
    upto: int
    changes: int


def conninfo(url: DbUrl) -> bytes:
    """libpq's connection string for a replication connection to `url` (the password
    only when the URL has it: else libpq's own ways, PGPASSWORD or ~/.pgpass)."""
    def quoted(value: str) -> str:
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    pairs = {"host": url.host, "port": str(url.port), "dbname": url.database,
             "user": url.user, "password": url.password, "replication": "database",
             "application_name": "chload", "connect_timeout": "10"}
    return " ".join(f"{k}={quoted(v)}" for k, v in pairs.items() if v).encode()


def start_command(slot: str, start: int, relation: tuple[str, str]) -> str:
    # (the replication grammar's strings: standard ones, no E'')
    options = ", ".join(f"{ident(k)} '{v.replace(chr(39), chr(39) * 2)}'"
                        for k, v in option_pairs(*relation, True))
    return f"START_REPLICATION SLOT {ident(slot)} LOGICAL {lsn_text(start)} ({options})"


class Stream:
    """The slot's changes from `start` on, spooled by a thread into segments under
    `spool`; `take` seals one, `confirm` moves the slot."""

    def __init__(self, url: DbUrl, slot: str, relation: tuple[str, str], start: int,
                 spool: str, conn: Any = None) -> None:
        self.url, self.spool = url, spool
        # session_set: the changes' values printed in ISO dates and UTC (engine_rows.py)
        self.conn, self.session_set = (conn, False) if conn is not None else _connect(
            url, start_command(slot, start, relation))
        # (a scripted connection, no PGconn under it: the Python loop)
        self.native, self.native_why = (sn.Native.open() if hasattr(self.conn, "pgconn_ptr")
                                        else (None, ""))
        self.start = self.safe = self.flushed = self.sent_flushed = start
        self.lock = threading.Condition()
        self.sealed: deque[Segment] = deque()
        self.want_seal = False  # asked by take: seal at the next safe position
        self.ask_reply = False  # a status update asking the server's position is due
        self.failed: BaseException | None = None
        self.closing = False
        self.in_txn = self.seal_at_commit = False
        self.pending = False  # changes of whole transactions in the current segment
        self.changes = 0
        self.count = 0
        self.file = self._open()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.last_status = 0.0
        self.thread = threading.Thread(target=self._run, name="chload-stream", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ the follow's side

    def take(self, wait: float) -> Segment | None:
        """The oldest sealed segment; else the spool up to now sealed (after the server
        said where it stands); None if that did not come within `wait` s (a long
        transaction still arriving)."""
        deadline = time.monotonic() + wait
        with self.lock:
            if not self.sealed:
                self.want_seal = self.ask_reply = True
                self._wake()
            while not self.sealed and self.failed is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.lock.wait(left)
            self._raise()
            return self.sealed.popleft()

    def put_back(self, segment: Segment) -> None:
        """A segment taken, given back: the next `take` returns it again."""
        with self.lock:
            self.sealed.appendleft(segment)

    def wait_changes(self, wait: float) -> None:
        """Until a transaction with changes of the table is spooled, or `wait` s."""
        with self.lock:
            self.lock.wait_for(lambda: self.sealed or self.pending or self.failed is not None,
                               wait)

    def confirm(self, upto: int) -> None:
        """The ledger committed every change up to `upto`: the slot may move there."""
        with self.lock:
            self._raise()
            if upto > self.flushed:
                self.flushed = upto
                self._wake()

    def close(self) -> None:
        """The last confirmed position sent, the connection closed, the segments left to
        the spool's owner."""
        with self.lock:
            self.closing = True
            self._wake()
        self.thread.join(timeout=30)
        try:
            if self.failed is None and self.sent_flushed < self.flushed:
                self._status(False)
        except Exception:  # (closing: the next run moves the slot to the ledger's end)
            pass
        self.conn.finish()
        if self.native is not None:
            self.native.close()
        self.file.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _raise(self) -> None:
        if self.failed is not None:
            raise self.failed

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:  # (woken already, many times over)
            pass

    # ------------------------------------------------------------------ the thread

    def _open(self) -> Any:
        self.count += 1
        self.changes = 0
        path = os.path.join(self.spool, f"stream-{self.count}.json")
        # (the C reader writes to the descriptor: nothing buffered here)
        return open(path, "wb", buffering=0 if self.native is not None else -1)

    def _seal(self) -> None:
        """The current segment closed at `safe` (no transaction open) and queued."""
        self.file.close()
        self.sealed.append(Segment(self.file.name, self.safe, self.changes))
        self.file = self._open()
        self.want_seal = self.pending = False
        self.lock.notify_all()

    def _run(self) -> None:
        try:
            if self.native is None:
                self._loop()
            else:
                self._loop_native()
        except BaseException as exc:  # (handed to the follow's thread by take/confirm)
            with self.lock:
                self.failed = exc if isinstance(exc, SourceError) else TransientError(
                    f"{self.url.with_user}: the replication stream failed: {exc}")
                self.lock.notify_all()

    def _loop(self) -> None:
        conn, sock = self.conn, self.conn.socket
        while True:
            n, data = conn.get_copy_data(1)
            if n > 0:
                self._message(data)
                continue
            if n < 0:
                said = conn.error_message.decode(errors="replace").strip()
                raise TransientError(f"{self.url.with_user}: the replication stream ended: "
                                     f"{said or 'the server closed it'}")
            if self._idle():
                return
            ready, _, _ = select.select([sock, self.wake_r], [], [], 1.0)
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            if sock in ready:
                conn.consume_input()

    def _idle(self) -> bool:
        """No message ready: a status update if one is due; whether to stop."""
        with self.lock:
            if self.closing:
                return True
            due = (self.ask_reply or self.flushed > self.sent_flushed
                   or time.monotonic() - self.last_status > STATUS_SECONDS)
            reply, self.ask_reply = self.ask_reply, False
        if due:
            self._status(reply)
        return False

    def _loop_native(self) -> None:
        """`_loop`, the messages read and written by the C reader: what it says applied
        as `_message` would have, message by message. It waits on the socket itself:
        `_idle` runs when the wake pipe was written or at least once a second."""
        assert self.native is not None
        native, state = self.native, self.native.state
        while True:
            size = self.file.tell()
            state.room = SEGMENT_BYTES - size
            state.stop, state.in_txn = int(self.seal_at_commit), int(self.in_txn)
            code = native.next(self.conn, self.file.fileno(), self.wake_r, 1.0)
            if state.commit_at:  # (commits passed over: none of them could seal)
                self.changes += state.commit_changes
                self.in_txn = False
                self._position(state.commit_at, self.seal_at_commit,
                               size + state.commit_bytes)
                self.changes += state.changes - state.commit_changes
            else:
                self.changes += state.changes
            self.in_txn = bool(state.in_txn)
            if code == sn.KEEPALIVE:
                self._keepalive(state.sent, bool(state.asked))
            elif code == sn.IDLE:
                if self._idle():
                    return
            elif code != sn.COMMIT:
                self._native_failed(code, state.error)

    def _native_failed(self, code: int, error: int) -> None:
        said = self.conn.error_message.decode(errors="replace").strip()
        if code == sn.END:
            raise TransientError(f"{self.url.with_user}: the replication stream ended: "
                                 f"{said or 'the server closed it'}")
        if code == sn.WRITE:
            raise OSError(error, os.strerror(error), self.file.name)
        what = "consuming input" if code == sn.CONSUME else "receiving copy data"
        raise ConnectionError(f"{what} failed: {said}")

    def _message(self, data: memoryview) -> None:
        kind = data[0]
        if kind == 0x77:  # 'w': a message of the plugin
            head = bytes(data[_HEADER:_HEADER + 13])
            if head == _BEGIN:
                self.in_txn = True
            elif head == _COMMIT:  # its start field: the commit record's end
                self.in_txn = False
                self._position(struct.unpack_from(">q", data, 1)[0], self.seal_at_commit)
            else:
                self.file.write(data[_HEADER:])
                self.file.write(b"\n")
                self.changes += 1
        elif kind == 0x6B:  # 'k': the server's sent position; a reply asked
            end, _, asked = struct.unpack_from(">qqB", data, 1)
            self._keepalive(end, bool(asked))

    def _keepalive(self, end: int, asked: bool) -> None:
        if not self.in_txn:
            self._position(end, True)
        else:  # (amid a transaction's messages: sealed after its commit)
            self.seal_at_commit = True
        if asked:
            self._status(False)

    def _position(self, at: int, told: bool, size: int | None = None) -> None:
        """A safe position: sealed there if a take waits and the server has `told`
        where it stands since (so a unit reaches the position the server had when it
        was asked, as the SQL path's units do), or the segment is large (`size`: its
        bytes up to this position, where more are written already)."""
        with self.lock:
            self.safe = max(self.safe, at)
            self.seal_at_commit = False
            if self.changes and not self.pending:
                self.pending = True
                self.lock.notify_all()
            if size is None:
                size = self.file.tell()
            if (self.want_seal and told) or size >= SEGMENT_BYTES:
                self._seal()

    def _status(self, reply: bool) -> None:
        with self.lock:
            written, flushed = self.safe, self.flushed
        now = int(time.time() * 1_000_000) - _EPOCH_2000_US
        body = struct.pack(">cqqqqB", b"r", written, flushed, flushed, now, int(reply))
        while not self.conn.put_copy_data(body):  # (0: libpq's buffer full, for now)
            select.select([], [self.conn.socket], [], 1.0)
            self.conn.flush()
        while self.conn.flush() == 1:
            select.select([], [self.conn.socket], [], 1.0)
        self.sent_flushed = flushed
        self.last_status = time.monotonic()


def _connect(url: DbUrl, command: str) -> tuple[Any, bool]:
    """The connection, streaming, and whether its session took SESSION (the values'
    printed forms); Unavailable (with the server's reason) if not."""
    try:
        from psycopg import pq
    except ImportError:
        raise Unavailable("psycopg is not installed (pip install 'chload[postgres]')") from None
    conn = pq.PGconn.connect(conninfo(url))
    try:
        if conn.status != pq.ConnStatus.OK:
            raise Unavailable(_said(url, conn.error_message))
        set_session = conn.exec_(SESSION)  # (the decoding's output functions run here)
        conn.send_query(command.encode())
        result = conn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise Unavailable(_said(url, result.error_message if result is not None
                                    else conn.error_message))
        conn.nonblocking = 1
        return conn, set_session.status == pq.ExecStatus.COMMAND_OK
    except BaseException:
        conn.finish()
        raise


def _said(url: DbUrl, message: bytes) -> str:
    said = message.decode(errors="replace").strip().splitlines()
    line = said[0] if said else "no reason given"
    return line.replace(url.password, "***") if url.password else line
