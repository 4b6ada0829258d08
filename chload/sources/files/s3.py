"""S3-compatible object storage: `s3://bucket/prefix/glob`, listed by prefix, read by s3().

Listing is one paginated ListObjectsV2 per distinct literal prefix (1,000 keys a
page), never a request per object; the glob is matched here, on the keys. Glob
dialect as the engine's and local files': `*` and `?` within one path segment, `**`
across segments, `[abc]`, and `{a,b}` / `{000..099}` (expanded first). A pattern
without glob characters names one object or, failing that, a "directory": every
object under `key/`, except hidden names (`.x`, `_SUCCESS`) and folder markers.

Each object's identity is its ETag with its size; its `uri` (ledger, messages) is
`s3://bucket/key`, its `location` the HTTP URL the engine reads. Endpoint, region and
credentials: see aws.py (resolved once by the caller, in `SourceContext.s3`); they
appear in no SQL text.
"""

from __future__ import annotations

import builtins
import datetime as dt
import http.client
import re
import ssl
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

from chload.errors import (
    ChloadError,
    NothingMatched,
    SourceError,
    TransientError,
    UsageError,
    VanishedFile,
)
from chload.formats import LINE_FORMATS, detect, magic
from chload.runtime.retry import RetryPolicy, retry
from chload.schema import quote_str
from chload.sources.base import RemoteSource, Source, SourceContext, SourceFile
from chload.sources.files import aws
from chload.sources.files.patterns import brace_list, expand_braces, glob_regex

_GLOB = re.compile(r"[*?\[]")
_HIDDEN = (".", "_")
PAGE_SIZE = 1000
SNIFF_BYTES = 6  # enough for every compression's magic (formats.MAGIC)
SNIFF_PARALLEL = 16
OBJECT_CHUNK = 1 << 20  # bytes per chunk of an object streamed as stored (object_bytes)
KINDS = {"s3": "s3", "gs": "gcs"}  # URI scheme -> SourceFile.kind (gcs.py lists gs://)
RETRY = RetryPolicy(attempts=3, base_seconds=0.5, jitter=False)  # 0.5 s, then 1 s


@dataclass(frozen=True, slots=True)
class S3Object:
    key: str
    size: int
    etag: str
    modified_ns: int


