"""A database source's session begun while the target opens, claimed where the run lists.

Begun in a thread at the top of `load` (dispatch.py's `begin_early`), the session (connect,
describe, export the snapshot) is ready when `DatabaseSource.list` asks for it (`claim`)
if the run's options are the ones it was begun with; else it is closed and a new one
made. PostgreSQL only: docs/sources-databases.md says why MySQL's is not.

Invariants: nothing is read before `list` (a session holds a snapshot and connections
only); a session no run claims is closed by `begin`'s cleanup; this module knows no kind
of source (the caller passes it), so it imports neither the registry nor base.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from chload.sources.base import SourceContext


class _Closes(Protocol):
    def close(self) -> None: ...


class Opens(Protocol):
    """What begins a session: base.py's DatabaseSource."""

    def session_for(self, pattern: str, context: SourceContext) -> _Closes: ...


@dataclass
class _Early:
    key: Hashable
    thread: threading.Thread = field(default_factory=threading.Thread)
    session: Any = None
    error: BaseException | None = None


_EARLY: dict[str, _Early] = {}
_GUARD = threading.Lock()


def begin(pattern: str, source: Opens, context: SourceContext) -> Callable[[], None]:
    """Start `source`'s session of `pattern` in a thread; the cleanup to call when the
    run ends (it closes the session if `list` did not claim it)."""
    early = _Early(key(context))

    def start() -> None:
        try:
            early.session = source.session_for(pattern, context)
        except BaseException as exc:  # noqa: BLE001 (raised by `claim`, in the run's thread)
            early.error = exc

    early.thread = threading.Thread(target=start, name="chload_db_early", daemon=True)
    with _GUARD:
        if pattern in _EARLY:  # another run of this process began one: this run makes
            return lambda: None  # its own where it lists, as without this module
        _EARLY[pattern] = early
    early.thread.start()
    return lambda: _close(_unclaimed(pattern, early))


def key(context: SourceContext) -> Hashable:
    """What a session depends on besides the URL."""
    return (context.select, context.incremental_by, context.workers, context.pipes)


def claim(pattern: str, wanted: Hashable) -> Any:
    """The session begun for `pattern`, if its options are `wanted`; else None (one
    begun with other options is closed). Its error is raised here."""
    with _GUARD:
        early = _EARLY.pop(pattern, None)
    if early is None:
        return None
    early.thread.join()
    if early.error is not None:
        raise early.error
    if early.key != wanted:
        _close(early.session)
        return None
    return early.session


def _unclaimed(pattern: str, early: _Early) -> Any:
    """At the end of the run that began `early`: its session if no `list` claimed it
    (the target failed to open, or the run never listed), to be closed; an error of
    it is the run's no more."""
    with _GUARD:
        if _EARLY.get(pattern) is not early:
            return None  # claimed (or never registered)
        del _EARLY[pattern]
    early.thread.join()
    return early.session


def _close(session: Any) -> None:
    if session is not None:
        session.close()
