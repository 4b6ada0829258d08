"""A commit request, and what the committer's survey decides of it (commit.py rule 5):
whether another load committed its files meanwhile, where each stream it follows ends,
and what a request learns when its group stopped before it. Apart from commit.py so the
protocol's module holds the protocol (the lock, the log, the attach, settling); these
are pure functions of the survey's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chload.errors import TransientError, retyped
from chload.ledger import COMMITTING, DATABASE, LOADED, FileEvent
from chload.schema import quote_str
from chload.sources import StreamPosition


@dataclass(slots=True)
class _Request:
    """One commit waiting for its turn, and how it ended."""

    stage: str
    partitions: Sequence[str] | None
    events: Sequence[FileEvent]
    since_ns: int
    follows: Sequence[StreamPosition] = ()
    attached: bool | None = None
    error: BaseException | None = None

    @property
    def settled(self) -> bool:
        return self.attached is not None or self.error is not None


def _taken(last: dict[str, dict], request: _Request) -> bool:
    """Did another load commit one of the request's files since it started? Under any
    identity: a file that grew between the two reads is in the table already, and
    committing it again would double its rows (the next run refuses it as changed)."""
    return any(
        row["b"] in (COMMITTING, LOADED) and row["c"] != request.stage
        and int(row["e"] or 0) > request.since_ns
        for event in request.events if (row := last.get(event.uri)) is not None)


def _stream_ends_sql(display: str, follows: Sequence[StreamPosition]) -> str:
    """A UNION ALL arm of the survey: each stream's committed end (its committed units'
    highest last offset + 1), units named `<stream>/<first>-<last>` (StreamPosition);
    a unit's latest event `committing` counts (under the lock, with no dirty marker, a
    `committing` unit was attached: rule 1)."""
    if not follows:
        return ""
    streams = {p.stream: p.since_seq for p in follows}
    where = " OR ".join(f"(startsWith(uri, {quote_str(s + '/')}) AND seq >= {int(since)})"
                        for s, since in streams.items())
    return (f" UNION ALL SELECT 'end', s, '', '', '', toString(max(l) + 1) FROM (SELECT "
            f"replaceRegexpOne(uri, '/[^/]*$', '') AS s, "
            f"toUInt64OrZero(replaceRegexpOne(uri, '^.*-', '')) AS l, "
            f"argMax(state, seq) AS st FROM {DATABASE}.files WHERE target_table = "
            f"{quote_str(display)} AND ({where}) GROUP BY uri) "
            f"WHERE st IN ('{COMMITTING}', '{LOADED}') GROUP BY s")


def _moved(ends: dict[str, int], request: _Request) -> bool:
    """Has a stream of the request moved since its plan (another loader committed a
    range of it, or a unit before it in this run did not commit)?"""
    return any(ends.get(p.stream, 0) != p.after for p in request.follows)


def _ends(request: _Request) -> dict[str, int]:
    """The stream ends once the request's units are attached (a group may hold the next
    unit of the same stream)."""
    ends: dict[str, int] = {}
    for event in request.events:
        stream, _, span = event.uri.rpartition("/")
        if any(p.stream == stream for p in request.follows):
            ends[stream] = int(span.rpartition("-")[2]) + 1
    return ends


def _not_committed(request: _Request, cause: BaseException) -> BaseException:
    """What a commit that waited in a group learns when the group stopped before it:
    nothing of it was logged or attached, so it may be tried again."""
    if isinstance(cause, TransientError):
        return retyped(cause, TransientError)
    return TransientError(f"{_files(request.events)}: not committed, the commit before it "
                          f"in its group failed ({cause}); run the same command again to "
                          "load it")


def _files(events: Sequence[FileEvent]) -> str:
    first = events[0].uri
    return first if len(events) == 1 else f"{first} and {len(events) - 1} more files"
