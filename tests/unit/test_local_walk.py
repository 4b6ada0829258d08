"""The local walk's compiled loop (sources/files/walk.py, walk.c): the same files in the
same order as the Python walk, and known files passed by, counted, on real directories."""

from __future__ import annotations

import hashlib
import os
import re
from array import array
from pathlib import Path

import pytest

from chload.commit.known import KnownUnits, key
from chload.sources.base import Skipped, SourceFile
from chload.sources.files import local, walk
from chload.sources.files.patterns import glob_regex
from chload.sources.files.s3 import KeyMatcher

LIB, WHY = walk.library()
needs_cc = pytest.mark.skipif(LIB is None, reason=f"no compiled walk: {WHY}")


def tree(root: Path) -> None:
    """Files, subdirectories that sort around them, hidden names, a symlinked directory
    (walked once), a chload target (never walked) and a name holding a glob character."""
    for rel in ["a.csv", "a-b/x.csv", "a/y.csv", "a0.csv", "b/c/d.csv", "b/e.csv",
                ".hidden.csv", "h/.x/z.csv", "star*name.csv", "target/t.csv", "z.csv"]:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("id\n1\n")
    (root / "target" / ".chload.lock").write_text("")
    os.symlink(root / "b", root / "link-to-b")
    os.symlink(root / "a.csv", root / "link.csv")


def flat(runs: list[walk.Run]) -> list[str]:
    return [os.path.join(r.directory, n) for r in runs for n in r.names]


@needs_cc
def test_the_compiled_walk_finds_what_the_python_walk_finds(tmp_path: Path) -> None:
    tree(tmp_path)
    runs = list(walk.runs(LIB, str(tmp_path)))
    assert flat(runs) == list(local._walk(str(tmp_path)))
    assert all(not n.startswith(".") for r in runs for n in r.names)


@needs_cc
def test_a_directory_of_long_names_fills_more_than_the_first_buffer(tmp_path: Path) -> None:
    for i in range(3000):  # ~100 KB of names: the walk's buffers grow
        (tmp_path / f"{i:05d}-{'n' * 25}.csv").write_text("")
    runs = list(walk.runs(LIB, str(tmp_path)))
    assert flat(runs) == list(local._walk(str(tmp_path)))
    assert len(flat(runs)) == 3000


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def many_directories(root: Path, count: int = 40) -> None:
    for d in range(count):
        (root / f"d{d:03d}").mkdir()
        for f in range(3):
            (root / f"d{d:03d}" / f"{f}.csv").write_text("")


@needs_cc
def test_a_walk_read_ahead_gives_every_directory_in_order_and_closes_it(
        tmp_path: Path) -> None:
    many_directories(tmp_path)
    before = open_descriptors()
    runs = walk.runs(LIB, str(tmp_path))
    first = next(runs)
    assert first.directory == f"{tmp_path}/d000" and os.fstat(first.fd)  # (still open)
    rest = list(runs)
    assert [r.directory for r in [first, *rest]] == [
        f"{tmp_path}/d{d:03d}" for d in range(40)]
    assert open_descriptors() == before


@needs_cc
def test_a_walk_left_early_closes_the_directories_read_ahead(tmp_path: Path) -> None:
    many_directories(tmp_path)
    before = open_descriptors()
    runs = walk.runs(LIB, str(tmp_path))
    next(runs)
    runs.close()
    assert open_descriptors() == before


@needs_cc
def test_an_error_reading_ahead_reaches_the_walks_caller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    many_directories(tmp_path)
    before = open_descriptors()
    entries, calls = walk._entries, []

    def failing(lib: object, fd: int, buffers: object) -> object:
        calls.append(fd)
        if len(calls) == 5:
            raise MemoryError("no room for the names")
        return entries(lib, fd, buffers)
    monkeypatch.setattr(walk, "_entries", failing)
    seen = []
    with pytest.raises(MemoryError, match="no room"):
        for run in walk.runs(LIB, str(tmp_path)):
            seen.append(run.directory)
    assert seen == [f"{tmp_path}/d{d:03d}" for d in range(3)]  # (the root read first)
    assert open_descriptors() == before


