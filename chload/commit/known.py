"""What a table holds by the ledger, compact: the planner's side of "a run costs what is new".

A rerun over a million files must not hold a million ledger events in Python. The
engine reduces the ledger (`chload.files`) to one pair of 64-bit keys per unit loaded
into the table: the first 8 bytes of MD5 of its uri and of its identity, as
`reinterpretAsUInt64(MD5(x))` reads them (little-endian), a function every engine here
has (chDB 26, ClickHouse 18.16). They come sorted by the uri's key, so a listed unit is
looked up by bisection: 16 bytes a known unit, and the listing itself is never held.

A key names a uri only up to a collision of 64-bit hashes (about one chance in 10^7 at
a million uris, both keys of a pair colliding far less): a listed uri whose key is
known with another identity is checked against the ledger's own events before it is
refused as changed (`KnownUnits.events`).

The keys are read from a summary of the ledger (`chload.units`: one row of numbers an
event, ordered by table and uri key), which a materialized view of `chload.files` keeps
up to date as events are written, on every engine here; so a table's keys are one
range of one ordered table, not a grouping of every event's text. The view writes after
the ledger's own part, not with it: a process killed between the two leaves an event
out of the summary. So the summary is trusted only while it sums to the ledger (a count
and a sum of a hash of each event's key and sequence, asked of both: `summary_check`);
when it does not (a ledger made before the summary, an event left out), the table's
share is rebuilt from the ledger (`rebuild_statements`) and, until it sums again, the
ledger itself is read.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chload.commit.ledger import FileEvent

# the ledger's events for some uris (their latest `loaded` each), asked only for the few
# a plan refuses as changed
Events = Callable[[list[str]], Mapping[str, "FileEvent"]]


SUMMARY, FEED = "units", "units_feed"  # the summary table, and the view that fills it
# what an event says, as a number: 1 loaded, 2 committing, 3 a table swapped in (its
# earlier loads superseded: --mode replace-table), 0 anything else
LOADED_CODE, COMMITTING_CODE, REPLACED_CODE = 1, 2, 3
_SUMMARY_ROW = (  # (a column of the summary, what the view writes into it)
    ("target_table", "target_table"), ("unit", "reinterpretAsUInt64(MD5(uri))"),
    ("seq", "seq"),
    ("code", "toUInt8(multiIf(state = 'loaded', 1, state = 'committing', 2, "
             "state = 'table-replaced', 3, 0))"),
    ("ident", "reinterpretAsUInt64(MD5(identity))"),
    ("owner", "if(table_uuid = '', toUInt64(0), reinterpretAsUInt64(MD5(table_uuid)))"),
    ("rows", "rows"), ("spelling", "cityHash64(uri)"))
_SUMMARY_TYPES = {"code": "UInt8", "target_table": "String"}


def summary_statements(database: str) -> list[str]:
    """The summary table and its view (after the ledger's `files`): a ledger made before
    them gets them on first use, and its events on the first `summary_check` that
    fails. A table's events are a partition of their own, so one table's share is
    dropped and written again alone (18.16 has no DELETE that waits)."""
    columns = ", ".join(f"{c} {_SUMMARY_TYPES.get(c, 'UInt64')}" for c, _ in _SUMMARY_ROW)
    return [f"CREATE TABLE IF NOT EXISTS {database}.{SUMMARY} ({columns}) ENGINE = "
            "MergeTree PARTITION BY target_table ORDER BY (target_table, unit, seq)",
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.{FEED} TO "
            f"{database}.{SUMMARY} AS {_summary_select(database, '')}"]


def _summary_select(database: str, where: str) -> str:
    values = ", ".join(f"{expr} AS {c}" if expr != c else c for c, expr in _SUMMARY_ROW)
    return f"SELECT {values} FROM {database}.files{where}"


def summary_check(database: str, table: str) -> str:
    """One row each for the ledger (`files`) and the summary (`units`) of a table (a
    quoted literal): its events (`n`), its `loaded` ones (`loaded`) and the sum of a
    hash of each event's uri key and sequence (`h`). The summary holds the ledger's
    events when both rows say the same: an event left out, or one twice, changes the
    sum (but with a chance of 2^-64)."""
    return (f"SELECT 'files' AS s, count() AS n, countIf(state = 'loaded') AS loaded, "
            f"sum(cityHash64(uri_key, seq)) AS h FROM {database}.files WHERE target_table "
            f"= {table} UNION ALL SELECT '{SUMMARY}', count(), countIf(code = {LOADED_CODE}),"
            f" sum(cityHash64(unit, seq)) FROM {database}.{SUMMARY} WHERE target_table = "
            f"{table}")


def summary_differs(table: str, database: str) -> str:
    """An SQL condition, true when the summary of `table` (a quoted literal) does not
    sum to the ledger (`summary_check`'s rule, its sums only)."""
    def total(source: str, unit: str) -> str:
        return (f"(SELECT sum(cityHash64({unit}, seq)) FROM {database}.{source} WHERE "
                f"target_table = {table})")
    return f"{total('files', 'uri_key')} != {total(SUMMARY, 'unit')}"


def backfill_statement(database: str) -> str:
    """Every event of the ledger into the summary: once, when the summary is made for a
    ledger that has events (Ledger.ensure)."""
    return f"INSERT INTO {database}.{SUMMARY} {_summary_select(database, '')} {_SMALL_BLOCKS}"


def rebuild_statements(database: str, table: str) -> list[str]:
    """The summary's share of one table (a quoted literal) written again from the
    ledger. Events written meanwhile may land twice or not at all: the next
    `summary_check` sees it and rebuilds again."""
    return [f"ALTER TABLE {database}.{SUMMARY} DROP PARTITION {table}",
            f"INSERT INTO {database}.{SUMMARY} "
            f"{_summary_select(database, f' WHERE target_table = {table}')} {_SMALL_BLOCKS}"]


# A ledger's events copied into the summary a block of this many at a time, on one
# thread: the embedded engine's memory is the loader's
_SMALL_BLOCKS = ("SETTINGS max_threads = 1, max_block_size = 65536, max_insert_block_size = "
                 "65536, min_insert_block_size_rows = 65536, min_insert_block_size_bytes = 0")


def key(text: str) -> int:
    """`reinterpretAsUInt64(MD5(text))`, as the engine computes it."""
    return int.from_bytes(hashlib.md5(text.encode("utf-8", "surrogateescape")).digest()[:8],
                          "little")


def _no_events(uris: list[str]) -> Mapping[str, FileEvent]:
    return {}


@dataclass
class KnownUnits:
    """The units loaded into one table, by key (sorted `uris`, `identities` beside),
    with a mark for each one a listing has met already (a second spelling of it)."""

    uris: array = field(default_factory=lambda: array("Q"))
    identities: array = field(default_factory=lambda: array("Q"))
    events: Events = _no_events
    _met: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self._met = bytearray(len(self.uris))

    def __len__(self) -> int:
        return len(self.uris)

    @property
    def met(self) -> bytearray:
        """A byte a unit, set once a listing has met it (`meet`, or a listing's own
        comparison of keys: sources.base.KnownKeys)."""
        return self._met

    def find(self, uris: Iterable[str]) -> int:
        """The index of the first of `uris` (a unit's uri, then its aliases) that is
        known; -1 if none is."""
        if not self.uris:  # (a first load: no key to compute)
            return -1
        for uri in uris:
            k = key(uri)
            i = bisect_left(self.uris, k)
            if i < len(self.uris) and self.uris[i] == k:
                return i
        return -1

    def same_identity(self, index: int, identity: str) -> bool:
        return self.identities[index] == key(identity)

    def meet(self, index: int) -> bool:
        """Mark the unit at `index` met by this listing; False if it was met already."""
        if self._met[index]:
            return False
        self._met[index] = 1
        return True

    @classmethod
    def of_events(cls, loaded: Mapping[str, FileEvent]) -> KnownUnits:
        """From events already in Python (a cluster's, gathered from its shards)."""
        pairs = sorted((key(uri), key(e.identity)) for uri, e in loaded.items())
        return cls(array("Q", (u for u, _ in pairs)), array("Q", (i for _, i in pairs)),
                   lambda uris: {u: loaded[u] for u in uris if u in loaded})
