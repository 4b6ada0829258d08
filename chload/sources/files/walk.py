"""The local walk a directory at a time, with the ledger's known files passed by in C.

A rerun over a long history walks every file again: a file rewritten in place keeps its
directory's mtime, so only a stat of each file tells it changed. In Python a file costs
a DirEntry, a stat_result, a SourceFile and two MD5s; here (walk.c, built with `cc` on
first use like the Kafka and MySQL readers) a directory's entries come sorted in one
call, and one more call stats a run of its files and compares each one's keys with the
ledger's (sources.base.KnownKeys): a known, unchanged file costs its readdir entry and
its stat, and no Python object. Files it cannot decide (new, changed, a link, a name not
ASCII) are handed back by name, for local.py to describe as it always has. Into a
table with no known units, a third call (`described`) stats a run of files and reads the
small ones whole, so that a first load of many small files opens each one once. Without a
compiler, local.py walks as before. Directories are read on a thread of their own, a few
ahead of the one whose files are stat'ed, so reading the next one overlaps the stats of
the last (a bounded queue: the listing stays streamed).
"""

from __future__ import annotations

import ctypes
import functools
import os
import queue
import threading
import weakref
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chload.runtime import native
from chload.runtime.engine import LOCK_NAME
from chload.sources.base import KnownKeys

SOURCE = Path(__file__).with_name("walk.c")
ASK = 1  # walk.c's code for a file it leaves to Python (0: skipped, 2: no source)
FOUND = 3  # walk.c's code for a regular file it described (chload_described)
WHOLE = 4096  # bytes a file may hold for chload_described to read all of them
_LOCK = LOCK_NAME.encode()


def _bind(lib: Any) -> Any:
    c = ctypes
    lib.chload_entries.argtypes = [c.c_int, c.c_char_p, c.c_void_p, c.c_long, c.c_void_p,
                                   c.c_long]
    lib.chload_entries.restype = c.c_long
    lib.chload_known.argtypes = [c.c_int, c.c_char_p, c.c_long, c.c_char_p, c.c_long,
                                 c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int,
                                 c.c_void_p]
    lib.chload_known.restype = c.c_long
    lib.chload_buckets.argtypes = [c.c_void_p, c.c_long, c.c_void_p, c.c_int]
    lib.chload_buckets.restype = None
    lib.chload_md5_key.argtypes = [c.c_char_p, c.c_size_t]
    lib.chload_md5_key.restype = c.c_uint64
    lib.chload_described.argtypes = [c.c_int, c.c_char_p, c.c_long, c.c_long, c.c_void_p,
                                     c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p]
    lib.chload_described.restype = c.c_long
    return lib


def _build() -> tuple[Any, str]:
    return native.load(SOURCE, "", "chload_walk", "native local walk", _bind)


library = native.Once(_build)  # the compiled walk, or None and why not (one line)


@dataclass(slots=True)
class Run:
    """Files of one directory, next to each other in the walk's order (no directory
    between them): the directory as walked, an open descriptor of it (valid until the
    walk goes on), their names, and the directory's realpath and abspath (resolved by
    the walk's reader: '' where not)."""

    directory: str
    fd: int
    names: list[str]
    real: str = ""
    absolute: str = ""


class _Buffers:
    """What chload_entries writes into, grown when a directory needs more."""

    def __init__(self, size: int = 1 << 16) -> None:
        self.grow(size)

    def grow(self, size: int) -> None:
        self.size = size
        self.names = ctypes.create_string_buffer(size)
        self.types = ctypes.create_string_buffer(size)


