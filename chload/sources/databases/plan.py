"""Which ranges of a table are still to load: the rule that makes reruns exactly once.

A table is cut along an *axis*: its single-column integer primary key (a full copy),
or the `--incremental-by` column. A unit is the rows whose axis value is in `(lo, hi]`,
its ledger uri `postgresql://db:5432/shop/public.orders#id(100,200]` (never a
password), its identity the snapshot it was read from. A table without such a key, and
a `--query`, is one unit (`#all`, or `#query-<hash>`).

Invariant: a run lists the *complement* of the committed ranges within `(-inf, upper]`,
so no key value is in two committed ranges and none is left out. `upper` is the
snapshot's max of the axis for `--incremental-by`, and for a full copy the max recorded
by the copy that started it (in each unit's identity): a finished copy loads nothing on
a rerun. docs/sources-databases.md says more.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any

from chload.formats import FileFormat
from chload.sources.base import SourceFile
from chload.sources.databases.session import Range, Session

RANGE_ROWS = 2_000_000  # rows a range holds at most, about: a crash redoes at most this
# many. Fewer, larger ranges cost less (each is a client, a stage, a commit, and a scan
# of its own for the database): a range per worker unless that is more than this.
TSV = FileFormat("TSV", "none")
_RANGE = re.compile(r"#(?P<axis>[^#(]+)\((?P<lo>[^,]*),(?P<hi>[^\]]*)\]$")


def parse_range(uri: str, prefix: str) -> tuple[str, Range] | None:
    if not uri.startswith(prefix + "#"):
        return None
    found = _RANGE.search(uri[len(prefix):])
    if not found:
        return None
    return found["axis"], Range(found["lo"] or None, found["hi"] or None)


def missing_ranges(done: Sequence[Range], upper: str, key: Callable[[str], Any]) -> list[Range]:
    """The parts of (-inf, upper] that no range of `done` covers, in order."""
    def at(value: str | None, infinite: tuple) -> tuple:
        return infinite if value is None else (1, key(value))

    top = at(upper, (2,))
    gaps: list[Range] = []
    cursor, covered = (0,), None  # (-inf, cursor] is covered (nothing yet)
    for lo, hi, r in sorted((at(r.lo, (0,)), at(r.hi, (2,)), r) for r in done):
        if cursor >= top:
            break
        if lo > cursor:
            gaps.append(Range(covered, r.lo if lo < top else upper))
        if hi > cursor:
            cursor, covered = hi, r.hi
    if cursor < top:
        gaps.append(Range(covered, upper))
    return gaps


def split_range(r: Range, low: int, step: int) -> list[Range]:
    """An integer range in pieces of about `step` values; `low`: the data's min - 1,
    where the range has no lower end (the piece keeps none)."""
    assert r.hi is not None
    start, end = int(r.lo) if r.lo is not None else low, int(r.hi)
    pieces: list[Range] = []
    lo: str | None = r.lo
    cut = start
    while end - cut > step * 3 // 2:
        cut += step
        pieces.append(Range(lo, str(cut)))
        lo = str(cut)
    pieces.append(Range(lo, r.hi))
    return pieces


def plan_units(session: Session, kind: str, loaded: Sequence[tuple[str, str]],
               spec_workers: int, incremental: bool, force: bool) -> list[SourceFile]:
    """The units still to load: the complement of the committed ranges (`loaded`:
    (uri, identity) of every unit committed into the table from this source)."""
    url, info = session.url, session.info
    prefix = url.display if url.table else f"{url.display}#query"
    if not info.axis:
        uri = f"{prefix}#all" if url.table else f"{prefix}-{_digest(session)}"
        if not force and any(u == uri for u, _ in loaded):
            return []
        return [_unit(kind, uri, session.snapshot, "TRUE")]
    low, high, rows = session.bounds(info.axis)
    if high is None:  # no rows: one empty unit makes the table, if nothing was loaded
        empty = f"{prefix}#empty"  # (not a range: a later copy or increment loads all)
        if (not force and loaded) or any(u == empty for u, _ in loaded):
            return []
        return [_unit(kind, empty, session.snapshot, "FALSE")]
    key: Callable[[str], Any] = int if info.axis_integer else str
    done = [] if force else [r for u, _ in loaded
                             if (found := parse_range(u, prefix)) and found[0] == info.axis
                             for r in [found[1]]]
    upper = high
    if not incremental and done:
        planned = [m for _, ident in loaded if (m := _planned_upper(ident))]
        upper = max(planned, key=key) if planned else high
    gaps = missing_ranges(done, upper, key)
    if info.axis_integer and low is not None:
        width = int(high) - int(low) + 1
        step = max(1, width // max(spec_workers, -(-rows // RANGE_ROWS), 1))
        gaps = [p for g in gaps for p in split_range(g, int(low) - 1, step)]
    identity = f"upto {upper}; snapshot {session.snapshot}"
    return [_unit(kind, f"{prefix}#{g.label(info.axis)}", identity,
                  session.predicate(info.axis, _read_as(g, high, key, session)))
            for g in gaps]


def _read_as(r: Range, high: str, key: Callable[[str], Any], session: Session) -> Range:
    """The range as read: without its upper end where that is the snapshot's max (no
    row of the snapshot is above it), since the database tests it on every row. Not
    where the bounds were read outside the readers' snapshot (`bounds_in_snapshot`)."""
    if r.hi is None or key(r.hi) != key(high) or not session.bounds_in_snapshot:
        return r
    return Range(r.lo, None)


def _digest(session: Session) -> str:
    text = session.query or ""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _planned_upper(identity: str) -> str | None:
    found = re.match(r"upto (\S+);", identity)
    return found.group(1) if found else None


def _unit(kind: str, uri: str, identity: str, where: str) -> SourceFile:
    """A range as listed: `location` is its predicate in the source's SQL (what `fetch`
    reads), `etag` its identity; no bytes yet (size 0, never `known_empty`)."""
    return SourceFile(uri=uri, size=0, mtime_ns=0, format=TSV, etag=identity,
                      kind=kind, location=where)

