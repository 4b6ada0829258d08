"""Header sniffing without the engine: a first line of known column names, or no answer."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

from chload.core.reading.sniff import header_names, starts_with_names
from chload.formats import detect
from chload.sources.base import SourceFile

NAMES = ["id", "miles", "duration", "vehicle_id"]


def source(path: Path) -> SourceFile:
    return SourceFile(str(path), path.stat().st_size, 0, detect(path.name), local_path=str(path))


def test_gzip_csv_header_of_table_names(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b"miles,id\n5,1\n"))
    assert header_names(source(path)) == ["miles", "id"]
    assert starts_with_names(source(path), NAMES) is True


def test_quoted_csv_and_bz2_tsv(tmp_path: Path) -> None:
    csv_path = tmp_path / "q.csv"
    csv_path.write_text('"id","miles"\r\n1,2\n')
    assert header_names(source(csv_path)) == ["id", "miles"]
    tsv_path = tmp_path / "t.tsv.bz2"
    tsv_path.write_bytes(bz2.compress(b"id\tduration\n1\t2\n"))
    assert starts_with_names(source(tsv_path), NAMES) is True


def test_no_answer_when_in_doubt(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_text("1,5,30,2\n2,10,60,3\n")  # a data row: the engine decides
    assert starts_with_names(source(data), NAMES) is None
    unknown = tmp_path / "other.csv"
    unknown.write_text("id,colour\n1,red\n")  # a name the table lacks: the engine decides
    assert starts_with_names(source(unknown), NAMES) is None
    twice = tmp_path / "twice.csv"
    twice.write_text("id,id\n1,2\n")
    assert starts_with_names(source(twice), NAMES) is None
    one_line = tmp_path / "one.csv"
    one_line.write_text("id,miles")  # the whole file, without a line end: still its line
    assert header_names(source(one_line)) == ["id", "miles"]
    long_line = tmp_path / "long.csv"
    long_line.write_text("x" * (1 << 17) + "\n")
    assert header_names(source(long_line)) is None
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(b"not gzip at all\n")
    assert header_names(source(broken)) is None
    zstd = tmp_path / "z.csv.zst"
    zstd.write_bytes(b"\x28\xb5\x2f\xfd")
    assert header_names(source(zstd)) is None  # not in the standard library: the engine reads it


def test_a_files_start_is_read_once_within_kept_starts_and_anew_after(tmp_path: Path) -> None:
    from chload.core.reading import fit, sniff
    from chload.schema import Column

    path = tmp_path / "a.csv"
    path.write_text("id,v\n1,2\n")
    f = source(path)
    with sniff.kept_starts():
        assert header_names(f) == ["id", "v"]
        path.unlink()  # gone: its start, kept, still answers
        assert sniff.unreadable(f) is None and header_names(f) == ["id", "v"]
        assert fit.check(f, [Column("id", "UInt8"), Column("v", "UInt8")], ["id", "v"], {},
                         "t") is None
    assert header_names(f) is None  # outside: read again, and it is gone
    path.write_text("id,w\n1,2\n")  # same size, maybe the same mtime: read anew
    assert header_names(source(path)) == ["id", "w"]


def test_the_compression_sniff_keeps_a_plain_start_for_the_header_check(tmp_path: Path,
                                                                         ) -> None:
    from chload.core.reading import sniff
    from chload.sources.files.local import described

    plain, packed = tmp_path / "a.csv", tmp_path / "b.csv"
    plain.write_text("id,v\n1,2\n")
    packed.write_bytes(gzip.compress(b"id,w\n1,2\n"))  # a gzip export named .csv
    with sniff.kept_starts():
        a, b = described([source(plain), source(packed)], None)
        assert (a.format.compression, b.format.compression) == ("none", "gzip")
        plain.unlink()  # its start, read by the compression sniff, still answers
        assert header_names(a) == ["id", "v"] and sniff.unreadable(a) is None
        assert header_names(b) == ["id", "w"]  # not kept as stored: read and inflated
    assert header_names(a) is None  # outside: read again, and it is gone


def test_a_header_split_once_is_a_fresh_list_each_time() -> None:
    from chload.core.reading.sniff import split_line

    first = split_line("id,v\n", detect("a.csv"))
    assert first == ["id", "v"]
    first.append("x")  # a caller's change stays its own
    assert split_line("id,v\n", detect("a.csv")) == ["id", "v"]
    assert split_line("sep=;\n", detect("a.csv")) == ["sep=;"]


def test_a_delimiter_hint_and_utf16_are_told_apart_per_first_line(tmp_path: Path) -> None:
    from chload.core.reading.sniff import unreadable

    hint, wide, long = tmp_path / "h.csv", tmp_path / "w.csv", tmp_path / "l.csv"
    hint.write_text("sep=;\na;b\n")
    wide.write_bytes("id,v\n".encode("utf-16"))
    long.write_text("sep=;" + "x" * 40 + "\n1\n")
    assert "delimiter hint" in (unreadable(source(hint)) or "")
    assert "UTF-16" in (unreadable(source(wide)) or "")
    assert unreadable(source(long)) is None


def test_a_truncated_gzip_still_gives_the_lines_before_its_cut(tmp_path: Path) -> None:
    from chload.core.reading.sniff import first_text, start

    path = tmp_path / "cut.csv.gz"
    path.write_bytes(gzip.compress(b"id,miles\n1,2\n")[:-12])  # no end-of-stream marker
    f = SourceFile(str(path), path.stat().st_size, 0, detect(str(path)), local_path=str(path))
    assert first_text(f) == "id,miles\n"
    assert (start(f) or b"").startswith(b"id,miles\n")  # what came before the cut
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    e = SourceFile(str(empty), 0, 0, detect(str(empty)), local_path=str(empty))
    assert start(e) == b""


def remote(name: str, size: int = 1) -> SourceFile:
    return SourceFile(f"s3://b/{name}", size, 0, detect(name), kind="s3")


def test_a_remote_first_line_from_its_first_bytes_cut_anywhere() -> None:
    """A ranged read cuts a compressed stream anywhere: the line still comes whole."""
    import lzma

    from chload.core.reading.sniff import LIMIT, remote_first_text

    body = b"id,miles\n" + b"".join(b"%d,%d\n" % (i, i * 7) for i in range(100_000))
    for name, packed in (("t.csv.gz", gzip.compress(body)), ("t.csv.xz", lzma.compress(body)),
                         ("t.csv", body)):
        asked: list[int] = []

        def start(f: SourceFile, limit: int, packed: bytes = packed,
                  asked: list[int] = asked) -> bytes:
            asked.append(limit)
            return packed[:limit]
        assert remote_first_text(remote(name), start) == "id,miles\n", name
        assert asked == [LIMIT]


def test_a_remote_first_line_the_read_cannot_tell_is_the_engines() -> None:
    from chload.core.reading.sniff import LIMIT, remote_first_text

    long_line = b"x" * (LIMIT + 10) + b"\n1\n"
    assert remote_first_text(remote("t.csv"), lambda f, n: long_line[:n]) is None
    assert remote_first_text(remote("t.csv"), lambda f, n: b"id,v") == "id,v"  # (all of it)
    assert remote_first_text(remote("t.csv.gz"), lambda f, n: b"not gzip") is None
    assert remote_first_text(remote("t.csv.zst"), lambda f, n: b"id\n") is None  # (no codec)
    packed = bz2.compress(b"id\n" + b"1\n" * 300_000)  # (a block gives nothing until whole)
    assert remote_first_text(remote("t.csv.bz2"), lambda f, n: packed[:n]) is None
    assert remote_first_text(remote("t.csv.gz"), lambda f, n: None) is None  # (not read)
    assert remote_first_text(remote("t.parquet"), lambda f, n: b"PAR1") is None
    assert remote_first_text(remote("t.csv"), lambda f, n: b"\xff\xfe,x\n") is None
