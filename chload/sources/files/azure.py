"""Azure Blob Storage: `az://container/prefix/glob`, listed by prefix, read by azureBlobStorage().

The same file features as S3 (s3.py): one paginated List Blobs request per distinct
literal prefix (5,000 names a page), the glob matched here on the names, in s3.py's
dialect (its `KeyMatcher` and `listing_prefixes`); a name without glob characters is
one blob or every blob under `name/`. `azure://container/...` and ADLS Gen2's
`abfs[s]://container@account.dfs.core.windows.net/...` name the same blobs.

Each blob's identity is its ETag with its size; its `uri` (ledger, messages) is
`az://container/name`. Listing is signed here (Shared Key, or a SAS token appended):
the REST API is three headers and one HMAC, and the SDK would bring azure-core and its
HTTP stack to a process whose reads the engine does.

Settings are resolved once (`resolve`, by the API at the top of a run) from the
environment the Azure tools read: `AZURE_STORAGE_CONNECTION_STRING`, else
`AZURE_STORAGE_ACCOUNT` with `AZURE_STORAGE_KEY` or `AZURE_STORAGE_SAS_TOKEN`. The
engine takes the account key only as an argument of azureBlobStorage() (it reads no
environment), so the SQL that reads carries it: that text is made only inside
`hand_to_engine`, while the engine reads, and is never a message, a ledger row or a
log line of chload's (the key is also given to errors.keep_secret, so a message of
the engine quoting it shows `***`). Azure lists no "start after" key: with
--after-last-key, the names up to the last loaded are passed over as they are listed.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import email.utils
import hashlib
import hmac
import http.client
import re
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

from chload.errors import NothingMatched, SourceError, TransientError, UsageError, keep_secret
from chload.formats import LINE_FORMATS, detect, magic
from chload.runtime.retry import RetryPolicy, retry
from chload.schema import quote_str
from chload.sources.base import RemoteSource, Source, SourceContext, SourceFile
from chload.sources.files import s3
from chload.sources.files.patterns import brace_list, expand_braces

PAGE_SIZE = 5000  # List Blobs' largest page
API_VERSION = "2021-12-02"
SNIFF_BYTES = s3.SNIFF_BYTES
RETRY = RetryPolicy(attempts=3, base_seconds=0.5, jitter=False)
_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_ABFS = re.compile(r"abfss?://([^@/]+)@([^./]+)\.(?:dfs|blob)\.[^/]+/?(.*)", re.IGNORECASE)
HINT = "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY"


@dataclass(frozen=True, slots=True)
class AzureSettings:
    """How to reach one storage account: its blob endpoint (no trailing /), its name,
    and a key or a SAS token (neither shown by repr); `source` names where they came
    from (for messages)."""

    endpoint: str
    account: str
    key: str = field(default="", repr=False)
    sas: str = field(default="", repr=False)
    source: str = "AZURE_STORAGE_CONNECTION_STRING"
    ca_bundle: str | None = None

    def connection_string(self) -> str:
        """The account as the engine's azureBlobStorage() takes it (secret: SQL only)."""
        scheme = self.endpoint.split("://", 1)[0]
        secret = f"AccountKey={self.key}" if self.key else f"SharedAccessSignature={self.sas}"
        return (f"DefaultEndpointsProtocol={scheme};AccountName={self.account};{secret};"
                f"BlobEndpoint={self.endpoint};")


def resolve(env: Mapping[str, str]) -> AzureSettings:
    """The account, endpoint and key by the Azure tools' variables (module docstring):
    the one place Azure settings are read from the environment."""
    text = env.get("AZURE_STORAGE_CONNECTION_STRING", "").strip()
    if text:
        settings = from_connection_string(text)
    else:
        account = env.get("AZURE_STORAGE_ACCOUNT") or env.get("AZURE_STORAGE_ACCOUNT_NAME", "")
        key = env.get("AZURE_STORAGE_KEY") or env.get("AZURE_STORAGE_ACCOUNT_KEY", "")
        sas = env.get("AZURE_STORAGE_SAS_TOKEN", "").lstrip("?")
        if not account or not (key or sas):
            raise UsageError(f"az://: no Azure credentials; set {HINT} "
                             "(or AZURE_STORAGE_SAS_TOKEN)")
        settings = AzureSettings(f"https://{account}.blob.core.windows.net", account, key,
                                 sas, "AZURE_STORAGE_ACCOUNT")
    for secret in (settings.key, settings.sas, text):
        keep_secret(secret)
    return replace(settings, ca_bundle=env.get("REQUESTS_CA_BUNDLE") or None)


