"""runtime/library.py: a loaded library's relocation table unmapped, the library intact."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess

import pytest

from chload.runtime.library import _section, release_relocations

# a table of pointers, each a relocation the loader applies: a relocation table of
# several pages (24 bytes an entry)
_POINTERS = 2048
_SOURCE = (
    "static const char *names[] = {"
    + ",".join(f'"n{i}"' for i in range(_POINTERS))
    + "};\nint name_length(int i) { int n = 0; while (names[i][n]) n++; return n; }\n"
)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        pytest.skip("no C compiler")
    tmp_path = tmp_path_factory.mktemp("library")
    source = tmp_path / "pointers.c"
    source.write_text(_SOURCE)
    path = tmp_path / "libpointers.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(path), str(source)],
                   check=True)
    return str(path)


def _resident(start: int, end: int) -> int:
    """Pages of [start, end) mapped in this process (/proc/self/pagemap, bit 63)."""
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(start // 4096 * 8)
        entries = pagemap.read((end - start) // 4096 * 8)
    return sum(1 for (entry,) in struct.iter_unpack("<Q", entries) if entry >> 63)


def _addresses(path: str, offset: int, size: int) -> tuple[int, int]:
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) == 6 and fields[5] == os.path.realpath(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            first = int(fields[2], 16)
            if first <= offset < first + end - start:
                return start + offset - first, start + offset - first + size
    raise AssertionError(f"{path}: offset {offset} not mapped")


def test_the_relocation_table_is_unmapped_and_the_library_still_works(library):
    loaded = ctypes.CDLL(library)
    offset, size = _section(library, b".rela.dyn")
    assert size >= _POINTERS * 24
    start, end = _addresses(library, offset, size)
    whole = (-(-start // 4096) * 4096, end // 4096 * 4096)
    ctypes.string_at(start, size)  # every page of the table mapped
    assert _resident(*whole) == (whole[1] - whole[0]) // 4096

    assert release_relocations(library) == whole[1] - whole[0]
    assert _resident(*whole) == 0
    assert [loaded.name_length(i) for i in (0, 9, 2047)] == [2, 2, 5]  # pointers as set


def test_what_is_not_a_loaded_elf_library_is_left_alone(tmp_path, library):
    text = tmp_path / "not-elf.so"
    text.write_text("not a library")
    assert release_relocations(str(text)) == 0
    assert release_relocations(str(tmp_path / "missing.so")) == 0
    copy = tmp_path / "copy.so"
    shutil.copy(library, copy)
    assert release_relocations(str(copy)) == 0  # an ELF file this process has not loaded
