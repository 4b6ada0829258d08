"""Capability probing, type mapping for old servers, the raw/push choice, and the push
SQL (no server: scripted answers)."""

from __future__ import annotations

import gzip

import pytest

from chload.errors import AuthError, DataError, SchemaError, SourceError, TransientError
from chload.formats import FileFormat
from chload.schema import Column
from chload.sources.base import SourceFile
from chload.targets.base import LoadJob
from chload.targets.server.capabilities import (
    Capabilities,
    probe,
    probe_gzipped,
    server_columns,
    server_type,
    storable,
)
from chload.targets.server.http import TargetURL, parse_target_url
from chload.targets.server.push import push_error, push_sql, select_sql

OLD_TYPES = frozenset({"UInt8", "UInt64", "Int64", "Float64", "String", "Date", "DateTime",
                       "Nullable", "Array", "Tuple", "LowCardinality", "Decimal", "UUID"})
OLD = Capabilities("18.16.1", types=OLD_TYPES, encodings=frozenset({"gzip", "deflate"}),
                   input_formats=frozenset({"CSV", "CSVWithNames", "JSONEachRow", "Native"}),
                   settings=frozenset({"allow_experimental_low_cardinality_type",
                                       "max_threads"}))


def test_probe_reads_one_query_and_asks_about_an_encoding_when_needed() -> None:
    answer = ("version\t18.16.1\ntimezone\tEtc/UTC\nmax_threads\tauto(4)\nformat\tCSV\n"
              "format\tNative\nfunction\turl\nsetting\tmax_threads\ntype\tUInt8\n"
              "ledger\tfiles\n")
    tried: list[str] = []
    down = True

    def post(method: str, body: bytes) -> bool:
        tried.append(method)
        if down:
            raise TransientError("server 127.0.0.1:8123 unreachable: connection refused")
        if method not in ("gzip", "deflate"):
            raise DataError("Code: 89. Unknown Content-Encoding of HTTP request: " + method)
        return True

    caps = probe(lambda sql: answer, post)
    assert (caps.version, caps.version_tuple, caps.timezone, caps.max_threads) == (
        "18.16.1", (18, 16, 1), "Etc/UTC", 4)
    assert caps.input_formats == {"CSV", "Native"}
    assert caps.ledger_tables == {"files"} and not caps.dedup_tokens
    assert tried == [] and caps.accepts("none")
    with pytest.raises(TransientError):  # no answer is not "no": nothing is remembered
        caps.accepts("gzip")
    down = False
    assert caps.accepts("gzip") and not caps.accepts("zstd") and caps.accepts("gzip")
    assert not caps.accepts("snappy")  # no probe for it: never posted as is
    assert tried == ["gzip", "gzip", "zstd"]


def test_probe_is_sent_gzipped_and_a_refusal_asks_plainly() -> None:
    answer = "version\t18.16.1\nformat\tCSV\n"
    asked: list[bytes | None] = []

    def ask(sql: str, body: bytes | None) -> str:
        asked.append(body)
        if body is not None and refuse:
            raise DataError("Code: 89. Unknown Content-Encoding of HTTP request: gzip")
        assert body is None or gzip.decompress(body).decode() == sql
        return answer

    refuse = False
    caps = probe_gzipped(ask)
    assert caps.version == "18.16.1" and "gzip" in caps.encodings and len(asked) == 1
    assert caps.accepts("gzip")  # known from the probe: no second request
    asked.clear()
    refuse = True
    caps = probe_gzipped(ask)
    assert caps.input_formats == {"CSV"} and "gzip" not in caps.encodings
    assert [b is None for b in asked] == [False, True]


def test_probe_bodies_are_select_1_compressed() -> None:
    import bz2
    import gzip
    import lzma
    import zlib

    from chload.targets.server.capabilities import _PROBES

    for method, decompress in (("gzip", gzip.decompress), ("deflate", zlib.decompress),
                               ("xz", lzma.decompress), ("bz2", bz2.decompress)):
        assert decompress(_PROBES[method]) == b"SELECT 1", method


@pytest.mark.parametrize("inferred, stored", [
    ("UInt64", "UInt64"), ("Nullable(String)", "Nullable(String)"), ("Bool", "UInt8"),
    ("Nullable(Bool)", "Nullable(UInt8)"), ("LowCardinality(String)", "String"),
    ("Array(LowCardinality(Nullable(String)))", "Array(Nullable(String))"),
    ("DateTime64(0)", "DateTime"), ("DateTime64(0, 'UTC')", "DateTime('UTC')"),
    ("Tuple(Bool, String)", "Tuple(UInt8, String)"), ("Decimal(10, 2)", "Decimal(10, 2)"),
])
def test_types_map_down_where_no_value_changes(inferred: str, stored: str) -> None:
    assert server_type(inferred, OLD, "c", "f.parquet") == stored


