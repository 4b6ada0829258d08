"""Small contracts of the real `chload` command: validate before any load, --debug's
exit code, --setting checked before anything is created, a flag no source reads refused,
inference errors that keep their cause, a garbage or empty file, and two server loads
of the same files at once. Results checked through SQL."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import services
from common import make_trips
from conftest import run_chload

pytestmark = pytest.mark.integration


def server_url(server: services.Service) -> str:
    return f"http://loader@127.0.0.1:{server.ports['http']}/default"


def server_env(server: services.Service) -> dict[str, str]:
    return {"CLICKHOUSE_PASSWORD": server.credentials["password"]}


@pytest.fixture(params=["embedded", "server"])
def target(request: pytest.FixtureRequest, target_dir: str) -> Iterator[tuple[str, dict]]:
    """(--target value, environment) of each kind of target."""
    if request.param == "embedded":
        yield target_dir, {}
    else:
        server = request.getfixturevalue("clickhouse")
        yield server_url(server), server_env(server)


def sql(target: tuple[str, dict], query: str) -> str:
    out = run_chload("sql", query, "--target", target[0], "--format", "TSV", env=target[1])
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def no_table(target: tuple[str, dict], table: str) -> bool:
    """`table` was not made: into an embedded target, a run that fails before loading
    leaves no directory either (it removes the one it made)."""
    if "://" not in target[0] and not os.path.exists(target[0]):
        return True
    return sql(target, f"EXISTS TABLE {table}") == "0"


def load(target: tuple[str, dict], *args: str) -> tuple[int, dict, str]:
    out = run_chload("load", *args, "--target", target[0], "--json", env=target[1])
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.csv"
    path.write_text("id,name\n1,a\n2,b\n")
    return path


# -- validate, --debug ------------------------------------------------------------------

def test_validate_before_the_first_load_leaves_nothing(tmp_path: Path, good: Path) -> None:
    fresh = tmp_path / "fresh"
    out = run_chload("validate", str(good), "-t", "t", "--target", str(fresh), "--json")
    assert out.returncode == 0, out.stderr
    [check] = json.loads(out.stdout)
    assert (check["rows"], check["errors"], check["failure"]) == (2, 0, "")
    assert not fresh.exists()


def test_validate_takes_the_loadspec_a_load_takes(tmp_path: Path, good: Path) -> None:
    """validate(LoadSpec) answers as validate(sources, table, ...) with the same options."""
    fresh = tmp_path / "fresh"
    script = (
        "import chload\nfrom chload.api import LoadSpec\n"
        f"spec = LoadSpec(sources=[{str(good)!r}], table='t', target={str(fresh)!r}, "
        "max_errors=1, order_by='id')\n"
        "by_spec = chload.validate(spec)\n"
        f"by_words = chload.validate({str(good)!r}, table='t', target={str(fresh)!r}, "
        "max_errors=1)\n"
        "assert by_spec == by_words, (by_spec, by_words)\n"
        "print(by_spec[0].rows, by_spec[0].within_budget)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=os.environ, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "True"]
    assert not fresh.exists()


def test_debug_shows_the_traceback_and_keeps_exit_2(tmp_path: Path, target_dir: str) -> None:
    args = ["load", str(tmp_path / "missing.csv"), "-t", "t", "--target", target_dir]
    plain, debug = run_chload(*args), run_chload(*args, "--debug")
    assert plain.returncode == debug.returncode == 2
    assert "Traceback" in debug.stderr and "missing.csv: no such file" in debug.stderr


# -- --setting -------------------------------------------------------------------------

@pytest.mark.parametrize("setting, said", [
    ("no_such_setting_x=1", "--setting no_such_setting_x: "),
    ("input_format_allow_errors_num=lots", "--setting input_format_allow_errors_num=lots: "),
])
def test_a_bad_setting_stops_before_a_table_is_made(target: tuple[str, dict], good: Path,
                                                   table_name: str, setting: str,
                                                   said: str) -> None:
    code, report, err = load(target, str(good), "-t", table_name, "--setting", setting)
    assert code == 2 and report["kind"] == "UsageError"
    assert said in err and len(err.strip().splitlines()) == 1
    assert no_table(target, table_name)
    code, report, _ = load(target, str(good), "-t", table_name, "--setting", "max_threads=2",
                           "--setting", "input_format_allow_errors_num=0")  # good ones pass
    assert (code, report["files_loaded"], report["rows_loaded"]) == (0, 1, 2)


# -- inference, garbage, empty files ---------------------------------------------------

def test_inference_error_keeps_the_engines_cause(tmp_path: Path, target_dir: str) -> None:
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(os.urandom(3000))
    out = run_chload("load", str(bad), "-t", "t", "--target", target_dir)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "bad.csv.gz: cannot infer its columns" in out.stderr
    assert "inflate failed" in out.stderr and "ZLIB_INFLATE_FAILED" in out.stderr


@pytest.mark.parametrize("junk", [b"this is not a csv file\n", b"oops\nnot,data,at,all\n"])
def test_a_garbage_first_file_fails_alone(target: tuple[str, dict], tmp_path: Path,
                                          good: Path, table_name: str, junk: bytes) -> None:
    assert load(target, str(good), "-t", table_name)[0] == 0  # the table exists
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "000_garbage.csv.gz").write_bytes(gzip.compress(junk))
    (tmp_path / "in" / "001_more.csv.gz").write_bytes(gzip.compress(b"id,name\n3,c\n4,d\n"))
    code, report, err = load(target, str(tmp_path / "in"), "-t", table_name)
    assert code == 1, report
    # with --json too, the failed file is named on stderr (stdout is the report)
    assert "failed: " in err and "000_garbage.csv.gz" in err, err
    status = {Path(f["uri"]).name: (f["status"], f["error"]) for f in report["files"]}
    assert status["001_more.csv.gz"][0] == "loaded"
    assert status["000_garbage.csv.gz"][0] == "failed"
    assert "000_garbage.csv.gz" in status["000_garbage.csv.gz"][1]
    assert sql(target, f"SELECT count(), sum(id) FROM {table_name}") == "4\t10"


def test_an_empty_file_loads_no_rows_into_an_existing_table(
        target: tuple[str, dict], tmp_path: Path, good: Path, table_name: str) -> None:
    assert load(target, str(good), "-t", table_name)[0] == 0
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    code, report, _ = load(target, str(empty), "-t", table_name)
    assert (code, report["files_loaded"], report["rows_loaded"]) == (0, 1, 0), report
    ledger = run_chload("files", "-t", table_name, "--target", target[0], "--json",
                        env=target[1])
    states = {Path(r["uri"]).name: (r["state"], r["rows"]) for r in json.loads(ledger.stdout)}
    assert states["empty.csv"] == ("loaded", 0)
    assert sql(target, f"SELECT count() FROM {table_name}") == "2"


def test_an_empty_file_into_a_new_table_says_schema(tmp_path: Path, target_dir: str) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    out = run_chload("load", str(empty), "-t", "t", "--target", target_dir)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "empty.csv: the file is empty" in out.stderr and "--schema" in out.stderr


# -- two server loads of the same files at once ----------------------------------------

def test_the_losing_concurrent_load_reports_skipped(
        clickhouse: services.Service, tmp_path: Path, table_name: str) -> None:
    files = make_trips(str(tmp_path / "trips"), 8, 200_000)
    target = (server_url(clickhouse), server_env(clickhouse))
    assert load(target, files[0], "-t", table_name)[0] == 0  # the table exists
    argv = [sys.executable, "-m", "chload", "load", str(tmp_path / "trips"), "-t",
            table_name, "--target", target[0], "--json"]
    # Each run waits 3 s before taking the commit lock: both plan every file before
    # either has logged a commit, so the race is certain, not a matter of timing. (A
    # pause inside the lock was not: a run that starts while the other's `committing`
    # entries are logged settles them under the lock first, then finds every file
    # loaded and plans none: all skipped, none raced.)
    pause = {"CHLOAD_PAUSE_AT": "before-lock:3"}
    procs = [subprocess.Popen(argv, env={**os.environ, **target[1], **pause},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    reports = [json.loads(out) for out, _ in outs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    loaded = [f for r in reports for f in r["files"] if f["status"] == "loaded"]
    assert all(f["rows"] == 200_000 for f in loaded), loaded  # never "loaded, 0 rows"
    assert sorted(f["uri"] for f in loaded) == sorted(files[1:])  # each file once
    raced = [f for r in reports for f in r["files"] if f.get("note")]
    assert raced and {f["status"] for f in raced} == {"skipped"}
    assert {f["note"] for f in raced} == {"loaded by another run meanwhile"}
    assert sum(r["rows_loaded"] for r in reports) == 7 * 200_000
    assert sql(target, f"SELECT count(), uniqExact(id) FROM {table_name}") == \
        f"{8 * 200_000}\t{8 * 200_000}"


# -- the ledger's own tables --------------------------------------------------------------

def test_a_ledger_table_dropped_between_runs_is_made_again(
        target: tuple[str, dict], good: Path, tmp_path: Path) -> None:
    """A run asks once which ledger tables exist (Ledger.complete) and makes the missing
    ones: a ledger that lost its rejects table gets it back, and loads go on."""
    table = "lg_" + os.urandom(4).hex()
    assert load(target, str(good), "--table", table)[0] == 0
    sql(target, "DROP TABLE chload.rejects")
    other = tmp_path / "other.csv"
    other.write_text("id,name\n3,c\n")
    code, report, err = load(target, str(other), str(good), "--table", table)
    assert code == 0, err
    assert (report["files_loaded"], report["files_skipped"]) == (1, 1)
    assert sql(target, "SELECT count() FROM system.tables WHERE database = 'chload' "
                       "AND name = 'rejects'") == "1"
    assert sql(target, f"SELECT count() FROM {table}") == "3"


# -- a value its column's type cannot read ------------------------------------------------

def test_a_late_value_the_inferred_type_cannot_read_is_named_before_any_table(
        tmp_path: Path, target: tuple[str, dict]) -> None:
    """The engine types columns from a file's first 25,000 rows; an `N/A` in a number
    column after them made the run fail with "cannot infer its columns (Expected end of
    line (at row 30002))" and no way out, even with --max-errors."""
    late = tmp_path / "late.csv"
    late.write_text("id,v\n" + "".join(f"{i},{i}\n" for i in range(30_000)) + "30000,N/A\n")
    code, _, err = load(target, str(late), "--table", "late")
    assert code == 2, err
    assert f"{late}: column v: 'N/A' is not Int64, the type the file's first rows gave it; " \
           "pass --schema 'id Int64, v String'" in err and "--max-errors N" in err
    assert no_table(target, "late")  # nothing was created
    code, report, err = load(target, str(late), "--table", "late", "--schema",
                             "id Int64, v String")  # the schema it suggested
    assert code == 0 and report["rows_loaded"] == 30_001, err
    code, report, err = load(target, str(late), "--table", "budget", "--max-errors", "1")
    assert code == 0 and (report["rows_loaded"], report["rows_rejected"]) == (30_000, 1), err
    assert sql(target, "SELECT toTypeName(v) FROM budget LIMIT 1") == "Int64"


