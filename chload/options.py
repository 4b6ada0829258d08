"""Values a Python caller passes -> the types a LoadSpec holds, checked in one place.

The CLI hands over strings and ints already; a script passes what is natural to it: a
`pathlib.Path` for a file or the target directory, settings as a dict with int or bool
values. Each converter here takes those, returns the one type the rest of chload
expects, and answers anything else with a UsageError naming the option (not a
TypeError or AttributeError from deep inside a load).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from chload.errors import UsageError


def _got(name: str, value: object, wanted: str) -> UsageError:
    shown = repr(value) if len(repr(value)) <= 60 else type(value).__name__
    return UsageError(f"{name}={shown}: must be {wanted}")


def path(name: str, value: object) -> str:
    """A file, directory or URL: a str or an os.PathLike such as pathlib.Path."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        fs = os.fspath(value)
        if isinstance(fs, str):
            return fs
    raise _got(name, value, "a str or pathlib.Path")


def optional_path(name: str, value: object) -> str | None:
    return None if value is None else path(name, value)


def sources(name: str, value: object) -> tuple[str, ...]:
    """One source or several: a str or Path, or an iterable of them (not one str's
    characters)."""
    if isinstance(value, (str, os.PathLike)):
        return (path(name, value),)
    if isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        return tuple(path(name, item) for item in value)
    raise _got(name, value, "a file, directory, glob or URL (str or pathlib.Path), or a "
               "list of them")


def text(name: str, value: object) -> str:
    if isinstance(value, str):
        return value
    raise _got(name, value, "a str")


def optional_text(name: str, value: object) -> str | None:
    return None if value is None else text(name, value)


def flag(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise _got(name, value, "True or False")


def whole(name: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _got(name, value, f"an int, e.g. {name}=4")


def optional_whole(name: str, value: object) -> int | None:
    return None if value is None else whole(name, value)


def workers(name: str, value: object) -> int | None:
    """A number of workers, or "auto" (None: the target sizes and, into a server,
    adapts them while loading)."""
    return None if value == "auto" else optional_whole(name, value)


def optional_ratio(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise _got(name, value, f"a number, e.g. {name}=0.01")


def optional_seconds(name: str, value: object) -> float | None:
    """None, or a positive number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _got(name, value, "a positive number of seconds")
    return float(value)


def settings(name: str, value: object) -> tuple[tuple[str, str], ...]:
    """ClickHouse settings: a dict or a list of (name, value) pairs; values str, int,
    float or bool (True is 1), sent as text as the CLI's --setting name=value."""
    pairs = value.items() if isinstance(value, Mapping) else value
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        raise _got(name, value, "a dict like {'max_threads': 4} or a list of (name, value) "
                   "pairs")
    out = []
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise _got(name, value, "a dict like {'max_threads': 4} or a list of (name, "
                       "value) pairs")
        key, setting = pair
        if not isinstance(key, str) or not key.strip():
            raise _got(name, value, "named by non-empty str keys")
        out.append((key.strip(), _setting_text(key, setting)))
    return tuple(out)


def _setting_text(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (str, int, float)):
        return str(value).strip()
    raise _got(f"settings[{key!r}]", value, "a str, int, float or bool")


def no_unknown(function: str, given: Iterable[str], valid: Iterable[str]) -> None:
    """A keyword the function does not take: one line listing the ones it does."""
    known = sorted(valid)
    unknown = [name for name in given if name not in known]
    if unknown:
        raise UsageError(f"{function}(): unknown option {unknown[0]}; the options are "
                         f"{', '.join(known)}")
