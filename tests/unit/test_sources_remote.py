"""Remote sources without services: S3 listing and globs, AWS settings and SigV4, HDFS
listing through a scripted engine, HTTP identities through a scripted HEAD."""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from chload.errors import EngineError, SourceError, TransientError, UsageError
from chload.formats import FileFormat
from chload.sources.base import SourceFile
from chload.sources.files import aws
from chload.sources.files.hdfs import list_hdfs
from chload.sources.files.http import list_http, redact
from chload.sources.files.s3 import (
    KeyMatcher,
    Lister,
    S3Object,
    find_objects,
    listing_prefixes,
    parse_uri,
)
from chload.sources.registry import table_function, table_function_many

SECRET = "s3cr3t-Never-Shown"
NOW_NS = 1_700_000_000 * 10**9


# ------------------------------------------------------------------ S3 globs and listing


@pytest.mark.parametrize("pattern, key, hit", [
    ("trips/*.csv.gz", "trips/a.csv.gz", True),
    ("trips/*.csv.gz", "trips/sub/a.csv.gz", False),  # * stays in its segment
    ("trips/**.csv.gz", "trips/sub/a.csv.gz", True),
    ("trips/**/*.csv", "trips/x/y/a.csv", True),
    ("trips/2026-*/*.csv.gz", "trips/2026-01/a.csv.gz", True),
    ("trips/2026-*/*.csv.gz", "trips/2025-01/a.csv.gz", False),
    ("t/part-?.csv", "t/part-1.csv", True),
    ("t/part-?.csv", "t/part-12.csv", False),
    ("t/[ab].csv", "t/b.csv", True),
    ("t/[!ab].csv", "t/b.csv", False),
    ("t/a+b (1).csv", "t/a+b (1).csv", True),  # regex characters are literal
    ("t/x.csv", "t/x.csv", True),  # an exact key
    ("t", "t/x.csv", True),  # a directory: everything below
    ("t/", "t/deep/x.csv", True),
    ("t", "t2/x.csv", False),
    ("t", "t/_SUCCESS", False),  # hidden names of a directory are skipped
    ("t", "t/.tmp/x.csv", False),
    ("t", "t/sub/", False),  # a folder marker is never data
    ("", "any/key.csv", True),  # the whole bucket
])
def test_key_matcher(pattern: str, key: str, hit: bool) -> None:
    assert KeyMatcher(pattern).matches(key) is hit


def test_listing_prefixes_one_per_directory() -> None:
    numbered = [f"data/part-{i:03d}.csv" for i in range(100)]
    assert listing_prefixes(numbered) == ["data/part-0"]
    assert listing_prefixes(["a/x.csv", "b/x.csv"]) == ["a/x.csv", "b/x.csv"]
    assert listing_prefixes(["t/2026-*/*.gz", "t/2026-01/x.gz"]) == ["t/2026-"]
    assert listing_prefixes(["**.csv"]) == [""]


