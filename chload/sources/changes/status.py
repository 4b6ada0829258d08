"""`chload sources`: each followed table of a target, where its stream stands, and what
its replication slot costs the source; dropping a follow's slot.

What the ledger says (the stream's committed end, when it last committed) is joined
with what the source says (its WAL position now, the slot's restart position): the lag
in bytes is the WAL written since the committed end, in seconds the time since the last
commit while there is lag; the WAL retained is what the slot keeps the server from
removing, warned about above `max_retained` (a slot nobody reads fills the disk).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from chload.errors import ChloadError, UsageError
from chload.sources.changes import followed
from chload.sources.changes.postgres.slot import SCHEME, Slot, lsn_text
from chload.sources.databases.table import DbUrl

if TYPE_CHECKING:
    from chload.targets.base import Target

MAX_RETAINED = 10 * 1024**3  # bytes of WAL a slot may keep before `chload sources` warns


def _url(stream: str, env: Mapping[str, str]) -> tuple[DbUrl, str]:
    """The source and slot a stream name says (the password from PGPASSWORD)."""
    parts = urlsplit(stream)
    database, relation, slot = [p for p in parts.path.split("/") if p][:3]
    schema, _, table = relation.partition(".")
    return DbUrl("postgresql", parts.username or "", parts.hostname or "", parts.port or 5432,
                 database, schema, table, env.get("PGPASSWORD")), slot


def follows(target: Target, env: Mapping[str, str], max_retained: int = MAX_RETAINED,
            drop: str | None = None, clusters: Sequence[Target] = ()) -> list[dict[str, Any]]:
    """One entry per followed table (or, with `drop`, the follows of that table, their
    slots dropped): table, source, slot, position, lag_bytes, lag_seconds,
    retained_bytes, warning (or error, when the source cannot be asked). `clusters`: the
    target's Distributed tables, opened (followed.py), whose follows are listed too."""
    found = followed.streams(target, clusters, SCHEME)
    if drop is not None:
        wanted = drop if "." in drop else f"{target.database}.{drop}"
        found = [f for f in found if f.table == wanted]
        if not found:
            raise UsageError(f"--drop {drop}: no followed table of that name in "
                             f"{target.display}; `chload sources` lists them")
    out = []
    for f in found:
        table, stream, end = f.table, f.stream, f.end or 0
        url, name = _url(stream, env)
        entry: dict[str, Any] = {"table": table, "source": url.with_user, "slot": name,
                                 "position": lsn_text(end)}
        if f.error and drop is None:
            out.append({**entry, "error": f.error})
            continue
        try:
            slot = Slot(url, name)
        except ChloadError as exc:
            out.append({**entry, "error": str(exc)})
            continue
        try:
            if drop is not None:
                entry["dropped"] = slot.drop()
            elif not slot.exists():
                entry["error"] = f"slot {name} is gone: the follow cannot go on"
            else:
                retained, _ = slot.retained()
                lag = max(0, slot.current() - end)
                since = (time.time_ns() - followed.last_commit_ns(f.where, table, stream)) / 1e9
                entry.update(lag_bytes=lag, lag_seconds=round(since, 1) if lag else 0.0,
                             retained_bytes=retained)
                if retained > max_retained:
                    entry["warning"] = (f"slot {name} retains {retained:,} bytes of WAL "
                                        f"(over {max_retained:,}): run the "
                                        "follow, or drop it (chload sources --drop "
                                        f"{table}) before the source's disk fills")
        except ChloadError as exc:
            entry["error"] = str(exc)
        finally:
            slot.close()
        out.append(entry)
    return out
