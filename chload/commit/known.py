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