@pytest.mark.parametrize("line, says", [
    ("2,N/A,2020-01-02", "column v: 'N/A' is not Int64"),
    ("2,12abc,2020-01-02", "column v: '12abc' is not Int64"),
    ("2,3,soon", "column d: 'soon' is not Date"),
    ("2,3,2020-01-02,9", "the row has more fields than there are columns"),
    ("2,3", "the row has fewer fields than there are columns"),
])
def test_a_row_the_table_cannot_read_is_named_with_what_to_do(
        tmp_path: Path, target: tuple[str, dict], line: str, says: str) -> None:
    data = tmp_path / "data.csv"
    data.write_text(f"id,v,d\n1,2,2020-01-01\n{line}\n")
    code, report, err = load(target, str(data), "--table", "t", "--schema",
                             "id Int64, v Int64, d Date")
    assert code == 1, err
    [failed] = report["files"]
    assert says in failed["error"], failed["error"]
    assert failed["error"].endswith("; pass --max-errors N to load the other rows and keep "
                                    "such rows in chload.rejects")


def test_files_joined_with_cat_are_named_not_loaded_as_text(
        tmp_path: Path, target: tuple[str, dict]) -> None:
    """`cat part-*.csv > all.csv` repeats the header line as a row: the engine inferred
    every column as text and the header lines loaded as data, without a word."""
    joined = tmp_path / "all.csv"
    joined.write_text("".join("id,name,amount\n" + "".join(
        f"{part * 1000 + i},n{i},{i * 1.5}\n" for i in range(1000)) for part in range(3)))
    code, _, err = load(target, str(joined), "--table", "joined")
    assert code == 2, err
    assert f"{joined}: the header line comes again as a row (2 times in the first " \
           "200,000 rows, as when files are joined with cat), which would make id, amount " \
           "text; pass --max-errors N" in err
    assert no_table(target, "joined")
    code, report, err = load(target, str(joined), "--table", "joined", "--max-errors", "5")
    assert code == 0 and (report["rows_loaded"], report["rows_rejected"]) == (3000, 2), err
    assert sql(target, "SELECT toTypeName(id), toTypeName(amount) FROM joined LIMIT 1") == \
        "Int64\tFloat64"
    code, report, err = load(target, str(joined), "--table", "typed", "--schema",
                             "id Int64, name String, amount Float64")
    assert code == 1, err  # past the sample, or into a table: the load names the line
    assert "column id: 'id' is not Int64: the header line again" in report["files"][0]["error"]


