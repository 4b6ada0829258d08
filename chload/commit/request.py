"""A commit request, and what the committer's survey decides of it (committer.py rule 5):
whether another load committed its files meanwhile, where each stream it follows ends,
what a request learns when its group stopped before it, and the queries a run's first
look (`_start_sql`) and the mark rule (`block_tops`) ask. Apart from committer.py so the
protocol's module holds the protocol (the lock, the log, the attach, settling); these
are functions of the survey's rows, or build its queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chload.commit.known import COMMITTING_CODE, SUMMARY, summary_differs
from chload.commit.ledger import COMMITTING, DATABASE, LOADED, FileEvent
from chload.commit.locks import Sql
from chload.errors import CommitInterrupted, TransientError, retyped
from chload.runtime.faults import crash_point
from chload.schema import quote_str, split_table
from chload.sources.base import StreamPosition


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


_GROUP_BYTES = 16 << 20
# Rows a block of the first look's read: each of the summary's parts read in order holds
# a block of its own, all of them in the loader's memory on the embedded target
_READ_BLOCK = 8192


def _start_sql(dirty: str, display: str) -> str:
    """A run's first look at a table (Committer.start), in one query: its dirty marker
    (a broken lock), whether a file may still be `committing`, and every stage (or
    broken lock) with its age in seconds.

    A file's latest event is read from the ledger's summary (known.py: numbers an
    event, kept in the order of the uri's 64-bit key), not grouped from the ledger by
    uri, so a ledger of a million files is a few numbers a file to the engine, read in
    the order it keeps them; a second hash of the uri keeps apart two uris of one key.
    On a server that sorts it all the same (18.16), on one thread, spilled to disk past
    _GROUP_BYTES. A summary that does not sum to the ledger (an event the view left out
    when a process was killed) counts as committing: the recovery reads
    the ledger itself, and the planner's read rebuilds the summary (Ledger.known)."""
    table = quote_str(display)
    return (
        f"SELECT 'dirty' AS k, name AS a, toUInt64(0) AS age FROM system.tables WHERE "
        f"database = '{DATABASE}' AND name = {quote_str(dirty)} "
        f"UNION ALL SELECT 'committing', '', toUInt64(0) FROM (SELECT code FROM "
        f"{DATABASE}.{SUMMARY} WHERE target_table = {table} ORDER BY unit, spelling, seq "
        f"DESC LIMIT 1 BY unit, spelling SETTINGS max_threads = 1, max_block_size = "
        f"{_READ_BLOCK}, max_bytes_before_external_sort = {_GROUP_BYTES}) WHERE code = "
        f"{COMMITTING_CODE} "
        f"UNION ALL SELECT 'committing', '', toUInt64(0) FROM system.one WHERE "
        f"{summary_differs(table, DATABASE)} "
        f"UNION ALL SELECT 'stage', name, toUInt64(now() - metadata_modification_time) "
        f"FROM system.tables WHERE database = '{DATABASE}' AND (startsWith(name, "
        f"'stage_') OR startsWith(name, 'lockbroken_'))")


def block_tops(sql: Sql, tables: list[str]) -> dict[str, dict[str, int]]:
    """table -> partition id -> highest block number over its active parts."""
    pairs = [split_table(t) for t in tables]
    where = " OR ".join(f"(database = {quote_str(d)} AND table = {quote_str(n)})"
                        for d, n in pairs)
    found: dict[str, dict[str, int]] = {}
    for row in sql.rows(
            f"SELECT database, table, partition_id, max(max_block_number) AS top FROM "
            f"system.parts WHERE active AND ({where}) GROUP BY database, table, "
            f"partition_id"):
        name = tables[pairs.index((row["database"], row["table"]))]
        found.setdefault(name, {})[row["partition_id"]] = int(row["top"])
    return found


def _interrupted(request: _Request, display: str, cause: BaseException) -> CommitInterrupted:
    """A request logged `committing` whose attach this process could not finish: never
    retried here (its stage is kept); the next holder of the lock settles it (rule 4)."""
    return CommitInterrupted(
        f"{_files(request.events)}: commit into {display} interrupted ({cause}); run the "
        "same command again to finish it (no file will be loaded twice)")


def _crash_point(name: str) -> None:
    """A crash point of the commit, under its name and its older server- name."""
    crash_point(name)
    crash_point(f"server-{name}")


def _bare(stage: str) -> str:
    """A stage's name in the chload database (before the committer, the embedded
    target logged it qualified: chload.stage_x)."""
    return stage.removeprefix(f"{DATABASE}.")