@pytest.mark.parametrize("inferred, hint", [
    ("DateTime64(3, 'UTC')", "DateTime (drops fractions of a second) or String"),
    ("Date32", "Date (1970 to 2105 only on 18.16) or String"),
    ("Map(String, UInt64)", "String"), ("Int128", "String"),
])
def test_types_the_server_lacks_are_refused_in_one_line(inferred: str, hint: str) -> None:
    with pytest.raises(SchemaError) as info:
        server_type(inferred, OLD, "at", "f.parquet")
    assert str(info.value) == (f"f.parquet: column at has type {inferred}, which ClickHouse "
                               f"18.16.1 cannot store; pass --schema with a type it has for "
                               f"at, e.g. {hint}")


def test_create_table_is_checked_and_inference_maps_only_what_is_safe() -> None:
    ok = [Column("id", "UInt64"), Column("s", "Nullable(String)"),
          Column("n", "UInt8 DEFAULT 1", "DEFAULT")]
    assert server_columns(ok, OLD, "table db.t") == ok
    with pytest.raises(SchemaError, match="^table db.t: column at has type DateTime64"):
        server_columns([Column("id", "UInt64"), Column("at", "DateTime64(3)")], OLD,
                       "table db.t")
    assert storable("DateTime64(3)", OLD) == "DateTime64(3)"  # an existing table decides
    assert storable("Bool", OLD) == "UInt8"


def test_low_cardinality_kept_where_it_is_stable() -> None:
    new = Capabilities("24.3", types=OLD_TYPES | {"Bool"})
    assert server_type("LowCardinality(String)", new, "c", "f") == "LowCardinality(String)"
    columns = [Column("a", "LowCardinality(String)"),
               Column("b", "LowCardinality(Nullable(String))")]
    assert [c.type for c in server_columns(columns, OLD, "t")] == ["String", "Nullable(String)"]
    assert server_columns(columns, new, "t") == columns


def test_the_server_target_creates_tables_with_types_it_stores() -> None:
    """create_table maps the columns (not the DDL text); the key is the one the given
    columns make, and chload's own statements go to the server as written."""
    from chload.targets.server.target import ServerTarget

    target = ServerTarget.__new__(ServerTarget)
    target.caps = OLD
    sent: list[str] = []
    target.command = sent.append  # type: ignore[method-assign]
    target.create_table("`db`.`t`", [Column("flag", "Bool"), Column("id", "UInt64"),
                                     Column("_source_file", "LowCardinality(String)")],
                        None, "id")
    assert sent == ["CREATE TABLE IF NOT EXISTS `db`.`t` (\n    `flag` UInt8,\n    `id` UInt64,"
                    "\n    `_source_file` String\n) ENGINE = MergeTree\nPARTITION BY id\n"
                    "ORDER BY `id`"]
    with pytest.raises(SchemaError, match="^table db.t: column at has type DateTime64"):
        target.create_table("`db`.`t`", [Column("at", "DateTime64(3)")], None, None)


# -- the push path ---------------------------------------------------------------------

URL = TargetURL("http", "10.0.0.5", 8123, "loader", "db", password="s3cr3t")
PARQUET = SourceFile("/d/e.parquet", 10, 1, FileFormat("Parquet", "none"),
                     local_path="/d/e.parquet")


def test_push_reads_as_read_and_casts_to_the_tables_types() -> None:
    table = [Column("id", "UInt64"), Column("at", "DateTime")]
    read = [Column("id", "UInt64"), Column("at", "DateTime64(3)")]
    select = select_sql(PARQUET, table, read, None)
    assert select == ("SELECT `id`, CAST(`at`, 'DateTime') AS `at` FROM file('/d/e.parquet', "
                      "'Parquet', '`id` UInt64, `at` DateTime64(3)', 'none')")
    audit = select_sql(PARQUET, table, table, {"_source_file": "String",
                                               "_loaded_at": "DateTime"})
    assert "CAST(_path, 'String') AS `_source_file`, CAST(now(), 'DateTime')" in audit


def test_push_sql_targets_the_stage_with_auth_headers_and_quoting() -> None:
    sql = push_sql(URL, "INSERT INTO chload.s (`id`) FORMAT Native",
                   [Column("e", "Enum8('a' = 1)")], "SELECT 1", "gzip", [("max_threads", "2")])
    assert sql.startswith("INSERT INTO FUNCTION url('http://10.0.0.5:8123/?query=INSERT+INTO+"
                          "chload.s+%28%60id%60%29+FORMAT+Native', 'Native', '`e` Enum8(\\'a\\' "
                          "= 1)', 'gzip', headers('X-ClickHouse-User'='loader', "
                          "'X-ClickHouse-Key'='s3cr3t')) SELECT 1 SETTINGS max_threads = 2")


