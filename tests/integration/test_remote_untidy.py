"""S3 (MinIO) and HTTP inputs a new user meets on day one, into the embedded target:
Spark's marker objects next to Parquet, gzip objects whose names say nothing of it, and
HTTP servers that redirect, send no extension, gzip their body or cut it short."""

from __future__ import annotations

import base64
import gzip
import http.server
import io
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import services
from conftest import run_chload, serving_http

pytestmark = pytest.mark.integration

CSV = b"id,name\n1,a\n2,b\n3,c\n"


def _env(minio: services.Service, tmp_path: Path) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": minio.credentials["access_key"],
            "AWS_SECRET_ACCESS_KEY": minio.credentials["secret_key"], "AWS_SESSION_TOKEN": "",
            "AWS_PROFILE": "", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none")}


def _load(source: str, target: str, table: str, env: dict[str, str] | None = None,
          *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = run_chload("load", source, "--table", table, "--target", target, "--json", *args,
                     env=env, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    return out, json.loads(out.stdout) if out.stdout.strip() else {}


def _ids(target: str, table: str) -> list[int]:
    out = run_chload("sql", f"SELECT id FROM {table} ORDER BY id", "--target", target,
                     "--format", "TSV")
    assert out.returncode == 0, out.stderr
    return [int(x) for x in out.stdout.split()]


@pytest.fixture
def bucket(minio: services.Service) -> str:
    name = f"untidy-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, name)
    return name


def _parquet(ids: list[int]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.table({"id": ids}), out)
    return out.getvalue()


def test_s3_glob_skips_spark_markers(minio: services.Service, bucket: str, tmp_path: Path,
                                     ) -> None:
    """`out/*` next to Spark's `_SUCCESS`, `_committed_*`, `.crc` and `_temporary/`: the
    Parquet parts load, the rest is no source (two failed files and exit 1 before)."""
    client = services.minio_client(minio)
    put = client.put_object  # type: ignore[attr-defined]
    put(Bucket=bucket, Key="out/year=2024/part-0.parquet", Body=_parquet([1, 2]))
    put(Bucket=bucket, Key="out/year=2024/part-1.parquet", Body=_parquet([3]))
    put(Bucket=bucket, Key="out/year=2024/_SUCCESS", Body=b"")
    put(Bucket=bucket, Key="out/year=2024/_committed_42", Body=b'{"added":[]}')
    put(Bucket=bucket, Key="out/year=2024/.part-0.parquet.crc", Body=b"crc!")
    put(Bucket=bucket, Key="out/_temporary/0/part-9.parquet", Body=_parquet([99]))
    target = str(tmp_path / "target")
    for pattern, table in (("out/year=2024/*", "star"), ("out/**/*.parquet", "deep")):
        out, report = _load(f"s3://{bucket}/{pattern}", target, table, _env(minio, tmp_path))
        assert out.returncode == 0 and report["files_loaded"] == 2, out.stderr
        assert _ids(target, table) == [1, 2, 3]


def test_s3_gzip_objects_without_gz_in_the_name(minio: services.Service, bucket: str,
                                                tmp_path: Path) -> None:
    """A gzip export saved as `.csv` (keys with `+`, `=` and a space: the ranged read of
    its first bytes is signed as S3 wants) loads; before, the engine made a column named
    with gzip bytes and failed."""
    client = services.minio_client(minio)
    for i, key in enumerate(["gz/a b.csv", "gz/k=v+1.csv"]):
        body = gzip.compress(b"id,name\n%d,x\n" % i)
        client.put_object(Bucket=bucket, Key=key, Body=body)  # type: ignore[attr-defined]
    target = str(tmp_path / "target")
    out, report = _load(f"s3://{bucket}/gz/", target, "gz", _env(minio, tmp_path))
    assert out.returncode == 0 and report["rows_loaded"] == 2, out.stderr
    assert _ids(target, "gz") == [0, 1]
    assert minio.credentials["secret_key"] not in out.stdout + out.stderr


class _Untidy(http.server.BaseHTTPRequestHandler):
    """Answers as real servers do that a user meets: redirects, no extension, a gzip
    body under a .csv name, Content-Encoding, chunked, errors."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        return None

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(get=False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(get=True)

    def _answer(self, get: bool) -> None:
        path = self.path.split("?")[0]
        answers: dict[str, tuple[int, bytes, list[tuple[str, str]]]] = {
            "/moved.csv": (302, b"", [("Location", "/files/data.csv")]),
            "/files/data.csv": (200, CSV, [("Content-Type", "text/csv")]),
            "/export": (200, CSV, [("Content-Type", "text/csv; charset=utf-8")]),
            "/download": (200, CSV, [("Content-Type", "application/octet-stream"),
                                     ("Content-Disposition", 'attachment; filename="t.csv"')]),
            "/packed.csv": (200, gzip.compress(CSV), [("Content-Type", "text/csv")]),
            "/encoded.csv": (200, gzip.compress(CSV), [("Content-Encoding", "gzip")]),
            "/page": (200, b"<html></html>", [("Content-Type", "text/html")]),
            "/blob/data.csv": (200, b"<html>a,b</html>", [("Content-Type",
                                                           "text/html; charset=utf-8")]),
            "/bare": (200, CSV, [("Content-Type", "application/octet-stream")]),
            "/broken.csv": (500, b"oops", []),
            "/chunked.csv": (200, b"", [("Content-Type", "text/csv")]),  # body below
        }
        if path == "/expired.csv":  # a presigned URL that expired between HEAD and GET
            answers[path] = ((403, b"expired", []) if get
                             else (200, CSV, [("Content-Type", "text/csv")]))
        if path == "/private.csv":
            auth = "Basic " + base64.b64encode(b"loader:pw@Secret9").decode()
            answers[path] = ((200, CSV, [("Content-Type", "text/csv")])
                             if self.headers.get("Authorization") == auth
                             else (401, b"", [("WWW-Authenticate", 'Basic realm="x"')]))
        status, body, headers = answers.get(path, (404, b"", []))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if path == "/chunked.csv":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if get:
                for line in CSV.splitlines(keepends=True):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if get:
            self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serving_http(_Untidy) as url:
        yield url


@pytest.mark.parametrize("path", ["/moved.csv", "/export", "/download?id=3", "/packed.csv",
                                  "/encoded.csv"])
def test_http_untidy_servers_load(server: str, path: str, tmp_path: Path) -> None:
    """Each loaded exactly (before: the engine's url() refused the redirect; no extension
    was 'cannot tell the format'; a gzip body was an engine error)."""
    target = str(tmp_path / "target")
    out, report = _load(server + path, target, "t")
    assert out.returncode == 0 and report["rows_loaded"] == 3, out.stderr
    assert report["files"][0]["uri"] == server + path  # the ledger keeps the URL as given
    assert _ids(target, "t") == [1, 2, 3]


def test_http_chunked_loads(server: str, tmp_path: Path) -> None:
    out, report = _load(server + "/chunked.csv", str(tmp_path / "target"), "t")
    assert out.returncode == 0 and report["rows_loaded"] == 3, out.stderr


@pytest.mark.parametrize(("path", "said"), [
    ("/page", "a web page (Content-Type text/html), not data; use the file's raw"),
    ("/blob/data.csv", "a web page (Content-Type text/html), not data; use the file's raw"),
    ("/bare", "cannot tell the format from the URL nor its Content-Type "
              "(application/octet-stream); pass --format"),
    ("/missing.csv", "not found (HTTP 404)"),
    ("/broken.csv", "HTTP 500"),
])
def test_http_refusals_are_one_line(server: str, tmp_path: Path, path: str, said: str) -> None:
    out, _ = _load(server + path, str(tmp_path / "target"), "t")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert said in out.stderr and server + path in out.stderr


def test_server_target_reads_them_alike(clickhouse: services.Service, server: str,
                                        table_name: str) -> None:
    """Into the 18.16 server (read through chload's own chDB, pushed as Native blocks):
    a redirect to a gzip body under a .csv name, and a URL told by its Content-Type."""
    for path in ("/moved.csv", "/packed.csv", "/export"):
        out, report = _load(server + path, clickhouse.url, table_name)
        assert out.returncode == 0 and report["rows_loaded"] == 3, out.stderr
    assert _ids(clickhouse.url, table_name) == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_http_query_secrets_stay_out(server: str, tmp_path: Path) -> None:
    """A presigned URL's signature and a token in the query reach the server (the engine
    reads the URL as written) but not the output, the ledger or the run history."""
    secret = "s3cr3tSig0xyz"
    url = f"{server}/files/data.csv?X-Amz-Signature={secret}&access_token={secret}&id=3"
    target = str(tmp_path / "target")
    out, report = _load(url, target, "t")
    assert out.returncode == 0 and report["rows_loaded"] == 3, out.stderr
    assert report["files"][0]["uri"].endswith("?X-Amz-Signature=***&access_token=***&id=3")
    files = run_chload("files", "--table", "t", "--target", target, "--json")
    history = run_chload("history", "--target", target, "--json")
    for text in (out.stdout, out.stderr, files.stdout, history.stdout):
        assert secret not in text
    stored = [p for p in Path(target).rglob("*") if p.is_file()
              and secret.encode() in p.read_bytes()]
    assert not stored  # the ledger's tables, the history's, table metadata


def test_a_secret_the_engine_quotes_is_masked(server: str, tmp_path: Path) -> None:
    """The engine's error quotes the URL it failed to read, in full: a signature in it
    reached the output (`Received error from remote server ...?X-Amz-Signature=...`)."""
    secret = "s3cr3tSig0xyz"
    url = f"{server}/expired.csv?X-Amz-Signature={secret}&id=3"
    target = str(tmp_path / "target")
    for extra in ([], ["--schema", "a String"]):  # failed inference, failed load
        out, _ = _load(url, target, "t", None, *extra)
        assert out.returncode != 0 and "403" in out.stdout + out.stderr, out.stderr
        assert secret not in out.stdout + out.stderr
    files = run_chload("files", "--table", "t", "--target", target, "--json")
    assert secret not in files.stdout


def test_http_basic_auth_in_the_url(server: str, tmp_path: Path) -> None:
    """`user:password@` (the `@` in the password escaped): the HEAD and the engine send
    it as Basic auth (urllib took it for the host name before: "cannot reach the
    server"); the password is in no output, and a wrong one is one line."""
    host = server.removeprefix("http://")
    target = str(tmp_path / "target")
    out, report = _load(f"http://loader:pw%40Secret9@{host}/private.csv", target, "t")
    assert out.returncode == 0 and report["rows_loaded"] == 3, out.stderr
    assert report["files"][0]["uri"] == f"{server}/private.csv"
    assert "Secret9" not in out.stdout + out.stderr
    wrong, _ = _load(f"http://loader:nope@{host}/private.csv", target, "t")
    assert wrong.returncode == 2 and "access denied (HTTP 401)" in wrong.stderr
    assert wrong.stderr.count("\n") == 1 and "nope" not in wrong.stderr