def from_connection_string(text: str) -> AzureSettings:
    """`AccountName=..;AccountKey=..[;BlobEndpoint=..|;EndpointSuffix=..]` (or a SAS)."""
    parts: dict[str, str] = {}
    for item in text.split(";"):
        name, sep, value = item.partition("=")
        if sep:
            parts[name.strip().lower()] = value.strip()
    account = parts.get("accountname", "")
    key, sas = parts.get("accountkey", ""), parts.get("sharedaccesssignature", "").lstrip("?")
    endpoint = parts.get("blobendpoint", "").rstrip("/")
    if not endpoint and account:
        scheme = parts.get("defaultendpointsprotocol", "https")
        endpoint = f"{scheme}://{account}.blob.{parts.get('endpointsuffix', 'core.windows.net')}"
    if not account and endpoint:  # a SAS connection string may name only the endpoint
        host = urlsplit(endpoint).hostname or ""
        account = host.split(".", 1)[0]
    if not endpoint or not account or not (key or sas) or "://" not in endpoint:
        raise UsageError("AZURE_STORAGE_CONNECTION_STRING: write it as Azure gives it "
                         "(AccountName=...;AccountKey=...;EndpointSuffix=... or BlobEndpoint=...)")
    return AzureSettings(endpoint, account, key, sas)


def parse_uri(uri: str) -> tuple[str, str]:
    """`az://container/name/pattern` (or azure://, abfs[s]://) -> (container, name pattern)."""
    abfs = _ABFS.fullmatch(uri)
    if abfs:
        container, key = abfs.group(1), abfs.group(3)
    else:
        container, _, key = uri.split("://", 1)[-1].partition("/")
    if not _CONTAINER.fullmatch(container):
        raise UsageError(f"{uri}: write Azure sources as az://container/prefix/pattern "
                         "(container names are 3-63 lowercase letters, digits and '-')")
    return container, key


@dataclass(frozen=True, slots=True)
class Blob:
    key: str
    size: int
    etag: str
    modified_ns: int


def list_azure(pattern: str, fmt: str | None, compression: str | None, config: AzureSettings,
               after: Callable[[str], str] | None = None,
               calls: s3.Calls | None = None) -> Iterator[SourceFile]:
    """Every blob the pattern names, in name order, each with its identity, page by page.
    `after` (--after-last-key): the greatest uri loaded under a prefix; names up to it
    are passed over, and finding nothing new is no error."""
    container, key_pattern = parse_uri(pattern)
    abfs = _ABFS.fullmatch(pattern)
    if abfs and abfs.group(2) != config.account:
        raise UsageError(f"{pattern}: names account {abfs.group(2)}, but {config.source} is "
                         f"for account {config.account}; set the credentials of that account")
    lister = Lister(config, calls=calls)
    found = 0
    patterns = sorted(set(expand_braces(key_pattern)))
    matchers = [s3.KeyMatcher(p) for p in patterns]
    for prefix in s3.listing_prefixes(patterns):
        start = after(f"az://{container}/{prefix}").removeprefix(f"az://{container}/") \
            if after is not None else ""
        for blob in lister.list(container, prefix):
            if (not start or blob.key > start) and any(m.matches(blob.key) for m in matchers):
                found += 1
                yield describe(container, blob, fmt, compression)
    if not found and after is None:
        what = "no blob matches" if s3._GLOB.search(key_pattern) or "{" in key_pattern else \
            "no such blob, nor blobs under it"
        raise NothingMatched(f"{pattern}: {what} at {config.endpoint}; check the container, "
                             f"name and pattern (or the account: {HINT})")


def describe(container: str, blob: Blob, fmt: str | None, compression: str | None) -> SourceFile:
    return SourceFile(uri=f"az://{container}/{blob.key}", size=blob.size,
                      mtime_ns=blob.modified_ns,
                      format=detect(blob.key, fmt, compression, strict=False),
                      etag=f"{blob.etag}:{blob.size}", kind="azure")


def described(files: Sequence[SourceFile], compression: str | None,
              config: AzureSettings | None) -> list[SourceFile]:
    """Text blobs whose names show no compression, with the one their first bytes show
    (s3.sniffed's rule: the first is asked; only if it is compressed are the others)."""
    plain = [i for i, f in enumerate(files) if f.format.compression == "none"
             and f.format.name in LINE_FORMATS and f.size > 0]
    if compression is not None or config is None or not plain:
        return list(files)
    lister = Lister(config)
    if magic(lister.head(*parse_uri(files[plain[0]].uri))) == "none":
        return list(files)
    out = list(files)
    for i in plain:
        method = magic(lister.head(*parse_uri(files[i].uri)))
        out[i] = replace(files[i], format=replace(files[i].format, compression=method))
    return out