class FakeLister:
    """Answers listings from a dict of keys, and records the prefixes asked for."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = sorted(keys)
        self.prefixes: list[str] = []

    def list(self, bucket: str, prefix: str, start_after: str = "") -> Iterator[S3Object]:
        self.prefixes.append(prefix)
        for key in self.keys:
            if key.startswith(prefix) and key > start_after:
                yield S3Object(key, 10, f"etag-{key}", NOW_NS)


def test_find_objects_lists_once_and_expands_braces() -> None:
    keys = [f"d/part-{i:03d}.csv" for i in range(200)] + ["d/other.csv"]
    lister = FakeLister(keys)
    found = list(find_objects(lister, "b", "d/part-{000..099}.csv"))  # type: ignore[arg-type]
    assert [o.key for o in found] == keys[:100]
    assert lister.prefixes == ["d/part-0"]


def test_find_objects_glob_and_directory() -> None:
    keys = ["t/2026-01/a.csv.gz", "t/2026-02/b.csv.gz", "t/2025-12/c.csv.gz", "t/x/_SUCCESS"]
    lister = FakeLister(keys)
    got = list(find_objects(lister, "b", "t/2026-*/*.csv.gz"))  # type: ignore[arg-type]
    assert [o.key for o in got] == keys[:2] and lister.prefixes == ["t/2026-"]
    got = list(find_objects(FakeLister(keys), "b", "t/"))  # type: ignore[arg-type]
    assert [o.key for o in got] == sorted(keys[:3])


def test_find_objects_starts_each_prefix_after_its_last_loaded_key() -> None:
    keys = [f"logs/{d}/{n}.csv" for d in ("a", "b") for n in range(5)]
    lister = FakeLister(keys)
    last = {"s3://b/logs/a/": "s3://b/logs/a/2.csv", "s3://b/logs/b/": ""}
    asked: list[str] = []

    def after(prefix: str) -> str:
        asked.append(prefix)
        return last[prefix]
    got = list(find_objects(lister, "b", "logs/{a,b}/*.csv", after))  # type: ignore[arg-type]
    assert [o.key for o in got] == keys[3:]  # a: 3 and 4; b: every key
    assert asked == ["s3://b/logs/a/", "s3://b/logs/b/"]


def test_parse_uri() -> None:
    assert parse_uri("s3://raw/trips/*.gz") == ("raw", "trips/*.gz")
    assert parse_uri("s3://raw") == ("raw", "")
    with pytest.raises(UsageError, match="s3://bucket/prefix"):
        parse_uri("s3://Bad_Bucket!/x")


def _page(keys: list[str], token: str = "") -> bytes:
    items = "".join(f"<Contents><Key>{k}</Key><Size>5</Size><ETag>&quot;e{i}&quot;</ETag>"
                    f"<LastModified>2026-01-02T03:04:05.500Z</LastModified></Contents>"
                    for i, k in enumerate(keys))
    more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}" \
           "</NextContinuationToken>" if token else "<IsTruncated>false</IsTruncated>"
    return (f'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{more}'
            f"{items}</ListBucketResult>").encode()


class ScriptedLister(Lister):
    """A Lister whose HTTP exchanges are scripted: (status, headers, body) or an exception."""

    def __init__(self, answers: list[object], creds: aws.Credentials | None = None) -> None:
        super().__init__(aws.S3Config("http://127.0.0.1:9", "us-east-1", creds, True))
        self.answers = answers
        self.urls: list[str] = []

    def _request(self, url: str) -> tuple[int, dict[str, str], bytes]:
        self.urls.append(url)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]


def test_lister_paginates_with_continuation_token() -> None:
    lister = ScriptedLister([(200, {}, _page(["p/a", "p/b"], token="T+1/=")),
                             (200, {}, _page(["p/c"]))])
    objects = list(lister.list("bkt", "p/"))
    assert [o.key for o in objects] == ["p/a", "p/b", "p/c"]
    assert objects[0].etag == "e0" and objects[0].size == 5
    assert objects[0].modified_ns == int(dt.datetime(2026, 1, 2, 3, 4, 5, 500000,
                                                     tzinfo=dt.UTC).timestamp() * 10**9)
    assert "continuation-token" not in lister.urls[0]
    assert "continuation-token=T%2B1%2F%3D" in lister.urls[1]
    assert lister.urls[0] == "http://127.0.0.1:9/bkt/?list-type=2&max-keys=1000&prefix=p%2F"


def test_lister_errors_are_one_line_without_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.sleep", lambda s: None)
    creds = aws.Credentials("AKIDEXAMPLE", SECRET, source="profile p1")
    denied = b"<Error><Code>SignatureDoesNotMatch</Code><Message>x</Message></Error>"
    with pytest.raises(SourceError) as err:
        list(ScriptedLister([(403, {}, denied)], creds).list("bkt", "p/"))
    text = str(err.value)
    assert "access denied (SignatureDoesNotMatch)" in text and "profile p1" in text
    assert SECRET not in text and "\n" not in text
    with pytest.raises(SourceError, match="no such bucket"):
        list(ScriptedLister([(404, {}, b"<Error><Code>NoSuchBucket</Code></Error>")])
             .list("bkt", ""))
    flaky = ScriptedLister([(503, {}, b""), ConnectionResetError(), (200, {}, _page(["k"]))])
    assert [o.key for o in flaky.list("bkt", "")] == ["k"]
    with pytest.raises(TransientError, match="cannot reach http://127.0.0.1:9"):
        list(ScriptedLister([ConnectionRefusedError()] * 3).list("bkt", ""))


def test_lister_follows_bucket_region() -> None:
    lister = ScriptedLister([(301, {"x-amz-bucket-region": "eu-west-1"}, b""),
                             (200, {}, _page(["k"]))])
    assert [o.key for o in lister.list("bkt", "")] == ["k"]
    assert lister.config.region == "eu-west-1"


# ------------------------------------------------------------------ AWS settings, SigV4


def _profiles(tmp_path: Path) -> dict[str, str]:
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = DEF\naws_secret_access_key = {SECRET}\n"
                     f"[p1]\naws_access_key_id = P1\naws_secret_access_key = {SECRET}\n"
                     "aws_session_token = TOK\n")
    config = tmp_path / "config"
    config.write_text("[profile p1]\nregion = eu-central-1\nendpoint_url = http://p1:9000\n"
                      f"[profile cfg]\naws_access_key_id = CFG\naws_secret_access_key = {SECRET}\n")
    return {"AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_CONFIG_FILE": str(config)}


def test_resolve_environment_first(tmp_path: Path) -> None:
    env = {**_profiles(tmp_path), "AWS_ACCESS_KEY_ID": "ENV", "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_SESSION_TOKEN": "T", "AWS_REGION": "ap-south-1", "AWS_DEFAULT_REGION": "x"}
    config = aws.resolve(env)
    assert config.credentials == aws.Credentials("ENV", SECRET, "T", "environment")
    assert config.region == "ap-south-1"
    assert config.endpoint == "https://s3.ap-south-1.amazonaws.com" and not config.custom_endpoint
    assert config.object_url("raw", "a b/c.csv") == \
        "https://raw.s3.ap-south-1.amazonaws.com/a%20b/c.csv"
    assert config.object_url("my.bucket", "k") == "https://s3.ap-south-1.amazonaws.com/my.bucket/k"


def test_resolve_profiles(tmp_path: Path) -> None:
    files = _profiles(tmp_path)
    default = aws.resolve(files)
    assert default.credentials and default.credentials.access_key == "DEF"
    p1 = aws.resolve({**files, "AWS_PROFILE": "p1"})
    assert p1.credentials == aws.Credentials("P1", SECRET, "TOK", "profile p1")
    assert (p1.region, p1.endpoint, p1.custom_endpoint) == ("eu-central-1", "http://p1:9000", True)
    cfg = aws.resolve({**files, "AWS_PROFILE": "cfg"})
    assert cfg.credentials and cfg.credentials.access_key == "CFG"
    with pytest.raises(UsageError, match="AWS_PROFILE nope: no such profile"):
        aws.resolve({**files, "AWS_PROFILE": "nope"})


def test_resolve_endpoint_precedence_and_anonymous(tmp_path: Path) -> None:
    none = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "x"),
            "AWS_CONFIG_FILE": str(tmp_path / "y")}
    config = aws.resolve({**none, "AWS_ENDPOINT_URL": "http://generic:1",
                          "AWS_ENDPOINT_URL_S3": "http://s3only:2/"})
    assert config.endpoint == "http://s3only:2" and config.anonymous
    assert aws.resolve({**none, "AWS_ENDPOINT_URL": "http://generic:1"},
                       "https://flag:443").endpoint == "https://flag"
    assert aws.resolve(none, "http://h:9000").object_url("raw", "k/x.csv") == \
        "http://h:9000/raw/k/x.csv"
    with pytest.raises(UsageError, match="AWS_ENDPOINT_URL localhost:9000: write"):
        aws.resolve({**none, "AWS_ENDPOINT_URL": "localhost:9000"})


def test_credentials_never_in_repr() -> None:
    creds = aws.Credentials("AKID", SECRET, "TOKEN-XYZ", "environment")
    config = aws.S3Config("http://h", "us-east-1", creds, True)
    assert SECRET not in repr(creds) and "TOKEN-XYZ" not in repr(config)


def test_sigv4_matches_the_aws_documentation_example() -> None:
    # "GET Bucket (List Objects)" from the AWS SigV4 header-based authentication docs.
    creds = aws.Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    url = "https://examplebucket.s3.amazonaws.com/?" + aws.canonical_query(
        {"max-keys": "2", "prefix": "J"})
    headers = aws.sign("GET", url, "us-east-1", creds, dt.datetime(2013, 5, 24, tzinfo=dt.UTC))
    assert headers["authorization"].endswith(
        "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")
    assert aws.sign("GET", url, "us-east-1", None) == {"host": "examplebucket.s3.amazonaws.com"}
    with_token = aws.sign("GET", url, "us-east-1", aws.Credentials("A", "B", "TKN"))
    assert with_token["x-amz-security-token"] == "TKN"
    assert "x-amz-security-token" in with_token["authorization"]


def test_hand_to_engine_sets_only_what_the_environment_lacks(tmp_path: Path) -> None:
    environ: dict[str, str] = {"AWS_ACCESS_KEY_ID": "USER", "AWS_SECRET_ACCESS_KEY": "S"}
    with aws.hand_to_engine(aws.Credentials("USER", "S", source="environment"), environ):
        assert environ == {"AWS_ACCESS_KEY_ID": "USER", "AWS_SECRET_ACCESS_KEY": "S"}
    environ = {"AWS_SESSION_TOKEN": "stale"}
    with aws.hand_to_engine(aws.Credentials("P1", SECRET, source="profile p1"), environ):
        assert environ == {"AWS_ACCESS_KEY_ID": "P1", "AWS_SECRET_ACCESS_KEY": SECRET}
    # Only while the engine reads: after, the environment is the user's own again, so a
    # later resolve() cannot take what was handed to the engine for the user's.
    assert environ == {"AWS_SESSION_TOKEN": "stale"}
    later = aws.resolve({**_profiles(tmp_path), **environ})
    assert later.credentials and later.credentials.access_key == "DEF"
    with aws.hand_to_engine(None, environ):  # anonymous: NOSIGN, the environment untouched
        assert environ == {"AWS_SESSION_TOKEN": "stale"}


def test_s3_settings_are_resolved_once_from_what_they_are_given(tmp_path: Path) -> None:
    """Nothing but aws.resolve reads the environment: the CA bundle included, and list_s3
    takes the settings it is given (the caller resolved them once)."""
    env = {**_profiles(tmp_path), "AWS_CA_BUNDLE": str(tmp_path / "ca.pem")}
    settings = aws.resolve(env, "http://127.0.0.1:9")
    assert settings.ca_bundle == str(tmp_path / "ca.pem")
    assert Lister(settings).ca_bundle == settings.ca_bundle
    assert aws.resolve(_profiles(tmp_path)).ca_bundle is None


def test_s3_table_function_has_no_keys() -> None:
    base = SourceFile("s3://raw/k.csv.gz", 1, 1, _csv_gz(), kind="s3",
                      location="http://h:9/raw/k.csv.gz")
    sql = table_function(base, "CSVWithNames", "a UInt8")
    assert sql == "s3('http://h:9/raw/k.csv.gz', 'CSVWithNames', 'a UInt8', 'gzip')"
    public = SourceFile("s3://raw/k.csv.gz", 1, 1, _csv_gz(), kind="s3",
                        location="http://h:9/raw/k.csv.gz", anonymous=True)
    assert "NOSIGN, 'CSVWithNames', 'auto'" in table_function(public, "CSVWithNames", None)


def _csv_gz() -> FileFormat:
    return FileFormat("CSV", "gzip")


# ------------------------------------------------------------------ HDFS


class FakeNameNode:
    """Answers the engine's `hdfs(url, 'One')` listing queries from a dict of files."""

    def __init__(self, files: dict[str, int]) -> None:
        self.files = files
        self.queries: list[str] = []

    def __call__(self, sql: str) -> list[dict]:
        self.queries.append(sql)
        url = sql.split("hdfs('", 1)[1].split("'", 1)[0]
        path = "/" + url.split("/", 3)[3]
        rows = []
        if path.endswith("/**"):
            base = path[:-2]
            if base.rstrip("/") in self.files:
                rows.append({"path": base, "size": self.files[base.rstrip("/")], "mtime": 7})
            rows += [{"path": p, "size": s, "mtime": 7} for p, s in self.files.items()
                     if p.startswith(base)]
        elif "*" in path:
            rows = [{"path": p, "size": s, "mtime": 7} for p, s in self.files.items()
                    if fnmatch.fnmatchcase(p, path) and p.count("/") == path.count("/")]
        elif path in self.files:
            rows = [{"path": path, "size": self.files[path], "mtime": 7}]
        elif not any(p.startswith(path) for p in self.files):
            raise EngineError(f"target /x: {path} does not exist. Error: FileNotFound", 660)
        return rows


