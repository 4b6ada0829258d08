"""Header lines, column names and table names, end to end on both targets: the real
`chload` command into embedded chDB and into a ClickHouse 18.16 server, results
checked through `chload sql`."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import services
from conftest import run_chload

pytestmark = pytest.mark.integration


class Where:
    """A target: --target value and the environment the command needs."""

    def __init__(self, target: str, env: dict[str, str]) -> None:
        self.target, self.env = target, env

    def load(self, *args: str) -> tuple[int, dict]:
        out = run_chload("load", *args, "--target", self.target, "--json", env=self.env,
                         timeout=180)
        assert "Traceback" not in out.stderr, out.stderr
        return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}

    def sql(self, query: str) -> list[list[str]]:
        out = run_chload("sql", query, "--target", self.target, "--format", "TSV",
                         env=self.env)
        assert out.returncode == 0, out.stderr
        return [line.split("\t") for line in out.stdout.splitlines()]

    def columns(self, table: str) -> list[list[str]]:
        return [row[:2] for row in self.sql(f"DESCRIBE TABLE {table}")]


@pytest.fixture(params=["embedded", "server"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    if request.param == "embedded":
        return Where(str(tmp_path / "target"), {})
    server: services.Service = request.getfixturevalue("clickhouse")
    return Where(f"http://loader@127.0.0.1:{server.ports['http']}/default",
                 {"CLICKHOUSE_PASSWORD": server.credentials["password"]})


def statuses(report: dict) -> dict[str, str]:
    return {Path(f["uri"]).name: f["status"] for f in report["files"]}


TEXT_HEADERS = {
    "plain.csv": b"city,country\nParis,France\nBerlin,Germany\n",
    "bom_crlf.csv": b"\xef\xbb\xbfcity,country\r\nParis,France\r\nBerlin,Germany\r\n",
    "quoted.csv": b'"city","country"\n"Paris","France"\n"Berlin","Germany"\n',
    "tabs.tsv": b"city\tcountry\nParis\tFrance\nBerlin\tGermany\n",
    "zipped.csv.gz": gzip.compress(b"city,country\nParis,France\nBerlin,Germany\n"),
}


@pytest.mark.parametrize("name", sorted(TEXT_HEADERS))
def test_a_header_of_text_columns_names_them(where: Where, tmp_path: Path, table_name: str,
                                             name: str) -> None:
    (tmp_path / name).write_bytes(TEXT_HEADERS[name])
    code, report = where.load(str(tmp_path / name), "--table", table_name)
    assert (code, report["rows_loaded"]) == (0, 2), report
    assert [c[0] for c in where.columns(table_name)] == ["city", "country"]
    assert where.sql(f"SELECT * FROM {table_name} ORDER BY city") == [
        ["Berlin", "Germany"], ["Paris", "France"]]


def test_a_header_with_an_empty_or_repeated_name(where: Where, tmp_path: Path,
                                                 table_name: str) -> None:
    (tmp_path / "empty.csv").write_text("a,b,\n1,2,3\n4,5,6\n")
    code, report = where.load(str(tmp_path / "empty.csv"), "--table", table_name)
    assert (code, report["rows_loaded"]) == (0, 2), report
    assert [c[0] for c in where.columns(table_name)] == ["a", "b", "c3"]
    assert where.sql(f"SELECT * FROM {table_name} ORDER BY a") == [["1", "2", "3"],
                                                                   ["4", "5", "6"]]
    (tmp_path / "again.csv").write_text("a,b,\n7,8,9\n")  # into the table it made
    assert where.load(str(tmp_path / "again.csv"), "--table", table_name)[0] == 0
    assert where.sql(f"SELECT c3 FROM {table_name} WHERE a = 7") == [["9"]]

    (tmp_path / "twice.csv").write_text("a,a,b\n1,2,3\n")
    code, report = where.load(str(tmp_path / "twice.csv"), "--table", f"{table_name}_2")
    assert code == 0, report
    assert where.sql(f"SELECT * FROM {table_name}_2") == [["1", "2", "3"]]
    assert [c[0] for c in where.columns(f"{table_name}_2")] == ["a", "a_2", "b"]


def test_a_file_of_just_a_header_makes_the_table(where: Where, tmp_path: Path,
                                                 table_name: str) -> None:
    (tmp_path / "only.csv").write_text("x,y\n")
    code, report = where.load(str(tmp_path / "only.csv"), "--table", table_name)
    assert (code, report["files_loaded"], report["rows_loaded"]) == (0, 1, 0), report
    assert where.columns(table_name) == [["x", "String"], ["y", "String"]]
    assert where.sql(f"SELECT count() FROM {table_name}") == [["0"]]


def test_a_first_line_of_words_is_a_header_unless_format_csv(where: Where, tmp_path: Path,
                                                             table_name: str) -> None:
    (tmp_path / "rows.csv").write_text("Paris,France\nRome,Italy\n")
    code, report = where.load(str(tmp_path / "rows.csv"), "--table", table_name)
    assert (code, report["rows_loaded"]) == (0, 1), report  # the documented guess
    assert [c[0] for c in where.columns(table_name)] == ["Paris", "France"]
    code, report = where.load(str(tmp_path / "rows.csv"), "--table", f"{table_name}_2",
                              "--format", "CSV")
    assert (code, report["rows_loaded"]) == (0, 2), report
    assert where.sql(f"SELECT * FROM {table_name}_2 ORDER BY 1") == [["Paris", "France"],
                                                                     ["Rome", "Italy"]]


def test_each_file_is_matched_by_its_own_header(where: Where, tmp_path: Path,
                                                table_name: str) -> None:
    data = tmp_path / "people"
    data.mkdir()
    (data / "a.csv").write_text("id,name\n1,alice\n2,bob\n")
    (data / "b.csv").write_text("id,nmae\n3,carol\n")
    (data / "c.csv").write_text("customer_id,full_name\n4,dave\n")
    (data / "d.csv").write_text("name,id\neve,5\n")  # the same names, another order
    (data / "e.tsv").write_text("id\tfull name\n6\tfrank\n")
    code, report = where.load(str(data), "--table", table_name)
    assert code == 1, report
    assert statuses(report) == {"a.csv": "loaded", "b.csv": "failed", "c.csv": "failed",
                                "d.csv": "loaded", "e.tsv": "failed"}
    errors = {Path(f["uri"]).name: f["error"] for f in report["files"]}
    assert "not in the table: nmae" in errors["b.csv"]
    assert "not in the data: name" in errors["b.csv"]
    assert "not in the table: customer_id, full_name" in errors["c.csv"]
    assert "not in the table: full name" in errors["e.tsv"]
    assert where.sql(f"SELECT id, name FROM {table_name} ORDER BY id") == [
        ["1", "alice"], ["2", "bob"], ["5", "eve"]]
    ledger = run_chload("files", "--table", table_name, "--target", where.target, "--json",
                        env=where.env)
    states = {Path(r["uri"]).name: r["state"] for r in json.loads(ledger.stdout)}
    assert states == {"a.csv": "loaded", "b.csv": "failed", "c.csv": "failed",
                      "d.csv": "loaded", "e.tsv": "failed"}


def test_text_files_with_other_header_names(where: Where, tmp_path: Path,
                                            table_name: str) -> None:
    data = tmp_path / "places"
    data.mkdir()
    (data / "1.csv").write_text("city,country\nParis,France\n")
    (data / "2.csv").write_text("town,country\nLyon,France\n")
    code, report = where.load(str(data), "--table", table_name)
    assert code == 1 and statuses(report) == {"1.csv": "loaded", "2.csv": "failed"}, report
    assert where.sql(f"SELECT * FROM {table_name}") == [["Paris", "France"]]


def test_names_with_spaces_and_punctuation(where: Where, tmp_path: Path,
                                           table_name: str) -> None:
    import chdb

    names = ["Order ID", "a,b", "x(y)", "q`t", "b\\s"]
    (tmp_path / "odd.csv").write_text(",".join(f'"{n}"' for n in names) + "\n1,2,3,4,5\n")
    code, report = where.load(str(tmp_path / "odd.csv"), "--table", table_name)
    assert code == 0, report
    assert [c[0] for c in where.columns(table_name)] == ["Order ID", "a,b", "x(y)", "q`t",
                                                         "b\\\\s"]  # TSV escapes \
    assert where.sql(f"SELECT `Order ID`, `x(y)` FROM {table_name}") == [["1", "3"]]

    (tmp_path / "odd.json").write_text('{"Order ID": 7, "the (name)": "x"}\n')
    code, report = where.load(str(tmp_path / "odd.json"), "--table", f"{table_name}_j")
    assert code == 0, report
    assert where.sql(f"SELECT `Order ID`, `the (name)` FROM {table_name}_j") == [["7", "x"]]

    (tmp_path / "rows.csv").write_text("8,y\n")
    code, report = where.load(str(tmp_path / "rows.csv"), "--table", f"{table_name}_s",
                              "--schema", "`Order ID` UInt32, `the, name` String")
    assert code == 0, report
    assert where.columns(f"{table_name}_s") == [["Order ID", "UInt32"],
                                                ["the, name", "String"]]

    parquet = tmp_path / "odd.parquet"
    chdb.query(f"INSERT INTO FUNCTION file('{parquet}', 'Parquet') SELECT number AS "
               "`Order ID`, toString(number) AS `the name` FROM numbers(3)")
    code, report = where.load(str(parquet), "--table", f"{table_name}_p")
    assert (code, report["rows_loaded"]) == (0, 3), report
    assert where.sql(f"SELECT sum(`Order ID`) FROM {table_name}_p") == [["3"]]


@pytest.mark.parametrize("table", ["system.t", "INFORMATION_SCHEMA.t", "information_schema.t",
                                   "chload.stage_abc", "chload.t"])
def test_reserved_databases_are_refused(where: Where, tmp_path: Path, table: str) -> None:
    (tmp_path / "a.csv").write_text("id\n1\n")
    out = run_chload("load", str(tmp_path / "a.csv"), "--table", table, "--target",
                     where.target, env=where.env)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"--table {table}: database" in out.stderr


@pytest.mark.parametrize("database", ["system", "chload"])
def test_a_server_url_naming_a_reserved_database(clickhouse: services.Service,
                                                 tmp_path: Path, database: str) -> None:
    (tmp_path / "a.csv").write_text("id\n1\n")
    out = run_chload("load", str(tmp_path / "a.csv"), "--table", "t", "--target",
                     f"http://loader@127.0.0.1:{clickhouse.ports['http']}/{database}",
                     env={"CLICKHOUSE_PASSWORD": clickhouse.credentials["password"]})
    assert out.returncode == 2 and f"database {database} is" in out.stderr, out.stderr


OTHER_DELIMITERS = {
    "semicolons.csv": b"city;country;price\nParis;France;1,5\n\"Ber;lin\";Germany;2\n",
    "pipes.csv.gz": gzip.compress(b"city|country|price\nParis|France|1.5\nBerlin|Germany|2\n"),
    "tabs.csv": b"city\tcountry\tprice\nParis\tFrance\t1.5\nBerlin\tGermany\t2\n",
}


@pytest.mark.parametrize("name", sorted(OTHER_DELIMITERS))
def test_a_csv_separated_by_another_delimiter(where: Where, tmp_path: Path, table_name: str,
                                              name: str) -> None:
    """A CSV saved with `;` (a European locale), `|` or tabs loads as its columns, not as
    one column named `city;country;price`."""
    (tmp_path / name).write_bytes(OTHER_DELIMITERS[name])
    code, report = where.load(str(tmp_path / name), "--table", table_name)
    assert (code, report["rows_loaded"]) == (0, 2), report
    assert [c[0] for c in where.columns(table_name)] == ["city", "country", "price"]
    rows = where.sql(f"SELECT city, country FROM {table_name} ORDER BY country")
    assert rows[0][1] == "France" and rows[1][1] == "Germany", rows
    assert rows[1][0] == ("Ber;lin" if name == "semicolons.csv" else "Berlin")


def test_the_delimiter_setting_is_the_users_word(where: Where, tmp_path: Path,
                                                 table_name: str) -> None:
    """--setting format_csv_delimiter is used to read headers and infer types too; `,`
    keeps a one-column file whose lines hold a `;` as one column."""
    (tmp_path / "a.csv").write_text("id;name\n1;alice\n2;bob\n")
    code, report = where.load(str(tmp_path / "a.csv"), "--table", table_name,
                              "--setting", "format_csv_delimiter=;")
    assert (code, report["rows_loaded"]) == (0, 2), report
    assert where.sql(f"SELECT id, name FROM {table_name} ORDER BY id") == [["1", "alice"],
                                                                          ["2", "bob"]]
    (tmp_path / "b.csv").write_text("id;name\n3;carol\nfour;dave\n")  # validate reads alike
    out = run_chload("validate", str(tmp_path / "b.csv"), "--table", table_name, "--target",
                     where.target, "--json", env=where.env)
    checks = json.loads(out.stdout)
    assert [(c["rows"], c["errors"]) for c in checks] == [(1, 1)], out.stdout + out.stderr
    (tmp_path / "notes.csv").write_text("note\nbuy milk; eggs\ncall bob; later\n")
    code, report = where.load(str(tmp_path / "notes.csv"), "--table", f"{table_name}_2",
                              "--setting", "format_csv_delimiter=,")
    assert (code, report["rows_loaded"]) == (0, 2), report
    assert where.columns(f"{table_name}_2") == [["note", "String"]]


def test_files_written_with_another_delimiter_fail_alone(where: Where, tmp_path: Path,
                                                         table_name: str) -> None:
    """One delimiter per run (the engine takes one setting): the first file decides and a
    file written with another fails at the header check, naming its header."""
    data = tmp_path / "mixed"
    data.mkdir()
    (data / "1.csv").write_text("id;name\n1;alice\n")
    (data / "2.csv").write_text("id,name\n2,bob\n")
    code, report = where.load(str(data), "--table", table_name)
    assert code == 1 and statuses(report) == {"1.csv": "loaded", "2.csv": "failed"}, report
    assert "header does not fit" in report["files"][1]["error"]
    assert where.sql(f"SELECT id, name FROM {table_name}") == [["1", "alice"]]


def test_rejected_rows_of_a_semicolon_csv(where: Where, tmp_path: Path, table_name: str) -> None:
    """The engine writes its errors file with the load's delimiter; it is read back alike."""
    (tmp_path / "good.csv").write_text("id;name\n1;alice\n")
    assert where.load(str(tmp_path / "good.csv"), "--table", table_name)[0] == 0
    (tmp_path / "bad.csv").write_text("id;name\n2;bob\nthree;carol\n4;dave\n")
    code, report = where.load(str(tmp_path / "bad.csv"), "--table", table_name,
                              "--max-errors", "5")
    assert (code, report["rows_loaded"], report["rows_rejected"]) == (0, 2, 1), report
    out = run_chload("errors", "--table", table_name, "--target", where.target, "--json",
                     env=where.env)
    rejected = [(r["line"], r["raw"].strip()) for r in json.loads(out.stdout)]
    assert rejected == [(3, "three;carol")], out.stdout + out.stderr


