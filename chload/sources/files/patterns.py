"""Patterns of names: globs as regexes, shell-style brace expansion, and one brace list
over many objects.

The engine's s3() and hdfs() read a brace list of keys as exact keys (no listing), and
their `_path` names each row's object, so several small objects load in one query with
exact per-object row counts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from chload.errors import UsageError
from chload.sources.base import SourceFile

_BRACE = re.compile(r"\{([^{}]*)\}")


def glob_regex(pattern: str, *, across: bool = False) -> str:
    """A glob as a regex (for `fullmatch`): `*` and `?` stay within a `/` segment,
    `[...]` is a class (`[!...]` negates it) whose backslashes are literal, as in
    fnmatch (a backslash is a character of a file's name or an object's key, never an
    escape), and every other character stands for itself. With `across` (S3 keys), `**`
    crosses segments wherever it stands; without (a local path's component: the walk
    takes a `**` component), it is two `*`."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        end = pattern.find("]", i + 2) if ch == "[" else -1
        if across and pattern.startswith("**", i):
            out.append(".*")
            i += 1
        elif ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif end > 0:
            body = pattern[i + 1:end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Shell-style brace expansion: `a{1..3}` -> a1 a2 a3; `{x,y}` -> x y.

    Zero-padded ranges keep their width (`{000..099}`), as ClickHouse and bash do.
    """
    match = _BRACE.search(pattern)
    if not match:
        return [pattern]
    head, body, tail = pattern[: match.start()], match.group(1), pattern[match.end():]
    rng = _RANGE.match(body)
    if rng:
        lo, hi = int(rng.group(1)), int(rng.group(2))
        width = len(rng.group(1)) if rng.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        if abs(hi - lo) > 100_000:
            raise UsageError(f"{pattern}: range {{{body}}} expands to more than 100,000 names")
        options = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    elif "," in body:
        options = body.split(",")
    else:
        return [head + "{" + body + "}" + name for name in expand_braces(tail)]
    return [name for option in options for name in expand_braces(head + option + tail)]


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
