"""HTTP(S) URLs: `https://host/data/part-{000..099}.parquet`, read by the engine's url().

HTTP has no listing, so a source names its URLs: `{a,b}` and `{000..099}` are
expanded here, and each URL gets one HEAD (16 at a time) for its identity: the
ETag with the length when the server sends one, else Content-Length and
Last-Modified. A server that refuses HEAD gets a GET whose body is not read.
A URL that answers 404 is a one-line error naming it, before anything loads.

`user:password@` in a URL, and query parameters that carry a secret (`redact`), are
kept out of the `uri` (ledger, messages, history); the engine gets the URL as written,
in `location`, except `user:password@`, which it gets as a Basic Authorization header.
Untidy servers (redirects, no extension, gzip bodies): docs/sources-files.md.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from urllib.parse import unquote, urlsplit, urlunsplit

from chload.errors import SourceError, TransientError, UsageError, keep_secret
from chload.formats import LINE_FORMATS, detect, magic
from chload.runtime.retry import RetryPolicy, retry
from chload.schema import quote_str
from chload.sources.base import RemoteSource, SourceContext, SourceFile
from chload.sources.files.patterns import expand_braces

Head = Callable[[str], tuple[int, Mapping[str, str]]]  # url -> (status, headers)
PARALLEL = 16
RETRY = RetryPolicy(attempts=3, base_seconds=0.5, jitter=False)  # 0.5 s, then 1 s
TIMEOUT = 30.0
_NOT_FOUND = {404, 410}
# a query parameter whose value is a secret: `name=` kept, the value masked
_SECRET_PARAM = re.compile(r"((?:^|&)[^=&]*(?:signature|token|secret|password|passwd|"
                           r"credential|key|sig)=)[^&]*", re.IGNORECASE)
FINAL = ":url"  # in a HEAD's headers: the URL it was redirected to, if it was
SNIFF_BYTES = 6  # enough for every compression's magic (formats.MAGIC)
# Content-Type -> a name whose extension tells the format (a URL without one)
CONTENT_TYPES = {"text/csv": "x.csv", "application/csv": "x.csv",
                 "text/tab-separated-values": "x.tsv", "application/json": "x.json",
                 "application/x-ndjson": "x.ndjson", "application/jsonl": "x.jsonl",
                 "application/vnd.apache.parquet": "x.parquet",
                 "application/x-parquet": "x.parquet", "application/avro": "x.avro"}


def list_http(pattern: str, fmt: str | None, compression: str | None,
              head: Head | None = None) -> list[SourceFile]:
    """Every URL the pattern expands to, in order, each with its identity."""
    if "*" in urlsplit(pattern).path:
        raise UsageError(f"{redact(pattern)}: HTTP cannot list a directory, so '*' cannot "
                         "match; name the URLs, e.g. part-{000..099}.csv.gz")
    urls = list(dict.fromkeys(expand_braces(pattern)))
    fetch = head or head_request
    with ThreadPoolExecutor(min(PARALLEL, len(urls)), thread_name_prefix="chload-head") as pool:
        answers = list(pool.map(lambda u: _identify(u, fetch), urls))
    files = [describe(url, headers, fmt, compression) for url, headers in zip(urls, answers,
                                                                               strict=True)]
    return files if compression is not None else sniffed(files)


def sniffed(files: list[SourceFile], first: Callable[[str], bytes] | None = None,
            ) -> list[SourceFile]:
    """Text URLs whose names show no compression, with the one their first bytes show
    (a gzip body served as `trips.csv`: the engine would read its bytes as text). The
    first is asked; only if it is compressed are the others (s3.sniffed's rule)."""
    read = first or first_bytes
    plain = [i for i, f in enumerate(files) if f.format.compression == "none"
             and f.format.name in LINE_FORMATS]
    out = list(files)
    for n, i in enumerate(plain):
        method = magic(read(files[i].location or files[i].uri))
        if method == "none" and n == 0:
            break
        out[i] = replace(files[i], format=replace(files[i].format, compression=method))
    return out


def first_bytes(url: str) -> bytes:
    """The body's first bytes (a ranged GET; a server ignoring the range is left
    unread after them); b"" if it cannot be read now (the engine says why later)."""
    plain, auth = _basic_auth(url)
    request = urllib.request.Request(plain, headers={"User-Agent": "chload", **auth,
                                                    "Range": f"bytes=0-{SNIFF_BYTES - 1}"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return bytes(response.read(SNIFF_BYTES))
    except (OSError, ValueError, http.client.HTTPException):
        return b""


def _identify(url: str, head: Head) -> Mapping[str, str]:
    """A URL's headers, asked again (RETRY) after a network error or a 5xx."""
    status, headers = retry(lambda: head(url), RETRY, again_if=lambda answer: answer[0] >= 500)
    if status < 300:
        return headers
    if status in _NOT_FOUND:
        raise SourceError(f"{redact(url)}: not found (HTTP {status}); check the URL")
    if status in (401, 403):
        raise SourceError(f"{redact(url)}: access denied (HTTP {status}); check the "
                          "credentials in the URL, or whether its signature has expired")
    if status >= 500:
        raise SourceError(f"{redact(url)}: the server answered HTTP {status} (asked "
                          f"{RETRY.attempts} times); try again later")
    raise SourceError(f"{redact(url)}: the server answered HTTP {status}; check the URL")


def head_request(url: str) -> tuple[int, Mapping[str, str]]:
    """HEAD (or, if refused, a GET left unread): status and lower-cased headers."""
    status, headers = _open(url, "HEAD")
    if status in (405, 501):
        status, headers = _open(url, "GET")
    return status, headers


def _open(url: str, method: str) -> tuple[int, Mapping[str, str]]:
    """One request; `user:password@` as Basic auth (urllib cannot take it in the URL:
    such a URL was "cannot reach the server"). FINAL: where redirects ended, if any."""
    plain, auth = _basic_auth(url)
    request = urllib.request.Request(plain, method=method,
                                     headers={"User-Agent": "chload", **auth})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            headers = {k.lower(): v for k, v in response.headers.items()}
            moved = {FINAL: response.url} if response.url != plain else {}
            return response.status, {**headers, **moved}
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code, {}
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        text = getattr(reason, "strerror", None) or type(reason).__name__
        raise TransientError(f"{redact(url)}: cannot reach the server ({text})") from None
    except ValueError as exc:  # urllib: unknown url type, bad port
        raise UsageError(f"{redact(url)}: not a valid URL") from exc


def _basic_auth(url: str) -> tuple[str, dict[str, str]]:
    """The URL without `user:password@`, and the Authorization header it stood for."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, {}
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    plain = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return plain, {"Authorization": "Basic " + base64.b64encode(pair).decode()}


def describe(url: str, headers: Mapping[str, str], fmt: str | None,
             compression: str | None) -> SourceFile:
    """The URL as a source. The engine's url() follows no redirect, so it is given the
    URL the HEAD ended at; the ledger keeps the URL as written. A name that tells no
    format (`/export?id=3`) is helped by the redirect's, the Content-Disposition
    filename, then the Content-Type; a gzip Content-Encoding is the compression."""
    size = _int(headers.get("content-length"))
    etag = headers.get("etag", "")
    final = headers.get(FINAL) or url
    kind = headers.get("content-type", "none").split(";")[0].strip().lower()
    if kind == "text/html" and not fmt:  # a GitHub `blob/` page of a .csv, a login page
        raise UsageError(f"{redact(url)}: the server sends a web page (Content-Type "
                         "text/html), not data; use the file's raw or download URL (or "
                         "pass --format if it is data after all)")
    told = detect(_name(url, final, headers), fmt, compression, strict=False)
    if not told.name:
        raise UsageError(f"{redact(url)}: cannot tell the format from the URL nor its "
                         f"Content-Type ({kind}); pass --format (e.g. --format CSVWithNames)")
    if told.compression == "none" and compression is None and \
            headers.get("content-encoding", "").lower() in ("gzip", "x-gzip"):
        told = replace(told, compression="gzip")
    return SourceFile(
        uri=redact(url), size=size, mtime_ns=_mtime_ns(headers.get("last-modified")),
        format=told, etag=f"{etag}:{size}" if etag else "", kind="http", location=final,
    )


def _name(url: str, final: str, headers: Mapping[str, str]) -> str:
    """The name a URL's format is told by: its path's, else the first of the redirect's
    path, the Content-Disposition filename and the Content-Type that tells one."""
    names = [urlsplit(url).path, urlsplit(final).path]
    disposition = re.search(r'filename\*?=(?:UTF-8\'\')?"?([^";]+)',
                            headers.get("content-disposition", ""))
    if disposition:
        names.append(unquote(disposition.group(1)))
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    names.append(CONTENT_TYPES.get(kind, ""))
    return next((n for n in names if detect(n, None, None, strict=False).name), names[0])


def redact(url: str) -> str:
    """The URL without `user:password@`, and with the values of query parameters that
    carry a secret masked (a presigned S3 URL's X-Amz-Signature, a SAS `sig`, a
    `token=`): the uri in the ledger, messages and the run history. The engine gets
    the URL as written; a URL presigned anew is then the same uri, loaded once. The
    engine's own messages quote that URL: its secrets are kept (errors.keep_secret) for
    every message made of them to mask."""
    parts = urlsplit(url)
    for found in _SECRET_PARAM.finditer(parts.query):
        value = parts.query[found.end(1):found.end()]
        keep_secret(value)
        keep_secret(unquote(value))
    if parts.password:
        keep_secret(parts.password)
    if "@" in parts.netloc:
        parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
    if parts.query:
        parts = parts._replace(query=_SECRET_PARAM.sub(r"\1***", parts.query))
    return urlunsplit(parts)


def _int(value: str | None) -> int:
    return int(value) if value and value.strip().isdigit() else 0


def _mtime_ns(value: str | None) -> int:
    if not value:
        return 0
    try:
        return int(email.utils.parsedate_to_datetime(value).timestamp()) * 10**9
    except (TypeError, ValueError):
        return 0


def table_function(file: SourceFile, fmt: str, structure: str | None) -> str:
    """`url('https://...', 'Format', 'structure', 'compression'[, headers(...)])`.
    `user:password@` goes as an Authorization header: the engine sends none for it
    (HTTP 401), and its error messages quote the URL, which then holds no password."""
    plain, auth = _basic_auth(file.location or file.uri)
    args = [quote_str(a) for a in (plain, fmt, structure or "auto", file.format.compression)]
    if auth:
        args.append(f"headers('Authorization'={quote_str(auth['Authorization'])})")
    return f"url({', '.join(args)})"



class HttpSource(RemoteSource):
    """http(s):// URLs, named (HTTP cannot list), read by the engine's url()."""

    kind = "http"
    schemes: tuple[str, ...] = ("http", "https")

    def list(self, pattern: str, context: SourceContext) -> list[SourceFile]:
        return list_http(pattern, context.format, context.compression)

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        return table_function(file, fmt, structure)

    def display(self, pattern: str) -> str:
        return redact(pattern)


SOURCE = HttpSource()