def runs(lib: Any, directory: str) -> Iterator[Run]:
    """`local._walk`'s files as runs of names: every regular, non-hidden file under a
    directory, recursively, in the order of their paths (a directory's name sorts as
    `name/`); symlinked directories followed, each directory entered once, chload
    targets never (a directory holding `.chload.lock`).

    The directories are read on a thread of their own, up to _AHEAD runs ahead, so the
    next directory is read while the last one's files are stat'ed (`known`); each
    directory's descriptor is closed once its last run has been taken, by that thread
    too, as are the directory's realpath and abspath found: the thread that stats the
    files makes no system call of its own between two runs (each one lets go of the
    GIL, and taking it back waits for whichever thread holds it, a scheduler's slice
    on a busy machine)."""
    ahead: queue.Queue[Run | int | BaseException | None] = queue.Queue(_AHEAD)
    stop = threading.Event()
    spent: list[int] = []  # descriptors whose runs have all been taken, to close

    def put(item: Run | int | BaseException | None) -> bool:
        while spent:
            os.close(spent.pop())
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            _read(lib, directory, put)
        except BaseException as exc:  # (taken to the walk's caller)
            put(exc)
        put(None)
    reader = threading.Thread(target=read, name="chload-walk-read", daemon=True)
    reader.start()
    try:
        while (item := ahead.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, int):
                spent.append(item)  # (a directory whose runs have all been taken)
                continue
            yield item
    finally:
        stop.set()
        reader.join()
        while spent:
            os.close(spent.pop())
        while not ahead.empty():
            if isinstance(item := ahead.get_nowait(), int):
                os.close(item)


_AHEAD = 8  # runs and directories read, at most, ahead of the one being stat'ed


def _read(lib: Any, directory: str, put: Callable[[Run | int], bool]) -> None:
    """The walk's runs, in order, each handed to `put`, and then each directory's
    descriptor, once its last run is handed over; stops when `put` says so (False)."""
    seen: set[tuple[int, int]] = set()
    buffers = _Buffers()

    def visit(root: str) -> bool:
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return True
        handed = False
        try:
            st = os.fstat(fd)
            listed = _entries(lib, fd, buffers)
            if listed is None or (st.st_dev, st.st_ino) in seen:
                return True
            seen.add((st.st_dev, st.st_ino))
            names, types = listed
            real, absolute = os.path.realpath(root or "."), os.path.abspath(root or ".")
            start = 0
            while start <= len(names):
                at = types.find(b"d", start)
                end = len(names) if at < 0 else at
                if end > start and not put(Run(root, fd, names[start:end], real, absolute)):
                    return False
                if at < 0:
                    break
                if not visit(os.path.join(root, names[at])):
                    return False
                start = at + 1
            handed = put(fd)
            return handed
        finally:
            if not handed:
                os.close(fd)
    visit(directory)


def _entries(lib: Any, fd: int, buffers: _Buffers) -> tuple[list[str], bytes] | None:
    """A directory's non-hidden names, sorted as the walk visits them, and a type byte
    each (`d`: a directory); None if it is a chload target or cannot be read."""
    while True:
        n = lib.chload_entries(fd, _LOCK, buffers.names, buffers.size, buffers.types,
                               buffers.size)
        if n >= 0:
            names = buffers.names.raw[:n].decode("utf-8", "surrogateescape").split("\0")
            names.pop()  # (after the last name's NUL)
            return names, buffers.types.raw[:len(names)]
        if n in (-1, -2):
            return None
        buffers.grow(max(-n - 2, buffers.size * 2))


def known(lib: Any, run: Run, names: list[str], prefix: str,
          keys: KnownKeys) -> tuple[int, bytes]:
    """How many of `names` (in `run.directory`, their uris `prefix` + name) `keys`
    holds unchanged, each marked met, and a code a name: ASK for those Python decides.

    Most of it is the kernel's `stat` of each file, which a second core can share: a
    long run's second half goes to a thread of its own (ctypes lets go of the GIL
    during the call; the two halves mark different units met)."""
    head = prefix.encode("utf-8", "surrogateescape")
    met = keys.met
    marks = (ctypes.c_char * len(met)).from_buffer(met) if len(met) else None
    table, bits = _buckets(lib, keys)

    def part(chunk: list[str]) -> tuple[int, bytes]:
        blob = ("\0".join(chunk) + "\0").encode("utf-8", "surrogateescape")
        codes = ctypes.create_string_buffer(len(chunk))
        skipped = lib.chload_known(run.fd, blob, len(chunk), head, len(head),
                                   keys.uris.buffer_info()[0],
                                   keys.identities.buffer_info()[0], marks,
                                   table.buffer_info()[0], bits, codes)
        return int(skipped), codes.raw[:len(chunk)]
    helper = _helper() if len(names) >= _SHARED_RUN else None
    if helper is None:
        return part(names)
    half = len(names) // 2
    second = helper.submit(part, names[half:])
    skipped, codes = part(names[:half])
    more, rest = second.result()
    return skipped + more, codes + rest


