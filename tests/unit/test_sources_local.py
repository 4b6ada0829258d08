"""Local sources without an engine: how paths, globs, links and stdin become files."""

from __future__ import annotations

import io
import os
import sys
import tempfile
from pathlib import Path

import pytest

from chload.errors import SourceError
from chload.formats import FileFormat
from chload.sources.base import SourceFile, revised
from chload.sources.files.local import list_local, release, spool_stdin, table_function
from chload.sources.files.patterns import brace_list


def csv(path: Path, text: str = "id\n1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def uris(pattern: str | Path) -> list[str]:
    files = list_local(str(pattern), None, None)
    release(files)
    return [f.uri for f in files]


def test_a_file_is_known_by_its_resolved_location(tmp_path: Path) -> None:
    a = csv(tmp_path / "a.csv")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.csv").symlink_to(a)
    for spelling in [f"{tmp_path}/sub/../a.csv", f"{tmp_path}/link.csv",
                     f"file://{a}", f"file://localhost{a}"]:
        assert uris(spelling) == [str(a)]
    assert uris(f"{tmp_path}/") == [str(a)]  # the link and the file: one file
    spaced = csv(tmp_path / "a b.csv")
    assert uris(f"file://{tmp_path}/a%20b.csv") == [str(spaced)]


def test_relative_spellings_in_the_working_directory(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    a = csv(tmp_path / "a.csv")
    b = csv(tmp_path / "sub" / "b.csv")
    monkeypatch.chdir(tmp_path)
    for spelling, expected in [("a.csv", [a]), ("./a.csv", [a]), ("sub/b.csv", [b]),
                               ("*.csv", [a]), ("sub/../a.csv", [a]), (".", [a, b])]:
        assert uris(spelling) == [str(p) for p in expected], spelling


def test_symlink_loops_list_each_file_once(tmp_path: Path) -> None:
    a, b = csv(tmp_path / "a.csv"), csv(tmp_path / "sub" / "b.csv")
    (tmp_path / "sub" / "loop").symlink_to(tmp_path)  # two loops: see the integration test
    expected = [str(a), str(b)]
    assert uris(f"{tmp_path}/**/*.csv") == uris(tmp_path) == expected
    assert uris(f"{tmp_path}/**") == expected
    assert uris(f"{tmp_path}/sub/**/b.csv") == [str(b)]


def test_an_existing_name_is_taken_literally(tmp_path: Path) -> None:
    for name in ["data_*.csv", "b{1,2}.csv", "x[1].csv", "q?.csv"]:
        real = csv(tmp_path / name)
        csv(tmp_path / name.replace("*", "a").replace("{1,2}", "1").replace("[1]", "1")
            .replace("?", "a"))
        assert uris(real) == [str(real)]


def test_names_the_engine_would_expand_reach_it_as_plain_links(tmp_path: Path) -> None:
    real = csv(tmp_path / "dir*x" / "f{1}.csv")
    files = list_local(str(real), None, None)
    (file,) = files
    assert file.uri == str(real)
    sql = table_function(file, "CSV", None)
    assert "*" not in sql and "{" not in sql
    link = file.local_path or ""
    assert os.path.realpath(link) == str(real)
    release(files)
    assert not os.path.lexists(link) and not os.path.exists(os.path.dirname(link))
    assert real.exists()


def test_a_name_that_is_not_utf8_has_a_readable_uri(tmp_path: Path) -> None:
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.csv"), "w") as f:
        f.write("id\n1\n")
    files = list_local(str(tmp_path), None, None)
    assert [f.uri for f in files] == [f"{tmp_path}/caf\\xe9.csv"]
    table_function(files[0], "CSV", None).encode()  # plain text: the engine takes it
    release(files)


def test_chload_targets_are_never_sources(tmp_path: Path) -> None:
    a = csv(tmp_path / "a.csv")
    csv(tmp_path / "chload-data" / "store" / "x.csv")
    (tmp_path / "chload-data" / ".chload.lock").write_text("1")
    assert uris(tmp_path) == uris(f"{tmp_path}/**/*.csv") == [str(a)]
    with pytest.raises(SourceError, match="chload target directory"):
        list_local(str(tmp_path / "chload-data"), None, None)
    with pytest.raises(SourceError, match="inside a chload target"):
        list_local(str(tmp_path / "chload-data" / "store" / "x.csv"), None, None)


def test_what_is_not_a_regular_file_is_skipped_or_named(tmp_path: Path) -> None:
    a = csv(tmp_path / "a.csv")
    os.mkfifo(tmp_path / "p.csv")
    (tmp_path / "d.csv").mkdir()
    assert uris(tmp_path) == uris(f"{tmp_path}/*.csv") == [str(a)]
    with pytest.raises(SourceError, match="p.csv: not a regular file"):
        list_local(str(tmp_path / "p.csv"), None, None)


def test_brace_alternatives_are_what_exists(tmp_path: Path) -> None:
    a1, a3 = csv(tmp_path / "a1.csv"), csv(tmp_path / "a3.csv")
    assert uris(f"{tmp_path}/a{{1..3}}.csv") == [str(a1), str(a3)]
    with pytest.raises(SourceError, match=r"a\{7,8\}\.csv: no such file, or the pattern"):
        list_local(f"{tmp_path}/a{{7,8}}.csv", None, None)


def test_stdin_spool_leaves_nothing_behind(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"id\n1\n2\n")))
    spool = spool_stdin("CSVWithNames", None, str(tmp_path))
    assert os.listdir(tmp_path) == []  # nothing on disk, even if the process is killed
    with open(spool.local_path or "", "rb") as f:
        assert f.read() == b"id\n1\n2\n"
    assert spool.size == 7
    release([spool])
    assert not os.path.exists(spool.local_path or "")


def test_brace_list_refuses_a_directory_the_engine_would_expand() -> None:
    def files(*paths: str) -> list[SourceFile]:
        return [SourceFile(p, 1, 0, FileFormat("CSV", "none"), local_path=p) for p in paths]

    assert brace_list(files("/d/a.csv", "/d/b.csv")) == "/d/{a.csv,b.csv}"
    assert brace_list(files("/d*x/a.csv", "/d*x/b.csv")) is None
    assert brace_list(files("/d{1}/a.csv", "/d{1}/b.csv")) is None


def test_a_failed_listing_leaves_no_link(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    csv(tmp_path / "data" / "a*.csv")
    os.mkfifo(tmp_path / "data" / "b.csv")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with pytest.raises(SourceError, match="not a regular file"):
        list_local(f"{tmp_path}/data/{{a*,b}}.csv", None, None)
    assert os.listdir(tmp_path / "tmp") == []


def test_revised_is_dataclasses_replace() -> None:
    from dataclasses import fields, replace

    file = SourceFile("/d/a.csv", 3, 4, FileFormat("CSV", "none"), etag="e", local_path="/d/a.csv",
                      kind="local", aliases=("/x/a.csv",), empty=True)
    changes = {"format": FileFormat("CSVWithNames", "none"), "size": 5, "mtime_ns": 6}
    assert revised(file, **changes) == replace(file, **changes)
    for f in fields(SourceFile):  # each field lands in its own place
        assert getattr(revised(file, **{f.name: "v"}), f.name) == "v"