def test_hdfs_glob_directory_file_and_missing() -> None:
    nn = FakeNameNode({"/raw/a.csv": 10, "/raw/b.csv": 20, "/raw/sub/c.csv": 30,
                       "/raw/_SUCCESS": 0, "/raw/.x/d.csv": 1})
    got = list(list_hdfs("hdfs://nn:8020/raw/*.csv", None, None, nn))
    assert [f.uri for f in got] == ["hdfs://nn:8020/raw/a.csv", "hdfs://nn:8020/raw/b.csv"]
    assert got[0].kind == "hdfs" and got[0].identity == f"10:{7 * 10**9}"
    assert "'One'" in nn.queries[0] and "hdfs('hdfs://nn:8020/raw/*.csv'" in nn.queries[0]
    tree = list(list_hdfs("hdfs://nn:8020/raw", None, None, nn))
    assert [f.uri.rsplit("/", 1)[1] for f in tree] == ["a.csv", "b.csv", "c.csv"]
    one = list(list_hdfs("hdfs://nn:8020/raw/b.csv", None, None, nn))
    assert [(f.uri, f.size) for f in one] == [("hdfs://nn:8020/raw/b.csv", 20)]
    with pytest.raises(SourceError, match=r"^hdfs://nn:8020/raw/zz.csv: /raw/zz.csv does not"):
        list(list_hdfs("hdfs://nn:8020/raw/zz.csv", None, None, nn))
    with pytest.raises(SourceError, match="no file matches"):
        list(list_hdfs("hdfs://nn:8020/raw/*.parquet", None, None, nn))
    with pytest.raises(UsageError, match="hdfs://namenode:port/path"):
        list(list_hdfs("hdfs://nn:8020", None, None, nn))
    sql = table_function(one[0], "CSVWithNames", None)
    assert sql == "hdfs('hdfs://nn:8020/raw/b.csv', 'CSVWithNames', 'auto', 'none')"