_SHARED_RUN = 64  # names in a run, at least, for its second half to go to another thread
_last_table: list[Any] = [None, None, 0]  # (keys as a weak reference, table, bits)


def _buckets(lib: Any, keys: KnownKeys) -> tuple[array, int]:
    """Where the keys of each value of the uri keys' top bits begin (walk.c
    chload_buckets): about 8 keys a bucket, 4 bytes a bucket; made once for the keys
    of a walk, and again only for other keys."""
    ref, table, bits = _last_table
    if ref is not None and ref() is keys and table is not None:
        return table, bits
    uris = keys.uris
    bits = min(max(len(uris).bit_length() - 3, 1), 24)
    table = array("I", bytes(4 * ((1 << bits) + 1)))
    lib.chload_buckets(uris.buffer_info()[0], len(uris), table.buffer_info()[0], bits)
    try:
        _last_table[:] = [weakref.ref(keys, _forget), table, bits]
    except TypeError:  # (keys that take no weak reference: made again a run)
        pass
    return table, bits


def _forget(ref: weakref.ref) -> None:
    """The keys of the last table are gone: so is the table."""
    if _last_table[0] is ref:
        _last_table[:] = [None, None, 0]


@functools.cache
def _helper() -> ThreadPoolExecutor | None:
    """One thread beside the walk, where the machine has a second core."""
    return ThreadPoolExecutor(1, "chload-walk") if (os.cpu_count() or 1) > 1 else None


def described(lib: Any, run: Run, names: list[str], reads: Callable[[], bool],
              ) -> Iterator[tuple[str, int, int, int, bytes | None]]:
    """For a listing with no known units: (name, code, size, mtime_ns, bytes) of each of
    `names` in `run.directory`, in order: FOUND with its stat and, for a file of at most
    WHOLE bytes, all of them (else None) while `reads()` says they are wanted (asked a
    chunk); ASK for Python to describe; else no source. CHUNK names a call, made on
    threads of their own where the machine has a second core."""
    def part(chunk: list[str]) -> Iterator[tuple[str, int, int, int, bytes | None]]:
        n, limit = len(chunk), WHOLE if reads() else 0
        blob = ("\0".join(chunk) + "\0").encode("utf-8", "surrogateescape")
        sizes, mtimes, lens = array("q", bytes(8 * n)), array("q", bytes(8 * n)), array(
            "i", bytes(4 * n))
        codes, starts = bytearray(n), bytearray(n * limit or 1)
        address = ctypes.addressof
        lib.chload_described(run.fd, blob, n, limit, sizes.buffer_info()[0],
                             mtimes.buffer_info()[0], lens.buffer_info()[0],
                             address((ctypes.c_char * n).from_buffer(codes)),
                             address((ctypes.c_char * len(starts)).from_buffer(starts)))
        view = memoryview(starts)
        return iter([(name, code, size, mtime,
                      view[i * limit:i * limit + length].tobytes() if length > 0 or (
                          length == 0 and limit) else None)
                     for i, (name, code, size, mtime, length) in enumerate(
                         zip(chunk, codes, sizes, mtimes, lens, strict=True))])
    chunks = [names[at:at + CHUNK] for at in range(0, len(names), CHUNK)]
    readers = _readers()
    if readers is None:
        for chunk in chunks:
            yield from part(chunk)
        return
    # the chunks read on threads of their own, _AHEAD_CHUNKS ahead of the one the caller
    # takes: their system calls overlap the caller's Python, and each other's
    ahead = [readers.submit(part, chunk) for chunk in chunks[:_AHEAD_CHUNKS]]
    try:
        for at in range(len(chunks)):
            done = ahead.pop(0).result()
            if at + _AHEAD_CHUNKS < len(chunks):
                ahead.append(readers.submit(part, chunks[at + _AHEAD_CHUNKS]))
            yield from done
    finally:  # (a walk left early: no call may outlive the directory's descriptor)
        wait(ahead)


CHUNK = 256  # names chload_described is given at once
_AHEAD_CHUNKS = 3


@functools.cache
def _readers() -> ThreadPoolExecutor | None:
    """Two threads for a first listing's reads, where the machine has a second core."""
    return ThreadPoolExecutor(2, "chload-walk-reads") if (os.cpu_count() or 1) > 1 else None
