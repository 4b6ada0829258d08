"""What the remote kinds share: the `Source` answers of a store the engine reads over
the network (`RemoteSource`), and one table function over a `{a,b,c}` list of objects.

The engine's s3() and hdfs() read a brace list of keys as exact keys (no listing; checked
with the S3ListObjects counter: 0), and their `_path` names each row's object, so
several small objects load in one query with exact per-object row counts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from chload.sources import InPlace, SourceFile

_NOT_IN_A_LIST = re.compile(r"[,{}*?\[\]'\\]")  # would change the meaning of the list
_GLOB = re.compile(r"[*?{}]")  # the engine would expand it in the common prefix too


def brace_list(files: Sequence[SourceFile]) -> str | None:
    """`http://h/bucket/dir/{a.csv,b/c.csv}` over the files' locations, or None.

    None when a name or the directory holds a character that means something in a glob
    (`s3://b/dir*x/` would be expanded too), or the files
    differ in how they are read (compression, anonymous access).
    """
    if len({(f.format.compression, f.anonymous) for f in files}) != 1:
        return None
    locations = [f.location or f.uri for f in files]
    prefix = os.path.commonprefix(locations)
    prefix = prefix[: prefix.rfind("/") + 1]
    rests = [loc[len(prefix):] for loc in locations]
    if not prefix or _GLOB.search(prefix.split("://", 1)[-1]):
        return None
    if any(not r or _NOT_IN_A_LIST.search(r) for r in rests):
        return None
    return prefix + "{" + ",".join(rests) + "}"


class RemoteSource(InPlace):
    """The `Source` answers every remote kind shares (a subclass lists and reads):
    listing makes nothing to release; an object keeps its listed identity (identity.py
    says why); only a read tells whether it is still there; a size of 0 may just be
    unsaid (HTTP without Content-Length), so no object is known empty."""

    kind = ""
    schemes: tuple[str, ...] = ()

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        return None

    def release(self, files: Iterable[SourceFile]) -> None:
        return None

    def current(self, file: SourceFile) -> SourceFile:
        return file

    def still_there(self, file: SourceFile) -> bool | None:
        return None

    def reads_at_uri(self, file: SourceFile) -> bool:
        return False

    def known_empty(self, file: SourceFile) -> bool:
        return False
