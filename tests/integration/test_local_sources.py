"""Local sources end to end: every spelling of a file, glob characters in real names,
symlink loops, stdin spools, the target's own directory, odd file names and kinds.
The real `chload` command into a real chDB directory; results checked through SQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import services
from conftest import run_chload

pytestmark = pytest.mark.integration


def load(*args: str, cwd: str | None = None, stdin: bytes | None = None,
         timeout: float = 120) -> tuple[int, dict, str]:
    if cwd is None:
        out = run_chload("load", *args, "--json", stdin=stdin, timeout=timeout)
    else:
        out = subprocess.run([sys.executable, "-m", "chload", "load", *args, "--json"],
                             capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


def ids(target: str, table: str) -> list[int]:
    out = run_chload("sql", f"SELECT id FROM {table} ORDER BY id", "--target", target,
                     "--format", "TSV")
    assert out.returncode == 0, out.stderr
    return [int(x) for x in out.stdout.split()]


def ledger(target: str, table: str) -> list[str]:
    out = run_chload("files", "--table", table, "--target", target, "--json")
    assert out.returncode == 0, out.stderr
    return sorted(r["uri"] for r in json.loads(out.stdout))


def csv(path: Path, *values: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("id\n" + "".join(f"{v}\n" for v in values))
    return path


def test_one_file_named_many_ways_loads_once(tmp_path: Path, target_dir: str) -> None:
    d = tmp_path / "data"
    a, b = csv(d / "a.csv", 1, 2), csv(d / "b.csv", 3)
    (d / "sub").mkdir()
    (d / "link.csv").symlink_to(a)
    spellings = [str(a), f"{d}/./a.csv", f"{d}/sub/../a.csv", f"{d}/a*.csv",
                 f"{d}/{{a,b}}.csv", str(d / "link.csv"), f"{d}/", f"file://{a}",
                 f"{d}/*.csv"]
    code, report, err = load(*spellings, "--table", "t", "--target", target_dir)
    assert code == 0, err
    assert (report["files_loaded"], report["rows_loaded"]) == (2, 3)
    assert ids(target_dir, "t") == [1, 2, 3]
    assert ledger(target_dir, "t") == [str(a), str(b)]  # the resolved, absolute paths
    code, report, err = load(str(d / "link.csv"), "--table", "t", "--target", target_dir)
    assert (code, report["files_loaded"], report["files_skipped"]) == (0, 0, 1)


def test_glob_characters_in_real_names_are_taken_literally(tmp_path: Path,
                                                          target_dir: str) -> None:
    d = tmp_path / "data"
    star, brace, bracket = csv(d / "data_*.csv", 1), csv(d / "b{1,2}.csv", 3), \
        csv(d / "x[1].csv", 5)
    csv(d / "data_a.csv", 2), csv(d / "b1.csv", 4), csv(d / "x1.csv", 6)
    odd = d / "dir*x"  # small files of one directory: loaded as one batch where possible
    csv(odd / "f.csv", 7), csv(odd / "g,h.csv", 8), csv(odd / "i{j}.csv", 9)
    csv(odd / "k'l.csv", 10), csv(d / "dirAx" / "f.csv", 11)
    code, report, err = load(str(star), str(brace), str(bracket), str(odd), "--table", "t",
                             "--target", target_dir, "--audit")
    assert code == 0, err
    assert report["files_loaded"] == 7
    assert ids(target_dir, "t") == [1, 3, 5, 7, 8, 9, 10]
    out = run_chload("sql", "SELECT DISTINCT _source_file FROM t ORDER BY 1", "--target",
                     target_dir, "--format", "JSONEachRow")
    sources = sorted(json.loads(line)["_source_file"] for line in out.stdout.splitlines())
    assert sources == ledger(target_dir, "t") == sorted(
        str(p) for p in [star, brace, bracket, odd / "f.csv", odd / "g,h.csv",
                         odd / "i{j}.csv", odd / "k'l.csv"])


def test_symlink_loops_end_and_load_each_file_once(tmp_path: Path, target_dir: str) -> None:
    d = tmp_path / "data"
    csv(d / "a.csv", 1), csv(d / "sub" / "b.csv", 2)
    (d / "loop").symlink_to(d)
    (d / "sub" / "back").symlink_to(d)
    (d / "sub" / "self").symlink_to(d / "sub")
    for n, source in enumerate([f"{d}/**/*.csv", str(d)]):
        code, report, err = load(source, "--table", f"t{n}", "--target", target_dir,
                                 timeout=60)
        assert code == 0, err
        assert (report["files_loaded"], report["rows_loaded"]) == (2, 2)
        assert ids(target_dir, f"t{n}") == [1, 2]


def test_stdin_leaves_no_spool_behind(target_dir: str) -> None:
    code, report, err = load("-", "--table", "s", "--format", "CSVWithNames", "--target",
                             target_dir, stdin=b"id\n1\n2\n")
    assert (code, report["rows_loaded"]) == (0, 2), err
    code, report, err = load("-", "--table", "s", "--format", "CSVWithNames", "--target",
                             target_dir, stdin=b"id\nnot a number\n")
    assert code != 0 and report["files_failed"] == 1
    spools = [n for n in os.listdir(os.path.join(target_dir, "tmp")) if "stdin" in n] \
        if os.path.isdir(os.path.join(target_dir, "tmp")) else []
    assert spools == []
    assert ids(target_dir, "s") == [1, 2]


def test_a_chload_directory_is_never_a_source(tmp_path: Path) -> None:
    work = tmp_path / "work"
    csv(work / "a.csv", 1)
    code, _, err = load(".", "--table", "t", cwd=str(work))  # default target ./chload-data
    assert code == 0, err
    assert (work / "chload-data").is_dir()  # (once in chDB's own directory: engine.prefetch)
    csv(work / "b.csv", 2)
    code, report, err = load(".", "--table", "t", cwd=str(work))
    assert code == 0, err
    assert (report["files_loaded"], report["files_skipped"]) == (1, 1)
    other = str(tmp_path / "other")  # a target elsewhere: ./chload-data is still no source
    code, report, err = load(str(work), "--table", "t", "--target", other)
    assert code == 0, err
    assert report["files_loaded"] == 2
    assert ids(other, "t") == [1, 2]


def test_a_name_that_is_not_utf8_loads(tmp_path: Path, target_dir: str) -> None:
    d = tmp_path / "data"
    csv(d / "ok.csv", 1)
    with open(os.path.join(os.fsencode(d), b"caf\xe9.csv"), "w") as f:
        f.write("id\n2\n")
    code, report, err = load(str(d), "--table", "t", "--target", target_dir, "--audit")
    assert code == 0, err
    assert report["files_loaded"] == 2
    assert ids(target_dir, "t") == [1, 2]
    assert ledger(target_dir, "t") == [f"{d}/caf\\xe9.csv", f"{d}/ok.csv"]


def test_files_that_are_not_regular_are_skipped_or_named(tmp_path: Path,
                                                         target_dir: str) -> None:
    d = tmp_path / "data"
    csv(d / "a.csv", 1)
    os.mkfifo(d / "pipe.csv")
    (d / "dir.csv").mkdir()
    code, report, err = load(str(d), f"{d}/*.csv", "--table", "t", "--target", target_dir,
                             timeout=60)
    assert code == 0, err
    assert report["files_loaded"] == 1
    code, report, err = load(str(d / "pipe.csv"), "--table", "t", "--target", target_dir,
                             timeout=60)
    assert code == 2 and "pipe.csv: not a regular file" in err
    assert len(err.strip().splitlines()) == 1


def test_brace_alternatives_match_what_exists_and_empty_patterns_fail_first(
        tmp_path: Path, target_dir: str) -> None:
    d = tmp_path / "data"
    csv(d / "a1.csv", 1), csv(d / "a3.csv", 3)
    code, report, err = load(f"{d}/a{{1..3}}.csv", "--table", "t", "--target", target_dir)
    assert code == 0, err
    assert report["files_loaded"] == 2
    code, report, err = load(str(d / "a1.csv"), f"{d}/none*.csv", "--table", "u",
                             "--target", target_dir)
    assert code == 2 and f"{d}/none*.csv: " in err
    assert "u" not in run_chload("sql", "SHOW TABLES", "--target", target_dir,
                                 "--format", "TSV").stdout.split()


def test_odd_names_and_stdin_into_a_server(clickhouse: services.Service, tmp_path: Path,
                                           table_name: str) -> None:
    """Into 18.16: raw posts read the file from Python, --audit pushes it through the
    loader's chDB file(); either way one file, its own rows, its real path."""
    star = csv(tmp_path / "data_*.csv", 1)
    csv(tmp_path / "data_a.csv", 2)
    target = f"http://loader@127.0.0.1:{clickhouse.ports['http']}/default"
    secret = {"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]}
    for n, extra in enumerate([[], ["--audit"]]):
        out = run_chload("load", str(star), "--table", f"{table_name}_{n}", "--target",
                         target, *extra, env=secret, timeout=120)
        assert out.returncode == 0, out.stderr
        assert services.clickhouse_query(
            clickhouse, f"SELECT groupArray(id) FROM {table_name}_{n}").strip() == "[1]"
    assert services.clickhouse_query(
        clickhouse, f"SELECT DISTINCT _source_file FROM {table_name}_1").strip() == str(star)
    out = run_chload("load", "-", "--table", f"{table_name}_0", "--format", "CSVWithNames",
                     "--target", target, env=secret, stdin=b"id\n3\n", timeout=120)
    assert out.returncode == 0, out.stderr
    assert services.clickhouse_query(
        clickhouse, f"SELECT count() FROM {table_name}_0").strip() == "2"