@needs_cc
def test_the_compiled_md5_key_is_the_engines(tmp_path: Path) -> None:
    for text in [b"", b"abc", b"x" * 55, b"x" * 56, b"x" * 64, b"/d/" * 40, os.urandom(99)]:
        expected = int.from_bytes(hashlib.md5(text).digest()[:8], "little")
        assert LIB.chload_md5_key(text, len(text)) == expected


def known_of(files: list[SourceFile], extra: int = 0) -> KnownUnits:
    """The keys of `files`, and `extra` keys of files that are not there (a long history)."""
    pairs = sorted([(key(f.uri), key(f.identity)) for f in files]
                   + [(key(f"/gone/{i}.csv"), key("1:1")) for i in range(extra)])
    return KnownUnits(array("Q", (u for u, _ in pairs)), array("Q", (i for _, i in pairs)))


@needs_cc
def test_known_files_come_counted_new_and_changed_ones_as_files(tmp_path: Path) -> None:
    tree(tmp_path)
    pattern = f"{tmp_path}/**/*.csv"
    before = [f for f in local.stream_local(pattern, None, None) if isinstance(f, SourceFile)]
    known = known_of(before, extra=5000)
    (tmp_path / "b" / "e.csv").write_text("id\n1\n2\n")  # changed
    (tmp_path / "new.csv").write_text("id\n3\n")
    listed = list(local.stream_local(pattern, None, None, known))
    skipped = sum(f.count for f in listed if isinstance(f, Skipped))
    files = sorted(f.uri for f in listed if isinstance(f, SourceFile))
    # the link to a file, the directory walked twice (by its link), the name holding a
    # glob character (read through a link): decided in Python, as before
    assert f"{tmp_path}/new.csv" in files and f"{tmp_path}/b/e.csv" in files
    assert skipped + len(files) == len(before) + 1
    assert skipped >= len(before) - 6
    assert sum(known.met) == skipped


