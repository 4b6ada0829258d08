"""Azure and GCS sources without services: URI shapes, the Azure connection string and
variables, the List Blobs answer, the engine's SQL given the key only while it reads,
and GCS settings from its own variables."""

from __future__ import annotations

import pytest

from chload.errors import UsageError, unsecret
from chload.formats import FileFormat
from chload.sources.base import SourceFile
from chload.sources.files import azure, gcs
from chload.sources.registry import gcs_settings, kind_of, table_function, table_function_many

KEY = "c2VjcmV0LWFjY291bnQta2V5LU5ldmVyLVNob3du"  # base64
CONNECTION = (f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={KEY};"
              "BlobEndpoint=http://127.0.0.1:10000/acct;")


@pytest.mark.parametrize("uri, parts", [
    ("az://raw/trips/*.gz", ("raw", "trips/*.gz")),
    ("azure://raw/x.csv", ("raw", "x.csv")),
    ("abfss://raw@acct.dfs.core.windows.net/a/b.parquet", ("raw", "a/b.parquet")),
    ("az://raw", ("raw", "")),
])
def test_azure_uri_shapes(uri: str, parts: tuple[str, str]) -> None:
    assert azure.parse_uri(uri) == parts
    assert kind_of(uri) == "azure"


@pytest.mark.parametrize("uri", ["az://Raw/x", "az://ab/x", "az://a--b/x", "az://-ab/x"])
def test_azure_container_names_are_checked(uri: str) -> None:
    with pytest.raises(UsageError, match="az://container/prefix/pattern"):
        azure.parse_uri(uri)


def test_connection_string_and_variables() -> None:
    got = azure.resolve({"AZURE_STORAGE_CONNECTION_STRING": CONNECTION})
    assert (got.endpoint, got.account, got.key) == ("http://127.0.0.1:10000/acct", "acct", KEY)
    assert KEY not in repr(got)
    assert unsecret(f"quoted {KEY} by the engine") == "quoted *** by the engine"
    plain = azure.resolve({"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": KEY})
    assert plain.endpoint == "https://acct.blob.core.windows.net"
    suffix = azure.from_connection_string(
        f"DefaultEndpointsProtocol=https;AccountName=a1;AccountKey={KEY};"
        "EndpointSuffix=core.chinacloudapi.cn")
    assert suffix.endpoint == "https://a1.blob.core.chinacloudapi.cn"
    with pytest.raises(UsageError, match="no Azure credentials"):
        azure.resolve({"AZURE_STORAGE_ACCOUNT": "acct"})
    with pytest.raises(UsageError, match="AZURE_STORAGE_CONNECTION_STRING: write it"):
        azure.resolve({"AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct"})


def test_list_blobs_answer_is_parsed() -> None:
    body = (b'<?xml version="1.0"?><EnumerationResults><Blobs>'
            b"<Blob><Name>d/a.csv</Name><Properties><Last-Modified>Wed, 01 Jan 2025 "
            b"00:00:00 GMT</Last-Modified><Etag>0x8DC1</Etag><Content-Length>12"
            b"</Content-Length></Properties></Blob>"
            b"<Blob><Name>d/sub</Name><Properties><ResourceType>directory</ResourceType>"
            b"</Properties></Blob></Blobs><NextMarker>m2</NextMarker></EnumerationResults>")
    root = azure.ElementTree.fromstring(body)
    assert list(azure.parse_listing(root)) == [
        azure.Blob("d/a.csv", 12, "0x8DC1", 1_735_689_600 * 10**9)]
    assert azure._text(root, "NextMarker") == "m2"


def _blob(name: str) -> SourceFile:
    return SourceFile(f"az://raw/d/{name}", 5, 0, FileFormat("CSV", "gzip"), etag="0x1:5",
                      kind="azure")


def test_the_engine_gets_the_key_only_while_it_reads() -> None:
    with pytest.raises(UsageError, match="only inside the run"):
        table_function(_blob("a.csv.gz"), "CSV", None)
    settings = azure.from_connection_string(CONNECTION)
    with azure.hand_to_engine(settings):
        sql = table_function(_blob("a.csv.gz"), "CSV", "id UInt32")
        many = table_function_many([_blob("a.csv.gz"), _blob("b.csv.gz")], "CSV", None)
    assert sql.startswith("azureBlobStorage('DefaultEndpointsProtocol=http;AccountName=acct;")
    assert sql.endswith("'raw', 'd/a.csv.gz', 'CSV', 'gzip', 'id UInt32')")
    assert many is not None and "'d/{a.csv.gz,b.csv.gz}'" in many[0]
    assert many[1] == "concat('az://', _path)"
    with pytest.raises(UsageError):
        table_function(_blob("a.csv.gz"), "CSV", None)  # the block is over


def test_gcs_settings_from_its_own_variables() -> None:
    got = gcs.resolve({"GCS_ACCESS_KEY_ID": "GOOG1E", "GCS_SECRET_ACCESS_KEY": "hmac-Secret"})
    assert (got.endpoint, got.region, got.scheme, got.custom_endpoint) == (
        "https://storage.googleapis.com", "auto", "gs", True)
    assert got.credentials is not None and got.credentials.source == "GCS_ACCESS_KEY_ID"
    assert "hmac-Secret" not in repr(got)
    assert gcs.resolve({}).anonymous
    assert gcs.resolve({"GCS_ENDPOINT_URL": "http://127.0.0.1:9000/"}).endpoint == \
        "http://127.0.0.1:9000"
    with pytest.raises(UsageError, match="separate runs"):
        gcs_settings(["gs://b/x", "s3://c/y"], {"GCS_ACCESS_KEY_ID": "k",
                                                "GCS_SECRET_ACCESS_KEY": "s"})


def test_gcs_objects_read_with_gcs() -> None:
    one = SourceFile("gs://b/x.csv", 1, 0, FileFormat("CSV", "none"), kind="gcs",
                     location="https://storage.googleapis.com/b/x.csv")
    assert table_function(one, "CSV", None).startswith(
        "gcs('https://storage.googleapis.com/b/x.csv', 'CSV'")


def test_an_abfs_uri_of_another_account_is_refused() -> None:
    settings = azure.from_connection_string(CONNECTION)
    with pytest.raises(UsageError, match="names account other, but .* account acct"):
        list(azure.list_azure("abfss://raw@other.dfs.core.windows.net/x.csv", None, None,
                              settings))