def test_values_that_are_not_utf8_come_back_as_they_are(where: Where, tmp_path: Path,
                                                        table_name: str) -> None:
    """A Latin-1 file loads byte for byte (a String holds bytes); `chload sql` and
    `chload errors` write those bytes back out instead of failing to decode them."""
    import os
    import subprocess
    import sys

    (tmp_path / "latin1.csv").write_bytes(b"id,city\n1,S\xe3o Paulo\nx,Bogot\xe1\n")
    code, report = where.load(str(tmp_path / "latin1.csv"), "--table", table_name,
                              "--schema", "id Int32, city String", "--max-errors", "5")
    assert (code, report["rows_loaded"], report["rows_rejected"]) == (0, 1, 1), report

    def raw(*args: str) -> bytes:
        done = subprocess.run([sys.executable, "-m", "chload", *args, "--target", where.target],
                              capture_output=True, timeout=120,
                              env={**os.environ, **where.env})
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
        return done.stdout

    assert raw("sql", f"SELECT city FROM {table_name}", "--format", "TSV") == b"S\xe3o Paulo\n"
    assert b"x,Bogot\xe1" in raw("errors", "--table", table_name)


@pytest.mark.parametrize("name,data", [
    ("lf.csv", b"id,name\n1,alice\n2,bob\n\n\n"),
    ("crlf.csv", b"id,name\r\n1,alice\r\n2,bob\r\n\r\n"),
    ("tabs.tsv", b"id\tname\n1\talice\n2\tbob\n\n"),
])
def test_trailing_blank_lines_are_not_rows(where: Where, tmp_path: Path, table_name: str,
                                           name: str, data: bytes) -> None:
    """A file ending in blank lines (an editor's, an export's) loads its rows, into a new
    table (the types inferred) and into one that exists (18.16 cannot read it: the
    loader's engine does)."""
    (tmp_path / name).write_bytes(data)
    code, report = where.load(str(tmp_path / name), "--table", table_name)
    assert (code, report["rows_loaded"]) == (0, 2), report
    assert where.columns(table_name)[0][1] in ("Int64", "Nullable(Int64)")
    again = tmp_path / f"again_{name}"
    again.write_bytes(data.replace(b"1", b"3").replace(b"2", b"4"))
    code, report = where.load(str(again), "--table", table_name)
    assert (code, report["rows_loaded"]) == (0, 2), report
    assert where.sql(f"SELECT id, name FROM {table_name} ORDER BY id") == [
        ["1", "alice"], ["2", "bob"], ["3", "alice"], ["4", "bob"]]