# ------------------------------------------------------------------ the engine's reads

_READING: list[AzureSettings] = []  # the settings handed to the engine (hand_to_engine)
_reading_guard = threading.Lock()


@contextlib.contextmanager
def hand_to_engine(config: AzureSettings | None) -> Iterator[None]:
    """Let `table_function` give the engine the account's key while the block runs (the
    engine reads, then the settings are forgotten); nothing if there are none."""
    if config is None:
        yield
        return
    with _reading_guard:
        _READING.append(config)
    try:
        yield
    finally:
        with _reading_guard:
            _READING.remove(config)


def _engine_account(uri: str) -> AzureSettings:
    with _reading_guard:
        if _READING:
            return _READING[-1]
    raise UsageError(f"{uri}: the engine reads Azure blobs only inside the run that listed "
                     "them (azure.hand_to_engine)")


def table_function(file: SourceFile, fmt: str, structure: str | None) -> str:
    """`azureBlobStorage('<connection string>', 'container', 'name', 'Format',
    'compression', 'structure')`: secret text, made for the engine only (docstring)."""
    container, key = parse_uri(file.location or file.uri)
    config = _engine_account(file.uri)
    args = [config.connection_string(), container, key, fmt, file.format.compression,
            structure or "auto"]
    return f"azureBlobStorage({', '.join(quote_str(a) for a in args)})"


def table_function_many(files: Sequence[SourceFile], fmt: str,
                        structure: str | None) -> tuple[str, str] | None:
    """One azureBlobStorage() over a `{a,b,c}` list of one container's blobs; rows' uri
    from `_path` (`container/name`)."""
    if len({parse_uri(f.uri)[0] for f in files}) != 1:
        return None
    listed = brace_list(files)
    if listed is None:
        return None
    one = SourceFile(files[0].uri, 0, 0, files[0].format, kind="azure", location=listed)
    return table_function(one, fmt, structure), "concat('az://', _path)"


# ------------------------------------------------------------------ listing

class Lister:
    """List Blobs (and a ranged GET to sniff) over one keep-alive connection."""

    def __init__(self, config: AzureSettings, timeout: float = 30.0,
                 calls: s3.Calls | None = None) -> None:
        self.config = config
        self.calls = calls or s3.Calls()
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def list(self, container: str, prefix: str) -> Iterator[Blob]:
        marker = ""
        while True:
            params = {"restype": "container", "comp": "list", "prefix": prefix,
                      "maxresults": str(PAGE_SIZE)}
            if marker:
                params["marker"] = marker
            root = self._page(container, prefix, params)
            yield from parse_listing(root)
            marker = _text(root, "NextMarker")
            if not marker:
                return

    def _page(self, container: str, prefix: str,
              params: dict[str, str]) -> ElementTree.Element:
        where = f"az://{container}/{prefix}"
        status, body = retry(lambda: self._exchange(container, params, where), RETRY,
                             again_if=lambda answer: answer[0] >= 500)
        if status == 200:
            return ElementTree.fromstring(body)
        raise listing_error(where, self.config, status, body)

    def head(self, container: str, key: str) -> bytes:
        """The blob's first bytes (SNIFF_BYTES); b"" if it cannot be read now."""
        try:
            status, body = self._request(f"/{container}/{quote(key, safe='/~-._')}", {},
                                         {"x-ms-range": f"bytes=0-{SNIFF_BYTES - 1}"})
        except (OSError, http.client.HTTPException):
            self._close()
            return b""
        return body[:SNIFF_BYTES] if status in (200, 206) else b""

    def _exchange(self, container: str, params: dict[str, str],
                  where: str) -> tuple[int, bytes]:
        self.calls.add()
        try:
            return self._request(f"/{container}", params)
        except (OSError, http.client.HTTPException) as exc:
            self._close()
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise TransientError(f"{where}: cannot reach {self.config.endpoint} ({reason}); "
                                 f"check the account's endpoint ({HINT})") from None

    def _request(self, path: str, params: dict[str, str],
                 extra: dict[str, str] | None = None) -> tuple[int, bytes]:
        base = urlsplit(self.config.endpoint)
        if self._conn is None:
            if base.scheme == "https":
                context = ssl.create_default_context(cafile=self.config.ca_bundle)
                self._conn = http.client.HTTPSConnection(base.netloc, timeout=self.timeout,
                                                         context=context)
            else:
                self._conn = http.client.HTTPConnection(base.netloc, timeout=self.timeout)
        full_path = base.path.rstrip("/") + path
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in sorted(params.items()))
        headers = {"x-ms-date": email.utils.formatdate(usegmt=True),
                   "x-ms-version": API_VERSION, **(extra or {})}
        if self.config.key:
            headers["authorization"] = sign(self.config, "GET", full_path, params, headers)
        elif self.config.sas:
            query = f"{query}&{self.config.sas}" if query else self.config.sas
        self._conn.request("GET", f"{full_path}?{query}" if query else full_path,
                           headers=headers)
        response = self._conn.getresponse()
        return response.status, response.read()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


