"""Google Cloud Storage: `gs://bucket/prefix/glob`, through its S3-interoperable XML API.

GCS answers ListObjectsV2 and SigV4 requests signed with an HMAC key (Cloud Storage >
Settings > Interoperability), so s3.py lists it and the engine reads it with gcs() (its
s3() under GCS's name): every file feature of S3 (globs, the directory form,
--after-last-key's StartAfter, batching, rejects, --follow) is S3's, with uris
`gs://bucket/key`. Settings come from the environment, resolved once (`resolve`):
`GCS_ACCESS_KEY_ID` and `GCS_SECRET_ACCESS_KEY` (the HMAC key; without them the bucket
is read anonymously), `GCS_ENDPOINT_URL` (default https://storage.googleapis.com; an
S3-interoperable endpoint for tests). The engine takes the key as it takes S3's (from
the process environment while it reads, aws.hand_to_engine): the key is never in SQL,
so a run reads gs:// or s3:// with keys, not both (registry.py refuses the mix).
"""

from __future__ import annotations

from collections.abc import Mapping

from chload.errors import keep_secret
from chload.sources.base import SourceContext
from chload.sources.files import aws
from chload.sources.files.s3 import S3Source

ENDPOINT = "https://storage.googleapis.com"
REGION = "auto"  # what GCS's interoperable API signs with


def resolve(env: Mapping[str, str]) -> aws.S3Settings:
    """Endpoint and HMAC key from the environment (module docstring)."""
    endpoint = env.get("GCS_ENDPOINT_URL", "")
    endpoint = aws.check_endpoint(endpoint, "GCS_ENDPOINT_URL") if endpoint else ENDPOINT
    key, secret = env.get("GCS_ACCESS_KEY_ID", ""), env.get("GCS_SECRET_ACCESS_KEY", "")
    creds = aws.Credentials(key, secret, "", "GCS_ACCESS_KEY_ID") if key and secret else None
    keep_secret(secret)
    return aws.S3Settings(endpoint, env.get("GCS_REGION") or REGION, creds,
                          custom_endpoint=True, ca_bundle=env.get("AWS_CA_BUNDLE") or None,
                          scheme="gs")


class GcsSource(S3Source):
    """gs://bucket/prefix/pattern: listed by s3.py (ListObjectsV2), read by gcs()."""

    kind = "gcs"
    schemes: tuple[str, ...] = ("gs",)

    def settings(self, context: SourceContext) -> aws.S3Settings | None:
        return context.gcs


SOURCE = GcsSource()
