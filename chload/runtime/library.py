"""The engine's library once loaded: its relocation table's pages given back.

chDB's library carries a relocation table (`.rela.dyn`, tens of MiB: an entry for each
pointer in its tables of functions) that the dynamic loader reads once, while it loads
the library, and nothing reads again. Its pages stay mapped from the page cache, counted
in the process's resident size, for as long as the process lives: a rerun over a million
known files, bounded by its resident size, paid for them throughout. `MADV_DONTNEED`
unmaps them; should anything read them again, they come back from the file (the mapping
is read-only and file-backed: nothing of the process's own is in it to lose).

Only where every step checks out: a 64-bit little-endian ELF file whose `.rela.dyn`
lies inside one read-only mapping of that file in this process; else nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct

MADV_DONTNEED = 4  # (linux/mman.h)
_SECTION = b".rela.dyn"


def release_relocations(library: str) -> int:
    """Unmap the pages of `library`'s relocation table (it is loaded); return how many
    bytes were given back (0 when the table could not be found or placed safely)."""
    try:
        span = _section(library, _SECTION)
        where = _mapped(library, *span) if span else None
    except (OSError, ValueError, struct.error):
        return 0
    if where is None:
        return 0
    page = mmap.PAGESIZE
    lo, hi = -(-where[0] // page) * page, (where[1] // page) * page  # whole pages inside
    if hi <= lo:
        return 0
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if libc.madvise(lo, hi - lo, MADV_DONTNEED) == 0:
            return hi - lo
    return 0


def _section(path: str, name: bytes) -> tuple[int, int] | None:
    """(file offset, size) of the section `name` of a 64-bit little-endian ELF file."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:6] != b"\x7fELF\x02\x01":  # ELFCLASS64, ELFDATA2LSB
            return None
        shoff, = struct.unpack_from("<Q", header, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", header, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        _, _, _, _, names_at, names_size = sections[shstrndx]
        f.seek(names_at)
        names = f.read(names_size)
    for at, _, _, _, offset, size in sections:
        if names[at:names.index(b"\0", at)] == name:
            return offset, size
    return None


def _mapped(path: str, offset: int, size: int) -> tuple[int, int] | None:
    """The addresses of file bytes [offset, offset + size) of `path` in this process,
    when one read-only private mapping of the file holds them all."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[5].strip() != real or fields[1] != "r--p":
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            first = int(fields[2], 16)
            if first <= offset and offset + size <= first + (end - start):
                return start + offset - first, start + offset - first + size
    return None