def test_a_utf16_file_is_named_with_the_conversion_and_fails_alone(
        tmp_path: Path, target: tuple[str, dict]) -> None:
    """Windows tools write 'Unicode' text as UTF-16 with a byte order mark; the engine
    reads UTF-8 and said "Rows have different amount of values"."""
    (tmp_path / "in").mkdir()
    windows = tmp_path / "in" / "a.tsv"
    windows.write_bytes("id\tname\n1\tJosé\n2\tZoë\n".encode("utf-16"))
    (tmp_path / "in" / "b.tsv").write_text("id\tname\n3\tx\n")
    code, _, err = load(target, str(windows), "--table", "alone")
    assert code == 2 and f"{windows}: the file is UTF-16 text" in err and "iconv" in err, err
    code, report, err = load(target, str(tmp_path / "in"), "--table", "both")
    assert code == 1 and report["rows_loaded"] == 1, err
    [failed] = [f for f in report["files"] if f["status"] == "failed"]
    assert failed["uri"] == str(windows) and "UTF-16" in failed["error"]


def test_integers_written_with_a_leading_zero_keep_it(
        tmp_path: Path, target: tuple[str, dict]) -> None:
    """Zip codes and phone numbers were inferred Int64 and lost their leading zero
    (`02134` -> 2134) without a word; no table type brings it back."""
    data = tmp_path / "people.csv"
    data.write_text("zip,phone,age\n02134,0612345678,41\n10001,0698765432,\n")
    code, _, err = load(target, str(data), "--table", "people")
    assert code == 0, err
    assert sql(target, "SELECT zip, phone, toTypeName(age) FROM people ORDER BY zip") == \
        "02134\t0612345678\tNullable(Int64)\n10001\t0698765432\tNullable(Int64)"


