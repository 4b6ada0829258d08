"""Bad input: error budgets, the rejects table, validation, history, and a corpus of
broken files that must never produce a traceback or lose a row."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import run_chload

pytestmark = pytest.mark.integration

BAD_ROWS = {5, 100, 250, 500, 501, 777, 1000}  # data rows (1-based) with "abc" as miles


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """good.csv.gz: 1,000 rows; bad.csv.gz: 1,000 rows of which 7 are malformed."""
    good = "id,miles,duration\n" + "".join(f"{i},{i % 100},{i % 7}\n" for i in range(1, 1001))
    bad = "id,miles,duration\n" + "".join(
        f"{i + 1000},{'abc' if i in BAD_ROWS else i % 100},{i % 7}\n" for i in range(1, 1001))
    (tmp_path / "good.csv.gz").write_bytes(gzip.compress(good.encode()))
    (tmp_path / "bad.csv.gz").write_bytes(gzip.compress(bad.encode()))
    return tmp_path / "good.csv.gz", tmp_path / "bad.csv.gz"


def _json(*args: str) -> tuple[int, object]:
    out = run_chload(*args)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


def _scalar(target: str, query: str) -> str:
    return run_chload("sql", query, "--target", target, "--format", "TSV").stdout.strip()


def test_within_budget_good_rows_load_and_rejects_are_kept(pair: tuple[Path, Path],
                                                           target_dir: str) -> None:
    good, bad = pair
    code, report = _json("load", str(good), str(bad), "--table", "t", "--target", target_dir,
                         "--schema", "id UInt64, miles UInt32, duration UInt32",
                         "--max-errors", "10", "--json")
    assert code == 0
    assert isinstance(report, dict)
    assert (report["rows_loaded"], report["rows_rejected"]) == (1993, 7)
    assert _scalar(target_dir, "SELECT count() FROM t") == "1993"
    code, rejected = _json("errors", "--table", "t", "--target", target_dir, "--json")
    assert code == 0 and isinstance(rejected, list)
    assert [r["line"] for r in rejected] == sorted(n + 1 for n in BAD_ROWS)  # header is line 1
    assert all(r["file"] == str(bad) and "miles" in r["error"] and ",abc," in r["raw"]
               for r in rejected)


def test_over_budget_fails_the_file_and_leaves_nothing(pair: tuple[Path, Path],
                                                       target_dir: str) -> None:
    good, bad = pair
    code, report = _json("load", str(good), str(bad), "--table", "t2", "--target", target_dir,
                         "--schema", "id UInt64, miles UInt32, duration UInt32",
                         "--max-errors", "3", "--json")
    assert code == 1 and isinstance(report, dict)
    assert (report["files_failed"], report["files_loaded"]) == (1, 1)
    assert _scalar(target_dir, "SELECT count(), max(id) FROM t2") == "1000\t1000"
    failed = [f for f in report["files"] if f["status"] == "failed"][0]
    assert "rejected rows exceed --max-errors 3" in failed["error"]
    assert "the first at line 6" in failed["error"]


def test_inferred_table_keeps_numbers_numeric_when_a_budget_is_set(
        pair: tuple[Path, Path], target_dir: str) -> None:
    """A run as a user types it: a glob (bad.csv.gz sorts first, so the schema
    is inferred from the file with "abc" in a numeric column) and no --schema."""
    glob = str(pair[0].parent / "*.csv.gz")
    code, report = _json("load", glob, "--table", "t", "--target", target_dir,
                         "--max-errors", "10", "--json")
    assert code == 0 and isinstance(report, dict)
    assert (report["rows_loaded"], report["rows_rejected"]) == (1993, 7)
    assert _scalar(target_dir, "SELECT toTypeName(miles) FROM t LIMIT 1") == "Int64"
    code, report = _json("load", glob, "--table", "t2", "--target", target_dir,
                         "--max-errors", "3", "--json")
    assert code == 1 and isinstance(report, dict)
    assert (report["files_failed"], report["files_loaded"]) == (1, 1)
    assert _scalar(target_dir, "SELECT count(), max(id) FROM t2") == "1000\t1000"


def test_ratio_budget(pair: tuple[Path, Path], target_dir: str) -> None:
    _, bad = pair
    schema = ["--schema", "id UInt64, miles UInt32, duration UInt32"]
    code, report = _json("load", str(bad), "--table", "r1", "--target", target_dir, *schema,
                         "--max-error-ratio", "0.01", "--json")
    assert code == 0 and isinstance(report, dict) and report["rows_rejected"] == 7
    code, report = _json("load", str(bad), "--table", "r2", "--target", target_dir, *schema,
                         "--max-error-ratio", "0.005", "--json")
    assert code == 1 and isinstance(report, dict) and report["files_failed"] == 1


def test_without_budget_the_error_names_file_line_and_column(pair: tuple[Path, Path],
                                                             target_dir: str) -> None:
    _, bad = pair
    out = run_chload("load", str(bad), "--table", "t", "--target", target_dir, "--schema",
                     "id UInt64, miles UInt32, duration UInt32")
    assert out.returncode == 1
    assert f"{bad}: line 6, column miles:" in out.stderr  # data row 5 is line 6


def test_validate_writes_nothing(pair: tuple[Path, Path], target_dir: str) -> None:
    good, bad = pair
    run_chload("load", str(good), "--table", "v", "--target", target_dir, "--schema",
               "id UInt64, miles UInt32, duration UInt32")
    before = (_scalar(target_dir, "SELECT count() FROM v"),
              run_chload("files", "--table", "v", "--target", target_dir, "--json").stdout)
    code, checks = _json("validate", str(good), str(bad), "--table", "v", "--target",
                         target_dir, "--json")
    assert code == 1 and isinstance(checks, list)
    assert [(c["rows"], c["errors"]) for c in checks] == [(1000, 0), (993, 7)]
    assert checks[1]["first_errors"][0]["line"] == 6
    after = (_scalar(target_dir, "SELECT count() FROM v"),
             run_chload("files", "--table", "v", "--target", target_dir, "--json").stdout)
    assert before == after


def test_json_lines_rejects(tmp_path: Path, target_dir: str) -> None:
    data = tmp_path / "e.jsonl"
    data.write_text('{"id":1,"n":2}\n{"id":2,"n":"x"}\nnot json\n{"id":4,"n":5}\n')
    code, report = _json("load", str(data), "--table", "j", "--target", target_dir, "--schema",
                         "id UInt64, n Int64", "--max-errors", "5", "--json")
    assert code == 0 and isinstance(report, dict)
    assert (report["rows_loaded"], report["rows_rejected"]) == (2, 2)
    _, rejected = _json("errors", "--table", "j", "--target", target_dir, "--json")
    assert isinstance(rejected, list)
    assert [(r["line"], r["raw"]) for r in rejected] == [(2, '{"id":2,"n":"x"}'),
                                                         (3, "not json")]
    assert all(r["error"] for r in rejected)


def test_a_budget_infers_json_lines_past_a_broken_line(tmp_path: Path, target_dir: str) -> None:
    """With an error budget and no --schema, a line that is not JSON does not stop the
    inference (the engine's schema reader would): the types come from the lines before
    it, and the load rejects it."""
    data = tmp_path / "e.jsonl"
    data.write_text('{"id":1,"n":2}\n{"id":2,"n":3}\nnot json\n{"id":4,"n":5}\n')
    code, report = _json("load", str(data), "--table", "j", "--target", target_dir,
                         "--max-errors", "5", "--json")
    assert code == 0 and isinstance(report, dict), report
    assert (report["rows_loaded"], report["rows_rejected"]) == (3, 1)
    assert _scalar(target_dir, "SELECT sum(n), toTypeName(n) FROM j GROUP BY 2") == "10\tInt64"
    code, report = _json("load", str(data), "--table", "j2", "--target", target_dir, "--json")
    assert code == 2 and "cannot infer its columns" in str(report)  # no budget: as before


def test_a_broken_json_line_that_takes_the_next_fails_the_file(tmp_path: Path,
                                                               target_dir: str) -> None:
    """A line cut off inside a string makes the engine read the next line into the bad
    row and skip both, keeping only the first as rejected: the file fails whole instead
    of losing the second line unreported."""
    data = tmp_path / "cut.jsonl"
    data.write_text('{"id":1,"n":2}\n{"id":3,"n\n{"id":4,"n":5}\n{"id":6,"n":7}\n')
    code, report = _json("load", str(data), "--table", "c", "--target", target_dir, "--schema",
                         "id UInt64, n Int64", "--max-errors", "5", "--json")
    assert code == 1 and isinstance(report, dict), report
    assert (report["files_failed"], report["rows_loaded"]) == (1, 0), report
    assert "1 line(s) after line 2 neither loaded nor rejected" in str(report)
    assert _scalar(target_dir, "SELECT count() FROM c") == "0"
    pretty = tmp_path / "pretty.json"  # objects over several lines: lines do not count rows
    pretty.write_text('{\n "id": 1,\n "n": 2\n}\n{\n "id": 2,\n "n": "x"\n}\n'
                      '{\n "id": 3,\n "n": 4\n}\n')
    code, report = _json("load", str(pretty), "--table", "p", "--target", target_dir,
                         "--schema", "id UInt64, n Int64", "--max-errors", "5", "--json")
    assert code == 0 and isinstance(report, dict), report
    assert _scalar(target_dir, "SELECT groupArray(id) FROM (SELECT id FROM p ORDER BY id)"
                   ) == "[1,3]"


def test_on_error_abort_stops_after_the_first_failure(pair: tuple[Path, Path],
                                                      tmp_path: Path, target_dir: str) -> None:
    good, bad = pair
    later = tmp_path / "later.csv"
    later.write_text("id,miles,duration\n5000,1,1\n")
    code, report = _json("load", str(good), str(bad), str(later), "--table", "a", "--target",
                         target_dir, "--schema", "id UInt64, miles UInt32, duration UInt32",
                         "--workers", "1", "--on-error", "abort", "--json")
    assert code == 1 and isinstance(report, dict)
    statuses = {Path(f["uri"]).name: f["status"] for f in report["files"]}
    assert statuses == {"good.csv.gz": "loaded", "bad.csv.gz": "failed",
                        "later.csv": "not-started"}
    assert _scalar(target_dir, "SELECT count() FROM a") == "1000"
    code, files = _json("files", "--table", "a", "--target", target_dir, "--json")
    assert isinstance(files, list)
    assert {Path(f["uri"]).name: f["state"] for f in files} == {"good.csv.gz": "loaded",
                                                                "bad.csv.gz": "failed"}


def test_history_per_run_and_per_file(pair: tuple[Path, Path], target_dir: str) -> None:
    good, bad = pair
    schema = ["--schema", "id UInt64, miles UInt32, duration UInt32"]
    run_chload("load", str(good), "--table", "h", "--target", target_dir, *schema)
    run_chload("load", str(good), str(bad), "--table", "h", "--target", target_dir, *schema,
               "--max-errors", "10")
    _, runs = _json("history", "--table", "h", "--target", target_dir, "--json")
    assert isinstance(runs, list)
    assert [(r["files_loaded"], r["files_skipped"], r["rows_loaded"]) for r in runs] == [
        (1, 1, 993), (1, 0, 1000)]
    assert all(float(r["seconds"]) > 0 for r in runs)
    _, detail = _json("history", "--run", runs[0]["run_id"], "--target", target_dir, "--json")
    assert isinstance(detail, list)
    assert [(Path(d["uri"]).name, d["state"], d["rows"]) for d in detail] == [
        ("bad.csv.gz", "loaded", 993)]


# -- a corpus of broken inputs ------------------------------------------------------------

HEADER = b"id,miles,name\n"
ROWS = b"".join(b"%d,%d,n%d\n" % (i, i * 2, i) for i in range(1, 11))  # 10 good rows


def corpus(directory: Path) -> dict[str, int]:
    """Broken files and how many data rows each really holds."""
    files = {
        "truncated.csv.gz": (gzip.compress(HEADER + ROWS * 50)[:-40], 500),
        "not_gzip.csv.gz": (HEADER + ROWS, 10),
        "semicolons.csv": (HEADER.replace(b",", b";") + ROWS.replace(b",", b";"), 10),
        "column_count.csv": (HEADER + b"1,2\n2,4,n2,extra\n" + ROWS, 12),
        "invalid_utf8.csv": (HEADER + b"1,2,\xff\xfe\xfa\n" + ROWS, 11),
        "overflow.csv": (HEADER + b"99999999999999999999999,1,x\n" + ROWS, 11),
        "empty.csv": (b"", 0),
        "header_only.csv": (HEADER, 0),
        "huge_line.csv": (HEADER + b"1,2," + b"x" * (10 << 20) + b"\n" + ROWS, 11),
        "binary.csv": (bytes(range(256)) * 40, 0),
    }
    for name, (data, _) in files.items():
        (directory / name).write_bytes(data)
    return {name: rows for name, (_, rows) in files.items()}


@pytest.mark.parametrize("budget", [[], ["--max-errors", "5"]])
def test_broken_inputs_never_lose_or_crash(tmp_path: Path, target_dir: str,
                                           budget: list[str]) -> None:
    expected = corpus(tmp_path)
    for i, (name, rows_in_file) in enumerate(sorted(expected.items())):
        table = f"f{i}"
        out = run_chload("load", str(tmp_path / name), "--table", table, "--target", target_dir,
                         "--schema", "id Int64, miles Int64, name String", *budget, "--json")
        assert "Traceback" not in out.stderr, (name, out.stderr)
        if out.returncode == 2:  # refused before loading: one line, naming the file
            assert name in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
            continue
        report = json.loads(out.stdout)
        result = report["files"][0]
        stored = int(_scalar(target_dir, f"SELECT count() FROM {table}") or 0)
        if result["status"] == "failed":
            assert result["error"] and name in result["error"] and "\n" not in result["error"]
            assert stored == 0, name
        else:
            assert result["rows"] + result["rejected"] == rows_in_file, (name, result)
            assert stored == result["rows"], name
