"""The next range read while the last one's rows are written (`--workers 1`, a target
that writes a unit after its last byte).

Why: into an 18.16 server a range's stage is one part (commit.py rule 2, the atomic
attach), which the server writes after the range's last byte: 0.2-0.4 s for 2M rows
during which, with one worker, the database and its reader wait (docs/databases.md,
"What bounds each run"). So with one worker such a load is cut into two ranges (the
planner's cut, `DatabaseSource.list`), and as soon as one range's reader has written
its last row, the next range is read, by the same one connection at a time, into a
spool: the server writes the first range's part (and the run commits it) while the
database reads the second. When the runner fetches that range, the spool is relayed
into the engine's pipe and then followed as it grows, so the database never waits for
the server; only the last range's part is written after the last byte.

How: the reader writes into a pipe; one thread splices the pipe into an unnamed
spool file (O_TMPFILE: nothing is left behind by a kill -9), another, once the range is
fetched, splices the spool into the engine's pipe up to what the first has written, to
its end. No byte passes through Python (os.splice). The range's `finish` passes only if
the reader ended cleanly and both threads moved every byte; the engine's pipe check
(db_pipes.check) does the rest, as for any streamed range: exactly once is unchanged.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable

from chload.errors import SourceError
from chload.sources import db_pipes
from chload.sources.db_pipes import DbReading

CHUNK = 1 << 20  # bytes per splice


class Ahead:
    """Ranges read one at a time: the first straight into its engine pipe, each next
    one into a spool as soon as the reader of the one before ended.

    The server target fetches the next unit while the last one loads (its runner keeps
    units in flight beyond the data streams: ServerTarget.open_streams), so `stream` is
    asked for the second range while the first is read. It waits until that read has
    ended, then begins the second range's read into a spool, which its engine pipe
    follows. So the thread loading the first range holds the data stream (it reads the
    pipe that its range's reader writes), and the second range's thread, waiting in
    `stream`, holds nothing that range waits for: no range waits for one that waits
    for it, in whatever order the runner's threads come."""

    def __init__(self, spools: Callable[[], str],
                 stream: Callable[[str], tuple[int, DbReading]]) -> None:
        self.spools, self._stream = spools, stream
        self.busy = False  # a reader runs
        self.first = True  # no range asked yet
        self.ready = threading.Condition()

    def stream(self, location: str) -> tuple[int, DbReading]:
        with self.ready:
            while self.busy:
                self.ready.wait(0.5)
            self.busy, first, self.first = True, self.first, False
        try:
            if first:
                read_end, reading = self._stream(location)
                return read_end, _Then(reading, self._ended)
            spooled = _Spooled(location, self.spools())
            read_end = spooled.hand()
        except BaseException:
            self._ended()
            raise
        if spooled.begin(self._stream):
            _Then(spooled, self._ended)
        else:
            self._ended()  # its finish says why
        return read_end, spooled

    def _ended(self) -> None:
        with self.ready:
            self.busy = False
            self.ready.notify_all()

    def close(self) -> None:
        """Nothing to end: each range's reading is stopped by its release."""


class _Then:
    """Calls `after` (in a thread of its own) once `reading`'s reader ended."""

    def __init__(self, reading: DbReading, after: Callable[[], None]) -> None:
        self.reading = reading
        self.thread = threading.Thread(target=self._watch, args=(after,),
                                       name="chload_db_ahead", daemon=True)
        self.thread.start()

    def _watch(self, after: Callable[[], None]) -> None:
        self.reading.wait()
        after()

    def wait(self) -> None:
        self.reading.wait()

    def finish(self) -> None:
        self.reading.finish()

    def stop(self) -> None:
        self.reading.stop()


class _Spooled:
    """One range read into an unnamed spool, relayed into the engine's pipe as it grows."""

    def __init__(self, location: str, directory: str) -> None:
        self.location = location
        self.spool = tempfile.TemporaryFile(dir=directory)
        self.written = 0  # bytes in the spool
        self.ended = False  # the reader's output is at its end (or failed: errors)
        self.stopped = False
        self.errors: list[BaseException] = []
        self.moved = threading.Condition()
        self.reading: DbReading | None = None
        self.source = -1  # the reader's pipe, read end
        self.threads: list[threading.Thread] = []

    def hand(self) -> int:
        """The engine's pipe (read end): the spool, as the reader fills it."""
        read_end, write_end = db_pipes.make()
        self._thread(self._send, write_end)
        return read_end

    def begin(self, stream: Callable[[str], tuple[int, DbReading]]) -> bool:
        """Start the reader (`stream`: its pipe's read end, the reading), into the
        spool; False if the range was stopped meanwhile or its reader could not start
        (`finish` then says why)."""
        with self.moved:
            if self.stopped:
                return False
        try:
            self.source, self.reading = stream(self.location)
        except BaseException as exc:  # noqa: BLE001 (reported by finish)
            self._end(exc)
            return False
        self._thread(self._fill)
        return True

    def _thread(self, target: Callable[..., None], *args: int) -> None:
        thread = threading.Thread(target=target, args=args, name="chload_db_spool",
                                  daemon=True)
        self.threads.append(thread)
        thread.start()

    def _end(self, error: BaseException | None = None) -> None:
        with self.moved:
            if error is not None:
                self.errors.append(error)
            self.ended = True
            self.moved.notify_all()

    def _fill(self) -> None:
        """The reader's pipe into the spool, to its end."""
        error = None
        try:
            while n := os.splice(self.source, self.spool.fileno(), CHUNK,
                                 offset_dst=self.written):
                with self.moved:
                    self.written += n
                    self.moved.notify_all()
        except BaseException as exc:  # noqa: BLE001 (reported by finish)
            error = exc
        self._end(error)

    def _send(self, out: int) -> None:
        """The spool into the engine's pipe, up to what the fill wrote, to its end."""
        sent = 0
        try:
            while True:
                with self.moved:
                    while sent == self.written and not self.ended and not self.stopped:
                        self.moved.wait()
                    if self.stopped or (sent == self.written and self.ended):
                        break
                    upto = self.written
                while sent < upto:
                    sent += os.splice(self.spool.fileno(), out, upto - sent,
                                      offset_src=sent)
        except BaseException as exc:  # noqa: BLE001 (e.g. EPIPE: the engine stopped)
            with self.moved:
                self.errors.append(exc)
        finally:
            os.close(out)

    def wait(self) -> None:
        if self.reading is not None:
            self.reading.wait()

    def finish(self) -> None:
        """Every byte moved, and the reader ended cleanly."""
        for thread in self.threads:
            thread.join()
        try:
            if self.reading is None and not self.errors:
                raise SourceError("a range waiting for its read was stopped")
            if self.reading is not None:
                self.reading.finish()
        finally:
            self._close()
        if self.errors:
            raise SourceError(f"a range read into a spool was not relayed whole "
                              f"({type(self.errors[0]).__name__}: {self.errors[0]})")

    def stop(self) -> None:
        with self.moved:
            self.stopped = True
            self.moved.notify_all()
        if self.reading is not None:
            self.reading.stop()  # the reader's pipe ends: the fill ends
        for thread in self.threads:
            thread.join()
        self._close()

    def _close(self) -> None:
        if self.source >= 0:
            with contextlib.suppress(OSError):
                os.close(self.source)
            self.source = -1
        self.spool.close()