@pytest.mark.parametrize("table, rows, says", [
    ("dates_either", ["01/02/2024", "03/04/2024"],
     "column d holds dates written like '01/02/2024', which could be day/month or month/day"),
    ("dates_us", ["01/13/2024", "03/04/2024"],
     "column d holds dates written like '01/13/2024', month first"),
    ("dates_both", ["13/02/2024", "01/13/2024"],
     "some with a first and some with a second number above 12"),
])
def test_dates_whose_order_the_sample_does_not_prove_are_not_guessed(
        tmp_path: Path, target: tuple[str, dict], table: str, rows: list[str],
        says: str) -> None:
    """The engine reads `NN/NN/YYYY` day first wherever it can, value by value: US dates
    01/13/2024 and 03/04/2024 became January 13 and April 3 in one column."""
    data = tmp_path / "dates.csv"
    data.write_text("d,n\n" + "".join(f"{d},{i}\n" for i, d in enumerate(rows)))
    code, _, err = load(target, str(data), "--table", table)
    assert code == 2 and says in err and "--schema 'd String, n Int64'" in err, err
    assert no_table(target, table)
    code, _, err = load(target, str(data), "--table", table, "--schema", "d String, n Int64")
    assert code == 0 and sql(target, f"SELECT d FROM {table} ORDER BY n") == "\n".join(rows), err


def test_dates_the_sample_proves_day_first_load_as_the_engine_reads_them(
        tmp_path: Path, target: tuple[str, dict]) -> None:
    data = tmp_path / "dates.csv"
    data.write_text("d,n\n13/02/2024,1\n01/02/2024,2\n")
    code, _, err = load(target, str(data), "--table", "day_first")
    assert code == 0, err
    assert sql(target, "SELECT toDate(d) FROM day_first ORDER BY n") == "2024-02-13\n2024-02-01"


def test_us_dates_load_month_first_when_told(tmp_path: Path, target_dir: str) -> None:
    data = tmp_path / "dates.csv"
    data.write_text("d,n\n01/13/2024,1\n03/04/2024,2\n")
    code, _, err = load((target_dir, {}), str(data), "--table", "month_first", "--setting",
                        "date_time_input_format=best_effort_us")
    assert code == 0, err
    assert sql((target_dir, {}), "SELECT toDate(d) FROM month_first ORDER BY n") == \
        "2024-01-13\n2024-03-04"