@pytest.mark.parametrize("message, kind, text", [
    ("Code: 86. DB::HTTPException: Received error from remote server /?query=INSERT. HTTP "
     "status code: 500 'Internal Server Error', body length: 9 bytes, body: 'Code: 252, "
     "e.displayText() = DB::Exception: Too many parts (300), e.what() = DB::Exception\n'. "
     "(RECEIVED_ERROR_FROM_REMOTE_IO_SERVER)", TransientError, "f: Too many parts (300)"),
    ("Code: 86. DB::HTTPException: Received error from remote server /. HTTP status code: "
     "401 'Unauthorized', body length: 9 bytes, body: 'Code: 193, e.displayText() = "
     "DB::Exception: Wrong password for user loader, e.what() = DB::Exception\n'.",
     AuthError, "f: authentication failed (Wrong password for user loader)"),
    ("Code: 1000. DB::Exception: Connection refused. (POCO_EXCEPTION)", TransientError,
     "f: server 10.0.0.5:8123 unreachable: connection refused"),
    ("Code: 27. DB::Exception: Cannot parse input: expected ',' s3cr3t (at row 5)\n: While "
     "executing File. (CANNOT_PARSE_INPUT_ASSERTION_FAILED)", DataError,
     "f: Cannot parse input: expected ',' *** (at row 5)"),
    ("Code: 107. DB::Exception: File /d/x.parquet doesn't exist. (FILE_DOESNT_EXIST)",
     SourceError, "f: File /d/x.parquet doesn't exist"),
])
def test_push_errors_carry_the_servers_answer(message: str, kind: type, text: str) -> None:
    error = push_error(message, "f", URL)
    assert isinstance(error, kind) and str(error).startswith(text)
    assert "s3cr3t" not in str(error)


def test_raw_when_the_server_reads_the_bytes_else_push() -> None:
    from chload.targets.server.fill import PUSH, RAW
    from chload.targets.server.target import ServerTarget

    target = ServerTarget.__new__(ServerTarget)
    target.caps, target.url = OLD, URL

    def job(name: str, fmt: str, compression: str, **kw: object) -> LoadJob:
        f = SourceFile(name, 1, 1, FileFormat(fmt, compression), local_path=name)
        return LoadJob(file=f, table="`db`.`t`", table_display="db.t", columns=[],
                       read_columns=[], audit=kw.get("audit", False),  # type: ignore[arg-type]
                       settings=kw.get("settings", ()), run_id="r")  # type: ignore[arg-type]

    assert target.path_for(job("a.csv.gz", "CSVWithNames", "gzip")) == RAW
    assert target.path_for(job("a.csv", "CSV", "none")) == RAW
    assert target.path_for(job("a.csv.zst", "CSV", "zstd")) == PUSH  # 18.16: no zstd bodies
    assert target.path_for(job("a.parquet", "Parquet", "none")) == PUSH
    assert target.path_for(job("a.csv.gz", "CSVWithNames", "gzip", audit=True)) == PUSH
    assert target.path_for(job("a.csv.gz", "CSVWithNames", "gzip",
                               settings=(("format_csv_null_representation", "-"),))) == PUSH
    target.url = parse_target_url("http://h:1/db?path=push", env={})
    assert target.path_for(job("a.csv.gz", "CSVWithNames", "gzip")) == PUSH


def test_every_column_the_server_cannot_store_is_in_one_line_with_a_whole_schema() -> None:
    columns = [Column("id", "UInt64"), Column("at", "Nullable(DateTime64(3))"),
               Column("d", "Date32"), Column("ok", "Bool"), Column("m", "Map(String, UInt64)")]
    with pytest.raises(SchemaError) as info:
        server_columns(columns, OLD, "table db.t")
    assert str(info.value) == (
        "table db.t: columns at (Nullable(DateTime64(3))), d (Date32), m (Map(String, "
        "UInt64)) have types ClickHouse 18.16.1 cannot store; pass --schema with types it "
        "has for them (at: DateTime (drops fractions of a second) or String; d: Date (1970 "
        "to 2105 only on 18.16) or String; m: String), e.g. --schema 'id UInt64, at "
        "Nullable(String), d String, ok UInt8, m String'")
    with pytest.raises(SchemaError, match="; a whole --schema: 'id UInt64, d String'$"):
        server_columns(columns[:1] + columns[2:3], OLD, "table db.t")
