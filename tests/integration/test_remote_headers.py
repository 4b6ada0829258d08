"""A remote CSV's header read from its first bytes by its source (one ranged GET,
decompressed by chload), not by the engine: the bytes a real MinIO gives for the range,
and a load that still refuses, alone, an object whose header does not fit its table."""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path

import pytest
import services
from conftest import run_chload

from chload.core.reading import sniff
from chload.formats import detect
from chload.sources.base import SourceContext, SourceFile
from chload.sources.files import aws
from chload.sources.files.s3 import S3Source

pytestmark = pytest.mark.integration


def env_of(minio: services.Service, tmp_path: Path) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": minio.url, "AWS_ACCESS_KEY_ID": minio.credentials["access_key"],
            "AWS_SECRET_ACCESS_KEY": minio.credentials["secret_key"], "AWS_SESSION_TOKEN": "",
            "AWS_PROFILE": "", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none")}


@pytest.fixture
def bucket(minio: services.Service) -> str:
    name = f"heads-{uuid.uuid4().hex[:8]}"
    services.minio_create_bucket(minio, name)
    client = services.minio_client(minio)
    rows = "".join(f"{i},{i * 2}\n" for i in range(200_000)).encode()
    for key, body in (("h/a.csv.gz", gzip.compress(b"id,v\n" + rows)),
                      ("h/b.csv.gz", gzip.compress(b"id,w\n1,2\n")),
                      ("h/c.csv", b"id,v\n7,8\n")):
        client.put_object(Bucket=name, Key=key, Body=body)  # type: ignore[attr-defined]
    return name


def test_the_source_reads_an_objects_first_bytes(minio: services.Service, bucket: str,
                                                 tmp_path: Path) -> None:
    context = SourceContext(s3=aws.resolve(env_of(minio, tmp_path)))
    source = S3Source().open()
    whole = SourceFile(f"s3://{bucket}/h/a.csv.gz", 0, 0, detect("a.csv.gz"), kind="s3")
    start = source.start(whole, sniff.LIMIT, context)
    assert start is not None and len(start) == sniff.LIMIT  # (the object is larger)
    assert sniff.remote_first_text(whole, lambda f, n: source.start(f, n, context)) == "id,v\n"
    short = SourceFile(f"s3://{bucket}/h/c.csv", 9, 0, detect("c.csv"), kind="s3")
    assert source.start(short, sniff.LIMIT, context) == b"id,v\n7,8\n"
    gone = SourceFile(f"s3://{bucket}/h/gone.csv", 9, 0, detect("gone.csv"), kind="s3")
    assert source.start(gone, sniff.LIMIT, context) is None  # (the engine then says why)


def test_an_object_whose_header_does_not_fit_fails_alone(minio: services.Service,
                                                         bucket: str, tmp_path: Path,
                                                         target_dir: str) -> None:
    out = run_chload("load", f"s3://{bucket}/h/*.csv*", "--table", "heads", "--target",
                     target_dir, "--schema", "id UInt64, v UInt64", "--json",
                     env=env_of(minio, tmp_path), timeout=240)
    report = json.loads(out.stdout)
    assert out.returncode == 1 and report["rows_loaded"] == 200_001, out.stderr
    [failed] = [f for f in report["files"] if f["status"] == "failed"]
    assert failed["uri"] == f"s3://{bucket}/h/b.csv.gz"
    assert "its header does not fit table" in failed["error"]
    assert "columns in the data but not in the table: w" in failed["error"]