def test_a_row_with_fewer_fields_than_the_header_is_said_so(
        tmp_path: Path, target: tuple[str, dict]) -> None:
    """Exports that drop trailing empty fields: inference said "The number of column names
    3 differs with the number of types 2" inside "cannot infer its columns"."""
    data = tmp_path / "ragged.csv"
    data.write_text("id,a,b\n1,2\n3,4,5\n")
    code, _, err = load(target, str(data), "--table", "ragged")
    assert code == 2 and f"{data}: a row has 2 fields where the header names 3 columns" in err
    code, report, err = load(target, str(data), "--table", "ragged", "--schema",
                             "id Int64, a Int64, b Nullable(Int64)", "--max-errors", "1")
    assert code == 0 and (report["rows_loaded"], report["rows_rejected"]) == (1, 1), err


def test_excels_delimiter_hint_line_is_named_not_loaded(
        tmp_path: Path, target: tuple[str, dict]) -> None:
    """Excel writes `sep=;` as a CSV's first line: it became the header (a column
    `sep=`) or a row, and the real header loaded as data."""
    (tmp_path / "in").mkdir()
    excel = tmp_path / "in" / "a.csv"
    excel.write_text("sep=;\nid;v\n1;2\n")
    (tmp_path / "in" / "b.csv").write_text("id;v\n5;6\n")
    code, _, err = load(target, str(excel), "--table", "excel_alone")
    assert code == 2 and f"{excel}: its first line 'sep=;' is Excel's delimiter hint" in err
    code, report, err = load(target, str(tmp_path / "in"), "--table", "excel_dir")
    assert code == 1 and report["rows_loaded"] == 1, err
    assert sql(target, "SELECT id, v FROM excel_dir") == "5\t6"


def test_a_parquet_column_the_table_lacks_fails_its_file_not_dropped(
        tmp_path: Path, target: tuple[str, dict]) -> None:
    """The engine reads Parquet by column name and left out, without a word, a column a
    newer file of a data lake had and the table did not (CSV and JSON refuse it)."""
    import chdb

    lake = tmp_path / "lake"
    lake.mkdir()
    for name, select in (("a", "number AS id, toInt32(number) AS v"),
                         ("b", "number + 5 AS id, toInt32(number) AS v, 'x' AS added")):
        chdb.query(f"SELECT {select} FROM numbers(5) INTO OUTFILE '{lake / name}.parquet' "
                   "TRUNCATE FORMAT Parquet")
    code, report, err = load(target, str(lake / "a.parquet"), str(lake / "b.parquet"),
                             "--table", "lake")
    assert code == 1 and report["rows_loaded"] == 5, err
    [failed] = [f for f in report["files"] if f["status"] == "failed"]
    assert failed["uri"] == str(lake / "b.parquet")
    assert "columns in the data but not in the table: added" in failed["error"]
    assert "or pass --schema naming the columns to read" in failed["error"]
    code, report, err = load(target, str(lake / "b.parquet"), "--table", "lake", "--schema",
                             "id UInt64, v Int32")  # as the message says
    assert code == 0 and report["rows_loaded"] == 5, err


def test_a_suggested_schema_keeps_the_leading_zeros_the_sample_saw(
        tmp_path: Path, target: tuple[str, dict]) -> None:
    """The --schema a refusal suggests came from the engine's first types: following it
    typed a zip code column Int64 again, and lost its zeros."""
    data = tmp_path / "people.csv"
    data.write_text("zip,d\n02134,01/13/2024\n10001,03/04/2024\n")
    code, _, err = load(target, str(data), "--table", "zips_dates")
    assert code == 2 and "--schema 'zip String, d String'" in err, err


@pytest.mark.parametrize("source, flags, said", [
    # port 9 (discard) answers nothing: the flag is refused before any connection
    ("http://127.0.0.1:9/orders.csv", ["--follow"], "--follow: only for a kafka://, "
     "postgresql://, mysql://, local, s3://, az://, gs:// or hdfs:// source; no source of "
     "this load reads it"),
    ("good.csv", ["--batch-rows", "10"], "--batch-rows: only for a kafka:// or followed "
     "mysql:// source; no source of this load reads it"),
])
def test_a_flag_no_source_reads_is_refused_in_one_line(
        source: str, flags: list[str], said: str, good: Path, target_dir: str) -> None:
    source = str(good) if source == "good.csv" else source
    out = run_chload("load", source, "--table", "t", *flags, "--target", target_dir,
                     timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr == f"chload: {said}\n"
    assert out.stdout == ""
    assert not Path(target_dir).exists()  # nothing opened, nothing created
