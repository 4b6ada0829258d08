"""AWS conventions for S3 sources: endpoint, region and credentials; SigV4 signing.

Each setting is taken as the AWS CLI takes it, first match wins (docs/sources-files.md,
"Settings and credentials", lists the order); botocore is imported only for credential
sources that need it, and listing is signed here (docs/design.md says why not boto3).

Invariants: resolved once (`resolve`, by the API at the top of a run, into
`S3Settings`): nothing else under chload.sources reads the environment, AWS_CA_BUNDLE
included. Credentials are never in SQL (its text reaches messages and the engine's
logs): `hand_to_engine` puts them into the process environment, where chDB's S3 client
reads them, for the time the engine reads, and leaves it as it was. `Credentials` hides
its secrets from repr().
"""

from __future__ import annotations

import configparser
import contextlib
import datetime as dt
import hashlib
import hmac
import os
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from chload.errors import SourceError, UsageError

DEFAULT_REGION = "us-east-1"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_NEEDS_BOTOCORE = ("role_arn", "credential_process", "sso_session", "sso_start_url",
                   "web_identity_token_file")


@dataclass(frozen=True, slots=True)
class Credentials:
    """Keys for signing; `source` says where they came from (for messages)."""

    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    token: str = field(default="", repr=False)
    source: str = "environment"


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach S3: endpoint URL (no trailing /), region, credentials (None:
    anonymous), and the CA bundle for https (None: the system's)."""

    endpoint: str
    region: str
    credentials: Credentials | None
    custom_endpoint: bool  # True: path-style URLs on this endpoint (MinIO, Ceph, ...)
    ca_bundle: str | None = None  # AWS_CA_BUNDLE, as the AWS tools honour it
    scheme: str = "s3"  # the URI scheme of what it reaches: s3, or gs (gcs.py: GCS's
    # S3-interoperable API, with HMAC keys)

    @property
    def endpoint_hint(self) -> str:
        """Where the endpoint comes from, for messages."""
        return "GCS_ENDPOINT_URL" if self.scheme == "gs" else "--s3-endpoint, AWS_ENDPOINT_URL"

    @property
    def keys_hint(self) -> str:
        """Where the keys come from, for messages."""
        return ("GCS_ACCESS_KEY_ID/GCS_SECRET_ACCESS_KEY (an HMAC key)" if self.scheme == "gs"
                else "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE")

    @property
    def anonymous(self) -> bool:
        return self.credentials is None

    def bucket_url(self, bucket: str) -> str:
        """The URL of a bucket: path-style on custom endpoints and for dotted names."""
        if self.custom_endpoint or "." in bucket:
            return f"{self.endpoint}/{bucket}"
        scheme, _, host = self.endpoint.partition("://")
        return f"{scheme}://{bucket}.{host}"

    def object_url(self, bucket: str, key: str) -> str:
        """The HTTP URL of one object, as the engine's s3() takes it."""
        return f"{self.bucket_url(bucket)}/{quote(key, safe='/~!$&()+,;=:@-._')}"


S3Config = S3Settings  # the earlier name (s3.Lister's region redirect still says it)


def resolve(env: Mapping[str, str], endpoint_flag: str | None = None) -> S3Settings:
    """Endpoint, region and credentials by the AWS conventions (module docstring): the
    one place S3 settings are read from the environment, called once by the caller."""
    profile_name = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or ""
    profile = read_profile(env, profile_name or "default", required=bool(profile_name))
    region = (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or profile.get("region")
              or DEFAULT_REGION)
    named = [("--s3-endpoint", endpoint_flag or ""),
             ("AWS_ENDPOINT_URL_S3", env.get("AWS_ENDPOINT_URL_S3", "")),
             ("AWS_ENDPOINT_URL", env.get("AWS_ENDPOINT_URL", "")),
             (f"endpoint_url of profile {profile_name or 'default'}",
              profile.get("endpoint_url", ""))]
    source, endpoint = next(((n, v) for n, v in named if v), ("", ""))
    custom = bool(endpoint)
    endpoint = check_endpoint(endpoint, source) if custom else \
        f"https://s3.{region}.amazonaws.com"
    creds = _credentials(env, profile, profile_name or "default")
    return S3Settings(endpoint, region, creds, custom, env.get("AWS_CA_BUNDLE") or None)


def check_endpoint(value: str, source: str = "--s3-endpoint") -> str:
    """An endpoint must be http(s)://host[:port]; default ports are dropped (SigV4 Host)."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{source} {value}: write the S3 endpoint as http(s)://host[:port], "
                         "e.g. http://127.0.0.1:9000")
    netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    if parts.port and parts.port != default:
        netloc += f":{parts.port}"
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"


def read_profile(env: Mapping[str, str], name: str, required: bool) -> dict[str, str]:
    """A profile's settings: the credentials file's section over the config file's."""
    home = os.path.expanduser("~")
    creds_path = env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials")
    config_path = env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config")
    config_section = name if name == "default" else f"profile {name}"
    merged = {**_section(config_path, config_section), **_section(creds_path, name)}
    if not merged and name != "default":  # the config file also accepts [name]
        merged = _section(config_path, name)
    if required and not merged:
        raise UsageError(f"AWS_PROFILE {name}: no such profile in {creds_path} or "
                         f"{config_path}; check the name, or unset AWS_PROFILE")
    return merged


def _section(path: str, section: str) -> dict[str, str]:
    parser = configparser.RawConfigParser()
    try:
        parser.read(path)
    except (OSError, configparser.Error) as exc:
        raise UsageError(f"{path}: cannot read this AWS file ({type(exc).__name__})") from None
    return {k.lower(): v.strip() for k, v in parser.items(section)} if parser.has_section(
        section) else {}


def _credentials(env: Mapping[str, str], profile: dict[str, str],
                 name: str) -> Credentials | None:
    key, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
    if key and secret:
        return Credentials(key, secret, env.get("AWS_SESSION_TOKEN", ""), "environment")
    if profile.get("aws_access_key_id") and profile.get("aws_secret_access_key"):
        return Credentials(profile["aws_access_key_id"], profile["aws_secret_access_key"],
                           profile.get("aws_session_token", ""), f"profile {name}")
    if any(k in profile for k in _NEEDS_BOTOCORE) or _container_or_web_identity(env):
        return _botocore_credentials(name if profile else None)
    return None


def _container_or_web_identity(env: Mapping[str, str]) -> bool:
    return any(env.get(k) for k in ("AWS_WEB_IDENTITY_TOKEN_FILE",
                                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                    "AWS_CONTAINER_CREDENTIALS_FULL_URI"))


def _botocore_credentials(profile: str | None) -> Credentials:
    """Roles, SSO, credential_process, web identity: botocore's provider chain.

    The one boundary where botocore's exceptions become chload's (no message text of
    theirs is kept: it may quote configuration).
    """
    where = f"profile {profile}" if profile else "the AWS environment"
    try:
        import botocore.session  # lazy: a slow import, and only these credential sources need it
    except ImportError:
        raise UsageError(f"{where} needs botocore to get credentials: pip install boto3, "
                         "or export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") from None
    try:
        found = botocore.session.Session(profile=profile).get_credentials()
        frozen = found.get_frozen_credentials() if found is not None else None
    except Exception as exc:  # botocore raises many kinds; all mean "no credentials"
        raise SourceError(f"{where}: cannot get AWS credentials ({type(exc).__name__}); "
                          "check the profile, or log in again (aws sso login)") from None
    if frozen is None or not frozen.access_key:
        raise SourceError(f"{where}: botocore found no AWS credentials; check the profile")
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token or "",
                       f"{where} (via botocore)")


