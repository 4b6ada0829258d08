"""A database range streamed through a pipe is committed only if it was read whole: the
check before the commit (Source.current, the second time) needs the pipe at its end and
the writer ended without error; a pipe is read once (sources/pipes.py)."""

from __future__ import annotations

import os

import pytest

from chload.errors import SourceError
from chload.sources import pipes as db_pipes


class Writer:
    """A Reading that wrote `data` into the pipe and then ended (`error`: it failed)."""

    def __init__(self, error: str = "") -> None:
        self.error, self.stopped = error, False

    def finish(self) -> None:
        if self.error:
            raise SourceError(self.error)

    def stop(self) -> None:
        self.stopped = True


def _pipe(data: bytes, writer: Writer, close: bool = True) -> tuple[str, int]:
    read_end, write_end = db_pipes.make()
    db_pipes.write_all(write_end, data)
    if close:
        os.close(write_end)
    return db_pipes.register(read_end, writer), write_end


def _read_all(path: str) -> bytes:
    """What the engine does: open /dev/fd/N and read to the end."""
    with open(path, "rb") as f:
        return f.read()


def test_a_range_read_whole_passes_once_then_the_pipe_is_spent() -> None:
    writer = Writer()
    path, _ = _pipe(b"1\ta\n2\tb\n", writer)
    assert db_pipes.is_pipe(path)
    db_pipes.check(path, "u")  # as_read: before the engine reads
    assert _read_all(path) == b"1\ta\n2\tb\n"
    db_pipes.check(path, "u")  # check_read: at the end, the writer fine
    with pytest.raises(SourceError, match="read by an earlier attempt"):
        db_pipes.check(path, "u")  # a retried load would read nothing
    db_pipes.release(path)
    assert writer.stopped and not db_pipes.is_pipe(path)


def test_a_writer_that_failed_fails_the_check() -> None:
    path, _ = _pipe(b"1\ta\n", Writer(error="psql: connection lost"))
    db_pipes.check(path, "u")
    _read_all(path)  # the engine saw an end: a short range looks whole to it
    with pytest.raises(SourceError, match="connection lost"):
        db_pipes.check(path, "u")
    db_pipes.release(path)


def test_bytes_left_in_the_pipe_fail_the_check() -> None:
    path, write_end = _pipe(b"1\ta\n", Writer(), close=False)
    db_pipes.check(path, "u")
    with pytest.raises(SourceError, match="before the end"):
        db_pipes.check(path, "u")  # the engine did not read it all
    db_pipes.release(path)
    os.close(write_end)
