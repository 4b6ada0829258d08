"""A database range streamed into the engine through a pipe, not spooled to a file first.

Streamed, the engine parses while the database and its client produce, instead of one
after the other. The source makes an anonymous pipe; the client (psql) writes into it, or
a thread relays the client's output (MySQL: up to a marker row); the engine, in this
process, reads it as `file('/dev/fd/N')`, which never waits for a writer on open.

Invariants: the end of the pipe proves only that every writer closed it, so `check` (asked
by identity.check_read, before the commit) raises unless the pipe is at its end and the
writer finished without error: a failed check fails the unit, nothing committed; a pipe
is read once (a retried load fails; a rerun loads it). The registry is per process, keyed
by the /dev/fd path: `current` and `table_function` are asked of the module's SOURCE.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import threading
from dataclasses import dataclass
from typing import Protocol

from chload.errors import SourceError

_PIPE_BYTES = 1 << 20  # pipe buffer asked for (F_SETPIPE_SZ): fewer wake-ups than 64 KiB
_F_SETPIPE_SZ = 1031


class Reading(Protocol):
    """A range being written by the database's client into a file descriptor."""

    def finish(self) -> None:
        """Wait for the writer to end; raise (a ChloadError) if the range was not read
        whole."""
        ...

    def stop(self) -> None:
        """End the writer now (its output is no longer wanted); never raises."""
        ...


@dataclass(slots=True)
class Pipe:
    fd: int  # the read end, which the engine opens as /dev/fd/<fd>
    reading: Reading
    checks: int = 0  # how often `current` asked: 1 before the read, 2 after it

    @property
    def path(self) -> str:
        return f"/dev/fd/{self.fd}"


_PIPES: dict[str, Pipe] = {}
_GUARD = threading.Lock()


def make() -> tuple[int, int]:
    """(read end, write end), neither inherited by child processes; the buffer enlarged
    where the system allows."""
    read_end, write_end = os.pipe()
    enlarge(write_end)
    return read_end, write_end


def enlarge(fd: int) -> None:
    """A pipe's buffer to 1 MiB where the system allows (else it stays as it is)."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)


def register(read_end: int, reading: Reading) -> str:
    """Keep the pipe until `release`; its path for the engine."""
    pipe = Pipe(read_end, reading)
    with _GUARD:
        _PIPES[pipe.path] = pipe
    return pipe.path


def is_pipe(path: str | None) -> bool:
    with _GUARD:
        return bool(path) and path in _PIPES


def check(path: str, uri: str) -> None:
    """`Source.current` of a streamed unit: nothing before the read (the first call,
    identity.as_read); after it (the second, identity.check_read), raise unless the
    range was read whole; any later call (a retried load) raises: the pipe is spent."""
    with _GUARD:
        pipe = _PIPES.get(path)
        if pipe is None:
            return
        pipe.checks += 1
        checks = pipe.checks
    if checks == 1:
        return
    if checks > 2:
        raise SourceError(f"{uri}: this range's stream was read by an earlier attempt; "
                          "run the same command again (it loads only what is missing)")
    if not _at_end(pipe.fd):
        raise SourceError(f"{uri}: the engine stopped before the end of the range; nothing "
                          "of it was loaded")
    pipe.reading.finish()


def _at_end(fd: int) -> bool:
    """Every writer closed the pipe and nothing is left in it."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    events = dict(poller.poll(0)).get(fd, 0)
    return bool(events & select.POLLHUP) and not events & select.POLLIN


def release(path: str) -> None:
    """Close the read end (a writer still writing gets EPIPE), then stop the writer."""
    with _GUARD:
        pipe = _PIPES.pop(path, None)
    if pipe is None:
        return
    with contextlib.suppress(OSError):
        os.close(pipe.fd)
    pipe.reading.stop()


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until every byte is written (a pipe may take part of a large write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