def test_a_directory_as_exported_loads_its_data(where: Where, tmp_path: Path,
                                                table_name: str) -> None:
    """A directory as tools leave it: Spark's empty _SUCCESS marker is no source, a
    README fails alone (named in the report and the ledger), and a gzip file saved
    without .gz is read as gzip (its first bytes say so)."""
    data = tmp_path / "export"
    data.mkdir()
    (data / "part-0.csv").write_text("id,name\n1,alice\n")
    (data / "part-1.csv").write_bytes(gzip.compress(b"id,name\n2,bob\n"))
    (data / "_SUCCESS").write_bytes(b"")
    (data / "README.txt").write_text("exported nightly\n")
    code, report = where.load(str(data), "--table", table_name)
    assert code == 1 and statuses(report) == {"part-0.csv": "loaded", "part-1.csv": "loaded",
                                              "README.txt": "failed"}, report
    assert "leave it out of the sources" in report["files"][0]["error"] + str(report)
    assert where.sql(f"SELECT id, name FROM {table_name} ORDER BY id") == [
        ["1", "alice"], ["2", "bob"]]
    for alone in ("README.txt", "_SUCCESS"):  # named alone, even empty: one line, exit 2
        code, report = where.load(str(data / alone), "--table", table_name)
        assert code == 2 and "cannot tell the format" in str(report), report


def test_a_header_that_is_not_utf8_is_one_line(where: Where, tmp_path: Path,
                                               table_name: str) -> None:
    (tmp_path / "latin1.csv").write_bytes(b"gr\xf6\xdfe,b\n1,2\n")
    out = run_chload("load", str(tmp_path / "latin1.csv"), "--table", table_name,
                     "--target", where.target, env=where.env)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "not UTF-8 text; convert the file to UTF-8" in out.stderr, out.stderr
