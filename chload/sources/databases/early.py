"""A database source's snapshot begun while the target opens.

Why: the embedded target's start (chDB's import, its session, the ledger) is 0.3-0.4 s
of one core before anything is listed, and the database session after it (connect,
describe, export the snapshot, and PostgreSQL's first range connection) another
0.05-0.1 s, while the other core waits. Started in a thread at the top of `load`,
the session is ready when `DatabaseSource.list` asks for it (`claim`), if the run's
options are the ones it was begun with; else it is closed and a new one made. Nothing
is read before `list`: a session holds a snapshot and connections only. A session no
run claims (the target failed to open) is closed by `begin`'s cleanup.

PostgreSQL only: a MySQL/MariaDB session begun early made `--workers 2` into the
embedded target slower in two runs (1.76 against 1.55 s, 2.51 against 1.94 s, same CPU:
bench/databases.py with the commit before as a variant), not understood, so it is begun
where the run lists, as before. It cannot matter: the whole session (libmariadb's
connect, describe, lock, snapshot, unlock) was 4 ms in a trace (docs/databases.md run
H), all that beginning it early could save.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chload.sources.base import SourceContext


@dataclass
class _Early:
    key: Hashable
    thread: threading.Thread = field(default_factory=threading.Thread)
    session: Any = None
    error: BaseException | None = None


_EARLY: dict[str, _Early] = {}
_GUARD = threading.Lock()


def begin(patterns: Sequence[str], select: str | None, incremental_by: str | None,
          workers: int | None) -> Callable[[], None]:
    """Start the session of a run's one database source in a thread; the cleanup to
    call when the run ends (it closes the session if `list` did not claim it)."""
    from chload.sources.registry import SCHEMES, source_for

    if len(patterns) != 1 or "://" not in patterns[0]:
        return lambda: None
    pattern = patterns[0]
    if SCHEMES.get(pattern.split("://")[0].lower()) != "postgres":
        return lambda: None  # MySQL/MariaDB: begun early it was slower (below)
    # imported only now: database.py brings hashlib (OpenSSL), ~6 ms of every file load
    from chload.sources.databases.base import DatabaseSource, parse_url
    source = source_for(pattern)
    assert isinstance(source, DatabaseSource)
    context = SourceContext(select=select, incremental_by=incremental_by, workers=workers,
                            pipes=True)
    early = _Early(key(context))

    def start() -> None:
        try:
            early.session = source._session(parse_url(pattern, select), context)
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