@contextlib.contextmanager
def hand_to_engine(creds: Credentials | None,
                   environ: MutableMapping[str, str]) -> Iterator[None]:
    """Make the engine's S3 client use `creds` while the block runs (it reads them from
    `environ`, the process environment: the caller passes os.environ explicitly).

    Credentials from the environment are there already, and anonymous reads use NOSIGN:
    `environ` is not touched. Others are set for the block only, in this process only
    (children are never started with them), and the earlier values put back after.
    Two blocks at once with different credentials would see each other's: a process
    loads from one set of S3 credentials at a time.
    """
    if creds is None or creds.source == "environment":
        yield
        return
    values = {"AWS_ACCESS_KEY_ID": creds.access_key, "AWS_SECRET_ACCESS_KEY": creds.secret_key,
              "AWS_SESSION_TOKEN": creds.token}
    before = {name: environ.get(name) for name in _ENV_KEYS}
    for name in _ENV_KEYS:
        _put(environ, name, values[name] or None)
    try:
        yield
    finally:
        for name in _ENV_KEYS:
            if environ.get(name) == (values[name] or None):  # unless changed meanwhile
                _put(environ, name, before[name])


def _put(environ: MutableMapping[str, str], name: str, value: str | None) -> None:
    if value:
        environ[name] = value
    else:
        environ.pop(name, None)


def sign(method: str, url: str, region: str, creds: Credentials | None,
         now: dt.datetime | None = None) -> dict[str, str]:
    """Headers for an S3 request signed with AWS Signature Version 4 (empty body).

    `url` must be already encoded the way it is sent; its query is signed in sorted
    order, so build it with `canonical_query`. Anonymous: only Host.
    """
    parts = urlsplit(url)
    headers = {"host": parts.netloc}
    if creds is None:
        return headers
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    headers.update({"x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": stamp})
    if creds.token:
        headers["x-amz-security-token"] = creds.token
    names = sorted(headers)
    canonical = "\n".join([
        method, parts.path or "/", parts.query,
        "".join(f"{n}:{headers[n].strip()}\n" for n in names), ";".join(names), EMPTY_SHA256,
    ])
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + creds.secret_key).encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}")
    return headers


def canonical_query(params: Mapping[str, str]) -> str:
    """A query string in SigV4's canonical form (sorted, RFC 3986 encoded)."""
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                    for k, v in sorted(params.items()))