def sign(config: AzureSettings, method: str, path: str, params: Mapping[str, str],
         headers: Mapping[str, str]) -> str:
    """The Authorization header of a Shared Key request without a body (`path`: the URL's
    path, as sent unescaped, e.g. `/devstoreaccount1/c` on an emulator)."""
    ms = "".join(f"{k.lower()}:{v.strip()}\n" for k, v in sorted(headers.items())
                 if k.lower().startswith("x-ms-"))
    resource = f"/{config.account}{path}" + "".join(
        f"\n{k.lower()}:{v}" for k, v in sorted(params.items()))
    standard = [method, "", "", "", "", "", "", "", "", "", "", headers.get("range", "")]
    to_sign = "\n".join(standard) + "\n" + ms + resource
    try:
        key = base64.b64decode(config.key, validate=True)
    except ValueError:
        raise UsageError(f"{config.source}: the account key is not base64; copy it again "
                         "from the storage account's access keys") from None
    digest = hmac.new(key, to_sign.encode(), hashlib.sha256).digest()
    return f"SharedKey {config.account}:{base64.b64encode(digest).decode()}"


def parse_listing(root: ElementTree.Element) -> Iterator[Blob]:
    blobs = next((c for c in root if c.tag == "Blobs"), None)
    for item in blobs if blobs is not None else ():
        if item.tag != "Blob":
            continue
        name = _text(item, "Name")
        props = next((c for c in item if c.tag == "Properties"), None)
        fields = {c.tag: c.text or "" for c in props} if props is not None else {}
        if fields.get("ResourceType") == "directory":  # a hierarchical namespace's folder
            continue
        yield Blob(name, int(fields.get("Content-Length") or 0),
                   fields.get("Etag", "").strip('"'), _parse_time(fields.get("Last-Modified")))


def listing_error(where: str, config: AzureSettings, status: int, body: bytes) -> SourceError:
    """One line for an error answer; the service's message text is not echoed."""
    code = ""
    with contextlib.suppress(ElementTree.ParseError):
        code = _text(ElementTree.fromstring(body), "Code")
    if code == "ContainerNotFound" or (status == 404 and not code):
        return SourceError(f"{where}: no such container in account {config.account} at "
                           f"{config.endpoint}; check the name and the account ({HINT})")
    if status in (401, 403):
        return SourceError(f"{where}: access denied ({code or status}) with the key from "
                           f"{config.source}; check {HINT}")
    return SourceError(f"{where}: listing failed at {config.endpoint} "
                       f"(HTTP {status}{', ' + code if code else ''})")


def _text(root: ElementTree.Element, name: str) -> str:
    child = next((c for c in root if c.tag == name), None)
    return (child.text or "") if child is not None else ""


def _parse_time(value: str | None) -> int:
    if not value:
        return 0
    with contextlib.suppress(TypeError, ValueError):
        return int(email.utils.parsedate_to_datetime(value).timestamp()) * 10**9
    return 0


class AzureSource(RemoteSource):
    """az://container/prefix/pattern: listed here (List Blobs), read by azureBlobStorage()."""

    kind = "azure"
    schemes: tuple[str, ...] = ("az", "azure", "abfs", "abfss")
    options: tuple[str, ...] = ("after_last_key", "follow", "poll")

    def __init__(self) -> None:
        self.calls = s3.Calls()

    def open(self) -> Source:
        return type(self)()

    def list(self, pattern: str, context: SourceContext) -> Iterator[SourceFile]:
        if context.azure is None:
            raise UsageError(f"{pattern}: listing Azure needs its settings (SourceContext."
                             "azure: azure.resolve)")
        return list_azure(pattern, context.format, context.compression, context.azure,
                          context.last_loaded, self.calls)

    def listing_calls(self) -> int:
        return self.calls.count

    def described(self, files: Sequence[SourceFile],
                  context: SourceContext) -> builtins.list[SourceFile]:
        return described(files, context.compression, context.azure)

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        return table_function(file, fmt, structure)

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        return table_function_many(files, fmt, structure)


SOURCE = AzureSource()