def parse_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key/pattern` (or gs://) -> (bucket, key pattern)."""
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.\-_]{1,254}", bucket):
        raise UsageError(f"{uri}: write these sources as {scheme}://bucket/prefix/pattern "
                         "(bucket names are 3+ lowercase letters, digits, '.', '-')")
    return bucket, key


def list_s3(pattern: str, fmt: str | None, compression: str | None,
            config: aws.S3Settings, after: Callable[[str], str] | None = None,
            calls: Calls | None = None) -> Iterator[SourceFile]:
    """Every object the pattern names, in key order, each with its identity, page by
    page as the listing comes (a page of PAGE_SIZE keys at a time in memory).
    `config`: endpoint, region and credentials, resolved once by the caller (aws.py).
    `after` (--after-last-key): the greatest uri loaded under a prefix, '' if none; each
    prefix is listed from after it (StartAfter), and finding nothing new is no error.
    `calls` counts the ListObjectsV2 requests. Text objects whose names show no
    compression are sniffed later, for those the plan loads (`described`)."""
    bucket, key_pattern = parse_uri(pattern)
    lister = Lister(config, calls=calls)  # its config follows a bucket's region redirect
    found = 0
    for obj in find_objects(lister, bucket, key_pattern, after, config.scheme):
        found += 1
        yield describe(config, bucket, obj, fmt, compression)
    if not found and after is None:
        what = "no object matches" if _GLOB.search(key_pattern) or "{" in key_pattern else \
            "no such object, nor objects under it"
        raise NothingMatched(f"{pattern}: {what} at {config.endpoint}; check the bucket, key "
                             f"and pattern (or the endpoint: {config.endpoint_hint})")


def described(files: Sequence[SourceFile], compression: str | None,
              config: aws.S3Settings | None) -> list[SourceFile]:
    """The objects the plan loads, sniffed (`sniffed`) unless --compression said how."""
    if compression is not None or config is None or not files:
        return list(files)
    by_bucket: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        by_bucket.setdefault(parse_uri(f.uri)[0], []).append(i)
    out = list(files)
    for bucket, indexes in by_bucket.items():
        for i, f in zip(indexes, sniffed(Lister(config), bucket, [files[i] for i in indexes]),
                        strict=True):
            out[i] = f
    return out


def sniffed(lister: Lister, bucket: str, files: list[SourceFile]) -> list[SourceFile]:
    """Text objects whose names show no compression, with the one their first bytes
    show (a gzip export saved as `trips.csv`, as local.py does for files): the engine
    would otherwise read gzip bytes as text and make a column of them. The first such
    object is asked (6 bytes, one ranged GET); only if it is compressed are the others
    (SNIFF_PARALLEL at once, a connection each), so plain text costs one request."""
    plain = [i for i, f in enumerate(files) if f.format.compression == "none"
             and f.format.name in LINE_FORMATS and f.size > 0]
    if not plain or magic(lister.head(bucket, parse_uri(files[plain[0]].uri)[1])) == "none":
        return files

    def method(i: int) -> str:
        return magic(Lister(lister.config).head(bucket, parse_uri(files[i].uri)[1]))

    with ThreadPoolExecutor(min(SNIFF_PARALLEL, len(plain)),
                            thread_name_prefix="chload-sniff") as pool:
        methods = list(pool.map(method, plain))
    out = list(files)
    for i, m in zip(plain, methods, strict=True):
        out[i] = replace(files[i], format=replace(files[i].format, compression=m))
    return out


def find_objects(lister: Lister, bucket: str, key_pattern: str,
                 after: Callable[[str], str] | None = None,
                 scheme: str = "s3") -> Iterator[S3Object]:
    """List the pattern's prefixes once each (from after the last key loaded under
    each, with `after`); yield the keys that match it. The prefixes are sorted and none
    begins another, and a listing comes in key order: the keys come sorted, each once."""
    patterns = sorted(set(expand_braces(key_pattern)))
    matchers = [KeyMatcher(p) for p in patterns]
    for prefix in listing_prefixes(patterns):
        start = ""
        if after is not None:
            root = f"{scheme}://{bucket}/"
            start = after(f"{root}{prefix}").removeprefix(root)
        for obj in lister.list(bucket, prefix, start):
            if any(m.matches(obj.key) for m in matchers):
                yield obj


def literal_prefix(pattern: str) -> str:
    match = _GLOB.search(pattern)
    return pattern[: match.start()] if match else pattern


def listing_prefixes(patterns: Sequence[str]) -> list[str]:
    """The fewest prefixes to list: one per directory for patterns sharing it.

    `part-{000..099}.csv` (100 exact keys in one directory) is one listing of
    `dir/part-`, not 100 requests; `{a,b}/x.csv` is two listings, not the whole bucket.
    """
    by_dir: dict[str, list[str]] = {}
    for p in patterns:
        prefix = literal_prefix(p)
        by_dir.setdefault(prefix.rsplit("/", 1)[0] if "/" in prefix else "", []).append(prefix)
    chosen = sorted(_common_prefix(group) for group in by_dir.values())
    return [p for i, p in enumerate(chosen) if not any(p.startswith(q) for q in chosen[:i])]


def _common_prefix(items: Sequence[str]) -> str:
    first, last = min(items), max(items)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


class KeyMatcher:
    """Does a key match one (brace-free) pattern? Exact key, directory, or glob."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.regex = re.compile(glob_regex(pattern, across=True)) if _GLOB.search(pattern) else None

    def matches(self, key: str) -> bool:
        if key.endswith("/"):  # a folder marker, not data
            return False
        if self.regex is not None:
            return self.regex.fullmatch(key) is not None and not self._hidden(key)
        if key == self.pattern:
            return True
        directory = self.pattern.rstrip("/") + "/" if self.pattern else ""
        if not key.startswith(directory):
            return False
        return not any(part.startswith(_HIDDEN) for part in key[len(directory):].split("/"))

    def _hidden(self, key: str) -> bool:
        """A glob skips what Spark and Hadoop write next to their data and never read as
        data (`_SUCCESS`, `_committed_*`, `_temporary/`, `.part-0.crc`), as the directory
        form does, unless the pattern names such a name itself (`_*`, `.x`)."""
        named = {seg[0] for seg in self.pattern.split("/") if seg.startswith(_HIDDEN)}
        return any(part.startswith(_HIDDEN) and part[0] not in named
                   for part in key.split("/"))


def describe(config: aws.S3Settings, bucket: str, obj: S3Object, fmt: str | None,
             compression: str | None) -> SourceFile:
    return SourceFile(
        uri=f"{config.scheme}://{bucket}/{obj.key}", size=obj.size, mtime_ns=obj.modified_ns,
        format=detect(obj.key, fmt, compression, strict=False),
        etag=f"{obj.etag}:{obj.size}", kind=KINDS[config.scheme],
        location=config.object_url(bucket, obj.key), anonymous=config.anonymous,
    )


def table_function(file: SourceFile, fmt: str, structure: str | None) -> str:
    """`s3('http://endpoint/bucket/key', [NOSIGN,] 'Format', 'structure', 'compression')`.

    No keys in the SQL: the engine takes them from the process environment (aws.py).
    """
    args = [quote_str(file.location or file.uri)]
    if file.anonymous:
        args.append("NOSIGN")
    args += [quote_str(a) for a in (fmt, structure or "auto", file.format.compression)]
    return f"{'gcs' if file.kind == 'gcs' else 's3'}({', '.join(args)})"


def table_function_many(files: Sequence[SourceFile], fmt: str,
                        structure: str | None) -> tuple[str, str] | None:
    """One s3() over a `{a,b,c}` list of one bucket's objects; rows' uri from `_path`."""
    if len({parse_uri(f.uri)[0] for f in files}) != 1:
        return None  # the engine takes no list in the bucket name
    listed = brace_list(files)
    if listed is None:
        return None
    one = SourceFile(files[0].uri, 0, 0, files[0].format, kind=files[0].kind,
                     location=listed, anonymous=files[0].anonymous)
    scheme = files[0].uri.split("://", 1)[0]
    return table_function(one, fmt, structure), f"concat('{scheme}://', _path)"


class Calls:
    """Requests made to list, counted (a run's S3Source: LoadReport.listing_calls)."""

    def __init__(self) -> None:
        self.count = 0
        self._guard = threading.Lock()

    def add(self) -> None:
        with self._guard:
            self.count += 1


class Lister:
    """ListObjectsV2 over one keep-alive connection, signed with SigV4 (aws.py)."""

    def __init__(self, config: aws.S3Settings, timeout: float = 30.0,
                 calls: Calls | None = None) -> None:
        self.config = config
        self.calls = calls or Calls()
        self.ca_bundle = config.ca_bundle
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._host = ""

    def list(self, bucket: str, prefix: str, start_after: str = "") -> Iterator[S3Object]:
        """The keys under `prefix` (after `start_after`, if given), page by page."""
        token = ""
        while True:
            params = {"list-type": "2", "prefix": prefix, "max-keys": str(PAGE_SIZE)}
            if token:
                params["continuation-token"] = token
            elif start_after:
                params["start-after"] = start_after
            root = self._get(bucket, prefix, params)
            yield from parse_listing(root)
            token = _text(root, "NextContinuationToken")
            if _text(root, "IsTruncated") != "true" or not token:
                return

    def _get(self, bucket: str, prefix: str, params: dict[str, str]) -> ElementTree.Element:
        """One page of the listing, asked again (RETRY) after a network error or a 5xx."""
        url = f"{self.config.bucket_url(bucket)}/?{aws.canonical_query(params)}"
        where = f"{self.config.scheme}://{bucket}/{prefix}"
        status, headers, body = retry(lambda: self._exchange(url, where), RETRY,
                                      again_if=lambda answer: answer[0] >= 500)
        if status == 200:
            return ElementTree.fromstring(body)
        region = headers.get("x-amz-bucket-region")
        if region and region != self.config.region and status in (301, 400):
            self.config = replace(self.config, endpoint=self.config.endpoint.replace(
                self.config.region, region), region=region)
            return self._get(bucket, prefix, params)
        raise listing_error(where, self.config, status, body)

    def head(self, bucket: str, key: str, limit: int = SNIFF_BYTES) -> bytes:
        """The object's first bytes (`limit`); b"" if it cannot be read now (the
        engine says why when it reads it)."""
        # every reserved character escaped, as SigV4's canonical path has it
        url = f"{self.config.bucket_url(bucket)}/{quote(key, safe='/~-._')}"
        try:
            status, _, body = self._request(url, {"range": f"bytes=0-{limit - 1}"})
        except (OSError, http.client.HTTPException):
            self._close()
            return b""
        return body[:limit] if status in (200, 206) else b""

    def _exchange(self, url: str, where: str) -> tuple[int, dict[str, str], bytes]:
        """One listing request; a network failure is a TransientError (the connection
        closed)."""
        self.calls.add()
        try:
            return self._request(url)
        except (OSError, http.client.HTTPException) as exc:
            self._close()
            raise TransientError(
                f"{where}: cannot reach {self.config.endpoint} ({_reason(exc)}); "
                f"check {self.config.endpoint_hint}") from None

    def _request(self, url: str, extra: dict[str, str] | None = None,
                 ) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(url)
        if self._conn is None or self._host != parts.netloc:
            self._close()
            self._conn = _connect(parts.scheme, parts.netloc, self.timeout, self.ca_bundle)
            self._host = parts.netloc
        headers = aws.sign("GET", url, self.config.region, self.config.credentials)
        path = f"{parts.path or '/'}?{parts.query}" if parts.query else parts.path or "/"
        self._conn.request("GET", path, headers={**headers, **(extra or {})})
        response = self._conn.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


def object_bytes(config: aws.S3Settings, file: SourceFile, timeout: float = 60.0,
                 ) -> Iterator[bytes]:
    """The object's bytes as stored, in chunks as they come (one signed GET on a
    connection of its own), only if it is still the object listed: `If-Match` its
    ETag, so a rewritten object fails (SourceError) rather than load under the
    identity of the one listed. A network error is a TransientError (the load of the
    unit is tried again from its start); a missing object, VanishedFile."""
    bucket, key = parse_uri(file.uri)
    url = f"{config.bucket_url(bucket)}/{quote(key, safe='/~-._')}"
    parts = urlsplit(url)
    conn = _connect(parts.scheme, parts.netloc, timeout, config.ca_bundle)
    headers = aws.sign("GET", url, config.region, None if file.anonymous else config.credentials)
    etag = file.etag.rsplit(":", 1)[0]
    if etag:
        headers["if-match"] = f'"{etag}"'
    try:
        try:
            conn.request("GET", parts.path, headers=headers)
            response = conn.getresponse()
            if response.status != 200:
                raise _read_error(file, config, response.status, response.read())
            while chunk := response.read(OBJECT_CHUNK):
                yield chunk
        except (OSError, http.client.HTTPException) as exc:
            raise TransientError(f"{file.uri}: reading it from {config.endpoint} failed "
                                 f"({_reason(exc)}); it is read again") from None
    finally:
        conn.close()


def _connect(scheme: str, netloc: str, timeout: float,
             ca_bundle: str | None) -> http.client.HTTPConnection:
    if scheme == "https":  # AWS_CA_BUNDLE as the AWS tools honour it
        return http.client.HTTPSConnection(netloc, timeout=timeout,
                                           context=ssl.create_default_context(cafile=ca_bundle))
    return http.client.HTTPConnection(netloc, timeout=timeout)


def _read_error(file: SourceFile, config: aws.S3Settings, status: int, body: bytes,
                ) -> ChloadError:
    if status == 412:
        return SourceError(f"{file.uri}: changed since it was listed (its ETag is not the "
                           "one listed); nothing of it was loaded: run again")
    if status == 404:
        return VanishedFile(f"{file.uri}: gone since it was listed; nothing of it was "
                            "loaded: run again to load what is there now")
    if status >= 500:
        return TransientError(f"{file.uri}: {config.endpoint} answered HTTP {status}; it "
                              "is read again")
    if status in (401, 403):
        return listing_error(file.uri, config, status, body)
    return SourceError(f"{file.uri}: reading it failed at {config.endpoint} (HTTP {status})")


def parse_listing(root: ElementTree.Element) -> Iterator[S3Object]:
    for item in root:
        if _local(item.tag) != "Contents":
            continue
        fields = {_local(child.tag): (child.text or "") for child in item}
        yield S3Object(fields["Key"], int(fields.get("Size") or 0),
                       fields.get("ETag", "").strip('"'), _parse_time(fields.get("LastModified")))


def listing_error(where: str, config: aws.S3Settings, status: int, body: bytes) -> SourceError:
    """One line for an S3 error answer; the server's message text is not echoed."""
    code = ""
    try:
        code = _text(ElementTree.fromstring(body), "Code")
    except ElementTree.ParseError:
        pass
    who = (f"credentials from {config.credentials.source}" if config.credentials
           else "no credentials (anonymous)")
    if code == "NoSuchBucket" or (status == 404 and not code):
        return SourceError(f"{where}: no such bucket at {config.endpoint}; check the name "
                           f"and the endpoint ({config.endpoint_hint})")
    if status in (401, 403):
        return SourceError(
            f"{where}: access denied ({code or status}) with {who}; check "
            f"{config.keys_hint}, and the bucket policy")
    return SourceError(f"{where}: listing failed at {config.endpoint} "
                       f"(HTTP {status}{', ' + code if code else ''})")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _text(root: ElementTree.Element, name: str) -> str:
    for child in root:
        if _local(child.tag) == name:
            return child.text or ""
    return ""


def _parse_time(value: str | None) -> int:
    if not value:
        return 0
    stamp = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return int(stamp.timestamp()) * 10**9 + stamp.microsecond * 1000


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or type(exc).__name__


class S3Source(RemoteSource):
    """s3://bucket/prefix/pattern: listed here (ListObjectsV2), read by the engine's s3()."""

    kind = "s3"
    schemes: tuple[str, ...] = ("s3",)
    options: tuple[str, ...] = ("after_last_key", "follow", "poll")

    def __init__(self) -> None:
        self.calls = Calls()

    def open(self) -> Source:
        return type(self)()  # (this run's count of listing requests)

    def settings(self, context: SourceContext) -> aws.S3Settings | None:
        """The run's settings for this kind (gcs.py: the context's `gcs`)."""
        return context.s3

    def list(self, pattern: str, context: SourceContext) -> Iterator[SourceFile]:
        settings = self.settings(context)
        if settings is None:
            raise UsageError(f"{pattern}: listing needs its settings (SourceContext."
                             f"{self.kind}: resolved by the API)")
        return list_s3(pattern, context.format, context.compression, settings,
                       context.last_loaded, self.calls)

    def listing_calls(self) -> int:
        return self.calls.count

    def described(self, files: Sequence[SourceFile],
                  context: SourceContext) -> builtins.list[SourceFile]:
        return described(files, context.compression, self.settings(context))

    def start(self, file: SourceFile, limit: int, context: SourceContext) -> bytes | None:
        """One ranged GET, on a connection of its own (headers are read eight at a
        time, sniffed's way)."""
        settings = self.settings(context)
        if settings is None:
            return None
        lister = Lister(settings)
        try:
            return lister.head(*parse_uri(file.uri), limit) or None
        finally:
            lister._close()

    def stream(self, file: SourceFile, context: SourceContext,
               ) -> Callable[[], Iterator[bytes]] | None:
        settings = self.settings(context)
        if settings is None:
            return None
        return partial(object_bytes, settings, file)

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        return table_function(file, fmt, structure)

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        return table_function_many(files, fmt, structure)


SOURCE = S3Source()
