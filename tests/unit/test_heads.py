"""A run's files checked together (heads.read, fit.check_many) answer as each alone does
(sniff.header_names, sniff.unreadable, fit.check): no misfit missed among many clean
files, at a batch's edge, or where one file's end and the next one's start meet."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from chload.core.reading import fit, heads, sniff
from chload.formats import FileFormat
from chload.schema import Column
from chload.sources.base import SourceFile

CSV = FileFormat("CSVWithNames", "none")
COLUMNS = [Column("id", "Int64"), Column("v", "UInt8"), Column("d", "Date"),
           Column("m", "Decimal(10, 2)"), Column("f", "Float32"), Column("s", "String")]
READ = [c.name for c in COLUMNS]
CLEAN = "id,v,d,m,f,s\n1,5,2024-01-31,1.25,2.5,a\n2,255,1970-01-01,3,1e3,b\n"


def _files(tmp_path: Path, texts: list[bytes | str], fmt: FileFormat = CSV,
           suffix: str = ".csv") -> list[SourceFile]:
    made = []
    for n, text in enumerate(texts):
        path = tmp_path / f"f{n:05d}{suffix}"
        path.parent.mkdir(exist_ok=True)
        raw = text.encode() if isinstance(text, str) else text
        path.write_bytes(gzip.compress(raw) if fmt.compression == "gzip" else raw)
        made.append(SourceFile(str(path), path.stat().st_size, 0, fmt, local_path=str(path)))
    return made


def _each_alone(files: list[SourceFile], settings: dict[str, str] | None = None,
                columns: list[Column] = COLUMNS) -> list[str]:
    return [m.message() if (m := fit.check(f, columns, [c.name for c in columns],
                                           settings or {}, "db.t")) else "" for f in files]


def _together(files: list[SourceFile], settings: dict[str, str] | None = None,
              columns: list[Column] = COLUMNS) -> list[str]:
    with sniff.kept_starts():
        heads.read(files)  # (as check_headers: the starts kept by the header pass)
        found = fit.check_many(files, columns, [c.name for c in columns], settings or {},
                               "db.t")
    return [m.message() if m else "" for m in found]


# Each case with columns that no other pattern hits (a UInt8 column looks for 3 digits,
# found in any date): the misfit is found by the search meant for it.
CASES = [
    ("id Int64, v UInt8", "1,5\n2,255\n", "1,5\n2,300\n", "line 3, column v: '300' is outside"),
    ("id Int64, d Date", "1,2024-01-31\n2,1970-01-01\n", "1,2024-01-31\n2,1960-01-01\n",
     "line 3, column d: '1960-01-01' is outside the dates"),
    ("id Int64, m Decimal(10, 2)", "1,1.25\n", "1,1.25\n2,1.239\n", "column m: '1.239' has"),
    ("id Int64, f Float32", "1,2.5\n2,1e3\n", "1,2.5\n2,1e39\n", "column f: '1e39' is beyond"),
    ("id Int64, s String", "1,a\n", "1,a\n2,\\N\n", "line 3, column s: NULL in a column"),
    ("id Int64, d Date, t String", "1,2024-01-31,b\n", "1,2024-01-31,b\n2,\"\",b\n",
     "line 3, column d: an empty value"),
    ("id Int64, v Int64", "1,2\n", "1,2\n2,\n", "line 3, column v: an empty value"),
]


def _columns(types: str) -> list[Column]:
    return [Column(*c.split(" ", 1)) for c in re.split(r",\s*(?=\w+ )", types)]


@pytest.mark.parametrize("types, clean, bad, says", CASES)
@pytest.mark.parametrize("at", [0, 511, 512, 999])
def test_one_misfit_among_a_thousand_clean_files_is_found(
        tmp_path: Path, types: str, clean: str, bad: str, says: str, at: int) -> None:
    columns = _columns(types)
    header = ",".join(c.name for c in columns) + "\n"
    texts = [header + clean] * 1000
    texts[at] = header + bad
    found = _together(_files(tmp_path, texts), columns=columns)
    assert [i for i, m in enumerate(found) if m] == [at]
    assert says in found[at], found[at]


@pytest.mark.parametrize("types, clean, bad, says", CASES)
def test_a_file_whose_first_line_misfits_right_after_a_clean_one(
        tmp_path: Path, types: str, clean: str, bad: str, says: str) -> None:
    """Without a header, the misfit is the file's first bytes, right after the clean
    file's last line end: where a hint may begin in the file before (`\\n,`)."""
    columns = _columns(types)
    first = bad.split("\n")[1] + "\n"
    files = _files(tmp_path, [clean, first, clean], FileFormat("CSV", "none"))
    assert [bool(m) for m in _together(files, columns=columns)] == [False, True, False]
    assert _together(files, columns=columns) == _each_alone(files, columns=columns)


def test_a_file_beginning_with_an_empty_field_after_a_clean_one(tmp_path: Path) -> None:
    """The one byte test a concatenated search cannot make: the second file's first
    field is empty (no header: its first line is data), right after the first's line
    end, where `\\n,` begins in the first file."""
    columns = _columns("v Int64, s String")
    files = _files(tmp_path, ["1,a\n", ",a\n", "2,a\n"], FileFormat("CSV", "none"))
    assert [bool(m) for m in _together(files, columns=columns)] == [False, True, False]
    assert _together(files, columns=columns) == _each_alone(files, columns=columns)