@needs_cc
def test_a_file_met_twice_is_passed_by_once(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.csv").write_text("id\n1\n")
    first = [f for f in local.stream_local(str(tmp_path / "d"), None, None)
             if isinstance(f, SourceFile)]
    known = known_of(first)
    again = list(local.stream_local(str(tmp_path / "d"), None, None, known))
    twice = list(local.stream_local(str(tmp_path / "d"), None, None, known))
    assert again == [Skipped(1)]
    assert [f.uri for f in twice] == [first[0].uri]  # the plan releases the second


@pytest.mark.parametrize("pattern, name, hit", [
    ("[\\]x.csv", "\\x.csv", True),  # a backslash in a class is a character
    ("[\\d].csv", "d.csv", True),
    ("[\\d].csv", "5.csv", False),  # not a regex's class of digits
    ("[!a].csv", "b.csv", True),
    ("a**b.csv", "a1/2b.csv", False),  # no `**` within a local component
    ("?.csv", "/.csv", False),
])
def test_a_local_component_as_a_regex(pattern: str, name: str, hit: bool) -> None:
    assert bool(re.fullmatch(glob_regex(pattern), name, re.DOTALL)) is hit


@pytest.mark.parametrize("pattern, key, hit", [
    ("t/[\\]x.csv", "t/\\x.csv", True),
    ("t/[\\d].csv", "t/d.csv", True),
    ("t/[\\d].csv", "t/5.csv", False),
    ("t/a**b.csv", "t/a1/2b.csv", True),  # an S3 `**` crosses segments wherever it stands
])
def test_an_s3_glob_as_a_regex(pattern: str, key: str, hit: bool) -> None:
    assert KeyMatcher(pattern).matches(key) is hit


@pytest.mark.parametrize("name", ["*.csv", "*", "*csv", "*.csv.gz", "a*.csv", "*[!x].csv",
                                  "*?.csv", "*.c]sv"])
def test_the_names_of_a_directory_kept_as_the_pattern_of_a_path_keeps_them(name: str) -> None:
    names = ["a.csv", "b.csv.gz", "csv", "x.csv", "a1.csv", "ab.CSV", "c]sv", "d.c]sv",
             "e.csv\n", "f.tsv", "é.csv"]
    expected = [n for n in names if local._matcher(("**", name))(n)]
    keep = local._names_filter(("**", name))
    assert keep is not None
    assert keep(names) == expected
    every = [n for n in names if n in expected]
    assert keep(every) == every


def test_a_directory_whose_names_all_match_is_kept_whole() -> None:
    names = [f"f{i:07d}.csv" for i in range(1000)]
    keep = local._names_filter(("**", "*.csv"))
    assert keep is not None
    assert keep(names) is names and keep(names + ["g.tsv"]) == names


@needs_cc
@pytest.mark.parametrize("mtime_ns", [-1_500_000_001, 0, 7, 1_764_000_000_123_456_789])
def test_a_known_file_is_passed_by_whatever_its_modification_time(
        tmp_path: Path, mtime_ns: int) -> None:
    for i in range(300):  # (enough for the run to be shared by two threads)
        (tmp_path / f"{i:03d}.csv").write_text("id\n1\n")
        os.utime(tmp_path / f"{i:03d}.csv", ns=(mtime_ns, mtime_ns))
    first = [f for f in local.stream_local(str(tmp_path), None, None)
             if isinstance(f, SourceFile)]
    assert {f.identity for f in first} == {f"5:{mtime_ns}"}
    assert list(local.stream_local(str(tmp_path), None, None,
                                   known_of(first, extra=20_000))) == [Skipped(300)]


@needs_cc
def test_the_lookup_table_of_a_walk_goes_with_its_keys(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("id\n1\n")
    first = [f for f in local.stream_local(str(tmp_path), None, None)
             if isinstance(f, SourceFile)]
    known = known_of(first, extra=1000)
    assert list(local.stream_local(str(tmp_path), None, None, known)) == [Skipped(1)]
    assert walk._last_table[1] is not None
    del known
    assert walk._last_table[1] is None


@needs_cc
def test_a_first_listing_describes_as_the_python_walk_does(tmp_path: Path) -> None:
    """No unit known: the compiled walk stats each file and reads the small ones whole;
    its SourceFiles are the Python walk's, links and names it cannot take described by
    Python, and the bytes it read are kept for the header checks (no file read again)."""
    tree(tmp_path)
    big = tmp_path / "big.csv"
    big.write_text("id\n" + "1\n" * walk.WHOLE)  # larger than it reads whole
    (tmp_path / "caf\xe9.csv").write_text("id\n2\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "gz.csv").write_bytes(b"\x1f\x8b\x08\x00rest")  # a gzip saved as .csv
    pattern = f"{tmp_path}/**/*.csv"

    def shown(files: list) -> list:
        return [(f.uri, f.size, f.mtime_ns, f.format, f.aliases, f.local_path == f.uri)
                for f in files]
    with local.sniff.kept_starts():
        first = list(local.stream_local(pattern, None, None, known_of([])))
        assert shown(first) == shown(list(local.stream_local(pattern, None, None)))
        kept = dict(local.sniff._STARTS)
        read: list[str] = []
        real = local.sniff._read_plain
        local.sniff._read_plain = lambda path, *a: read.append(path) or real(path, *a)
        try:
            stored = local.described(first, None)
        finally:
            local.sniff._read_plain = real
    by_uri = {f.uri: f for f in stored}
    assert by_uri[f"{tmp_path}/gz.csv"].format.compression == "gzip"
    assert by_uri[f"{tmp_path}/a.csv"].format.compression == "none"
    assert kept[(f"{tmp_path}/a.csv", "none", 5, by_uri[f"{tmp_path}/a.csv"].mtime_ns)] == \
        b"id\n1\n"
    # read again: what the C walk left to Python (a name not ASCII or with a
    # glob character: read through a link of a plain name), what it does not read
    # whole, and what shows a compression
    assert sorted(re.sub(r"^\d+-", "", os.path.basename(p)) for p in read) == sorted(
        ["big.csv", "caf\xe9.csv", "gz.csv", "star_name.csv"])  # (link.csv: a.csv)


@needs_cc
def test_a_file_changed_between_its_stat_and_read_is_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("id\n1\n")
    listed = SourceFile(str(path), 5, path.stat().st_mtime_ns, local._format_of(
        ".csv", None, None), local_path=str(path))
    with local.sniff.kept_starts():
        local.sniff.keep_whole([(listed, b"id\n1\n2\n")])  # (grown: 7 bytes read)
        assert not local.sniff._STARTS
        local.sniff.keep_whole([(listed, b"id\n1\n")])
        assert len(local.sniff._STARTS) == 1
    assert not local.sniff._STARTS


@needs_cc
def test_a_first_listing_left_early_waits_for_its_reads_and_closes_directories(
        tmp_path: Path) -> None:
    for i in range(3 * walk.CHUNK + 7):  # more chunks than are read ahead
        (tmp_path / f"{i:05d}.csv").write_text(f"id\n{i}\n")
    before = open_descriptors()
    listing = local.stream_local(f"{tmp_path}/*.csv", None, None, known_of([]))
    assert next(listing).uri == f"{tmp_path}/00000.csv"
    listing.close()
    assert open_descriptors() == before
    files = list(local.stream_local(f"{tmp_path}/*.csv", None, None, known_of([])))
    assert [f.size for f in files[:3]] == [5, 5, 5] and len(files) == 3 * walk.CHUNK + 7


@needs_cc
def test_a_first_listing_keeps_a_long_directory_as_it_goes_and_reads_no_more_than_kept(
        tmp_path: Path) -> None:
    count = 2 * walk.CHUNK + 3
    for i in range(count):
        (tmp_path / f"{i:05d}.csv").write_text(f"id\n{i}\n")
    pattern = f"{tmp_path}/*.csv"
    with local.sniff.kept_starts():
        listing = local.stream_local(pattern, None, None, known_of([]))
        for _ in range(walk.CHUNK + 1):  # (kept as they come: not at the directory's end)
            next(listing)
        assert len(local.sniff._STARTS) == walk.CHUNK
        assert len(list(listing)) == count - walk.CHUNK - 1
        assert len(local.sniff._STARTS) == count
    walked = walk.runs(LIB, str(tmp_path))
    lib_run = next(walked)  # (its descriptor open while the walk is)
    stats = list(walk.described(LIB, lib_run, lib_run.names, lambda: False))
    walked.close()
    assert [c for _, c, *_ in stats] == [walk.FOUND] * count
    assert all(data is None for *_, data in stats)  # (none wanted: none read)


@needs_cc
def test_a_glob_of_one_directory_lists_as_the_python_glob_does(tmp_path: Path) -> None:
    """`dir/*.csv` (wildcards in the last component only) comes as one run of the
    directory's matching names: the same files as the Python glob, first or rerun."""
    tree(tmp_path)
    (tmp_path / "dir.csv").mkdir()  # a directory the pattern matches: no source
    (tmp_path / "caf\xe9.csv").write_text("id\n2\n")

    def shown(files: list) -> list:
        return [(f.uri, f.size, f.mtime_ns, f.format, f.aliases, f.local_path == f.uri)
                for f in files if isinstance(f, SourceFile)]
    for pattern in (f"{tmp_path}/*.csv", f"{tmp_path}/a*.csv", f"{tmp_path}/b/*"):
        python = list(local.stream_local(pattern, None, None))
        assert shown(list(local.stream_local(pattern, None, None, known_of([])))) == \
            shown(python)
        known = known_of([f for f in python if isinstance(f, SourceFile)])
        again = list(local.stream_local(pattern, None, None, known))
        assert sum(f.count for f in again if isinstance(f, Skipped)) + len(shown(again)) \
            == len(shown(python))
    with local.sniff.kept_starts():  # (read as listed: the compiled path was taken)
        list(local.stream_local(f"{tmp_path}/*.csv", None, None, known_of([])))
        assert (f"{tmp_path}/z.csv", "none", 5) in {k[:3] for k in local.sniff._STARTS}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert [f.uri for f in local.stream_local("a*.csv", None, None, known_of([]))] == [
            f"{tmp_path}/a.csv", f"{tmp_path}/a0.csv"]
    finally:
        os.chdir(cwd)