# ------------------------------------------------------------------ HTTP


class FakeServer:
    """A scripted HEAD: url -> list of (status, headers), one per call."""

    def __init__(self, answers: Mapping[str, list[tuple[int, dict[str, str]]]]) -> None:
        self.answers = {k: list(v) for k, v in answers.items()}

    def __call__(self, url: str) -> tuple[int, Mapping[str, str]]:
        script = self.answers.get(url, [(404, {})])
        return script.pop(0) if len(script) > 1 else script[0]


def test_http_expands_braces_and_takes_identities(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.sleep", lambda s: None)
    base = "https://h/d/part-"
    server = FakeServer({
        f"{base}0.csv": [(200, {"etag": '"abc"', "content-length": "10"})],
        f"{base}1.csv": [(200, {"content-length": "20",
                                "last-modified": "Wed, 21 Oct 2015 07:28:00 GMT"})],
        f"{base}2.csv": [(503, {}), (200, {"content-length": "5"})],
    })
    got = list_http(base + "{0..2}.csv", None, None, head=server)
    assert [f.uri for f in got] == [f"{base}{i}.csv" for i in range(3)]
    assert got[0].identity == '"abc":10' and got[0].kind == "http"
    assert got[1].identity == f"20:{1445412480 * 10**9}"
    assert got[2].size == 5 and got[0].format.name == "CSV"
    with pytest.raises(SourceError, match=r"^https://h/d/part-7.csv: not found \(HTTP 404\)"):
        list_http(base + "{0,7}.csv", None, None, head=server)
    with pytest.raises(UsageError, match="cannot list"):
        list_http("https://h/d/*.csv", None, None, head=server)


def test_http_unreachable_and_credentials_in_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.sleep", lambda s: None)

    def down(url: str) -> tuple[int, Mapping[str, str]]:
        raise TransientError(f"{redact(url)}: cannot reach the server (Connection refused)")
    with pytest.raises(TransientError, match="cannot reach"):
        list_http("http://h/a.csv", None, None, head=down)
    secret_url = f"https://me:{SECRET}@h/a.csv?x=1"
    got = list_http(secret_url, None, None, head=FakeServer({secret_url: [(200, {})]}))
    assert got[0].uri == "https://h/a.csv?x=1" and got[0].location == secret_url


# ------------------------------------------------------------------ many objects, one read


def _s3(key: str, bucket: str = "raw", **kw: object) -> SourceFile:
    return SourceFile(f"s3://{bucket}/{key}", 1, 1, _csv_gz(), kind="s3",
                      location=f"http://h:9/{bucket}/{key.replace(' ', '%20')}", **kw)  # type: ignore[arg-type]


def test_many_s3_objects_in_one_brace_list() -> None:
    files = [_s3("d/a.csv.gz"), _s3("d/sub/b.csv.gz"), _s3("d/c d.csv.gz")]
    sql, uri = table_function_many(files, "CSVWithNames", "a UInt8") or ("", "")
    assert sql == ("s3('http://h:9/raw/d/{a.csv.gz,sub/b.csv.gz,c%20d.csv.gz}', "
                   "'CSVWithNames', 'a UInt8', 'gzip')")
    assert uri == "concat('s3://', _path)"  # _path is bucket/key, decoded
    public = [_s3("a.csv.gz", anonymous=True), _s3("b.csv.gz", anonymous=True)]
    assert "NOSIGN" in (table_function_many(public, "CSV", None) or ("", ""))[0]


@pytest.mark.parametrize("files", [
    [_s3("d/a.csv.gz")],  # one file: nothing to share
    [_s3("a.csv.gz"), _s3("a.csv.gz", bucket="other")],  # no list in a bucket name
    [_s3("d/a,b.csv.gz"), _s3("d/c.csv.gz")],  # a comma would split the name
    [_s3("d/a{1}.csv.gz"), _s3("d/c.csv.gz")],
    [_s3("d/a.csv.gz"), _s3("d/b.csv.gz", anonymous=True)],  # read differently
    [_s3("d/a.csv.gz"), SourceFile("/x/b.csv.gz", 1, 1, _csv_gz())],  # kinds differ
])
def test_many_objects_refused_when_a_list_would_change_meaning(files: list[SourceFile]) -> None:
    assert table_function_many(files, "CSV", None) is None


def test_many_hdfs_files() -> None:
    files = [SourceFile(f"hdfs://nn:8020/raw/{n}", 1, 1, _csv_gz(), kind="hdfs")
             for n in ("a.csv.gz", "b.csv.gz")]
    sql, uri = table_function_many(files, "CSV", None) or ("", "")
    assert sql == "hdfs('hdfs://nn:8020/raw/{a.csv.gz,b.csv.gz}', 'CSV', 'auto', 'gzip')"
    assert uri == "concat('hdfs://nn:8020', _path)"