def test_patterns_cut_by_a_files_end_are_not_joined_into_a_misfit(tmp_path: Path) -> None:
    # each file ends in digits that, with the next file's first digits, would make a
    # number too long for UInt8 or a decimal too precise, were line ends not kept
    texts = ["id,v,d,m,f,s\n1,25,2024-01-31,1,1,a\n" + "2,5,2024-01-31,1.2",
             "5,2,2024-01-31,1,1,a\n", CLEAN]
    files = _files(tmp_path, texts)
    assert _together(files) == _each_alone(files) == ["", "", ""]


def test_together_is_each_alone_over_formats_settings_and_values(tmp_path: Path) -> None:
    rows = ["1,5,2024-01-31,1.25,2.5,a", "2,300,2024-01-31,1,1,a", "3,5,1899-01-01,1,1,a",
            "4,5,2024-01-31,1.999,1,a", "5,5,2024-01-31,1,3e39,a", "6,\\N,2024-01-31,1,1,a",
            "7,5,,1,1,a", '8,5,2024-01-31,1,1,""', "9,5,0000-00-00,1,1,a",
            "10,5,2024-01-31 10:00:00,1,1,a", "11,5,2024-01-31,1,1e5,a"]
    texts = []
    for i in range(len(rows) ** 2):
        pair = [rows[i % len(rows)], rows[i // len(rows)]]
        texts.append("id,v,d,m,f,s\n" + "\n".join(pair) + ("\n" if i % 5 else ""))
    texts += ["", "id,v,d,m,f,s\n", "\n", ",\n,\n"]
    for settings in ({}, {"input_format_null_as_default": "1"},
                     {"input_format_csv_empty_as_default": "1"}):
        files = _files(tmp_path, texts)
        assert _together(files, settings) == _each_alone(files, settings)
    tsv = [t.replace(",", "\t") for t in texts]
    files = _files(tmp_path / "b", tsv, FileFormat("TSVWithNames", "gzip"), ".tsv.gz")
    assert _together(files) == _each_alone(files)
    semicolon = _files(tmp_path, [t.replace(",", ";") for t in texts],
                       FileFormat("CSVWithNames", "none", ";"))
    assert _together(semicolon) == _each_alone(semicolon)
    assert any(_together(semicolon)) and not all(_together(semicolon))


def test_json_lines_together_as_each_alone(tmp_path: Path) -> None:
    columns = [Column("id", "Int64"), Column("v", "UInt8"), Column("d", "DateTime('UTC')")]
    objects = [{"id": 1, "v": 5}, {"id": 2, "v": None}, {"id": 3, "v": 256},
               {"id": 4, "d": "2200-01-01 00:00:00"}, {"id": 5, "d": "2001-01-01 00:00:00"}]
    texts = [json.dumps(a) + "\n" + json.dumps(b) + "\n" for a in objects for b in objects]
    files = _files(tmp_path, texts * 40, FileFormat("JSONEachRow", "none"), ".jsonl")
    assert _together(files, columns=columns) == _each_alone(files, columns=columns)
    assert sum(bool(m) for m in _together(files, columns=columns)) == 21 * 40


@pytest.mark.parametrize("text", [
    "id,name\n1,a\n", "\ufeffid,name\r\n1,a\n", '"a b",c\n', "", "\n", "id,name",
    "sep=;\nid;name\n", "1,2\n", ",,\n", "a,a\n"])
def test_a_first_line_judged_once_as_each_file_alone(tmp_path: Path, text: str) -> None:
    files = _files(tmp_path, [text, "x,y\n", text])
    files += _files(tmp_path / "b", [text.encode("utf-16"), b"\xff\xfe\x00a", b"\xe9t\xe9\n"])
    files += _files(tmp_path, [text], FileFormat("TSVWithNames", "gzip"), ".tsv.gz")
    files += _files(tmp_path, [text], FileFormat("CSV", "none"))
    files += _files(tmp_path, [text], FileFormat("JSONEachRow", "none"), ".jsonl")
    with sniff.kept_starts():
        found = heads.read(files)
        for f, head in zip(files, found, strict=True):
            named = f.format.has_header and sniff.delimiter(f.format) is not None
            assert (head.named, head.fields, head.unreadable) == (
                named, sniff.header_names(f) if named else None, sniff.unreadable(f))
        assert sniff.starts(files) == [sniff.start(f) for f in files]
    assert found[0] is found[2]  # (one line, judged once)


def test_a_format_not_read_as_text_is_not_judged_as_text(tmp_path: Path) -> None:
    files = _files(tmp_path, ["v\n300\n"], FileFormat("Parquet", "none"), ".parquet")
    with sniff.kept_starts():
        found = heads.read(files)
    assert found[0].fields is None and not found[0].named and not found[0].unreadable
    assert _together(files, columns=[Column("v", "UInt8")]) == [""]


def test_the_files_of_several_formats_each_judged_by_their_own(tmp_path: Path) -> None:
    columns = [Column("id", "Int64"), Column("v", "UInt8")]
    csv = _files(tmp_path / "csv", [f"id,v\n{n},{300 if n == 550 else 5}\n" for n in range(600)])
    tsv = _files(tmp_path / "tsv", [f"id\tv\n{n}\t{256 if n == 7 else 5}\n" for n in range(600)],
                 FileFormat("TSVWithNames", "none"), ".tsv")
    files = [f for pair in zip(csv, tsv, strict=True) for f in pair]  # (interleaved)
    found = _together(files, columns=columns)
    assert found == _each_alone(files, columns=columns)
    assert [i for i, m in enumerate(found) if m] == [2 * 7 + 1, 2 * 550]
