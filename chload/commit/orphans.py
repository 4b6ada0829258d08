"""Which stages no commit needs any more (committer.py rule 6), apart from the protocol.

A stage is dropped only when no file of any table, still `committing`, names it
(`committing_stages`), and its process is gone (`orphan`): a crashed commit into one
table keeps its stage through loads into other tables until its own table settles it.
"""

from __future__ import annotations

from chload.commit.ledger import COMMITTING, DATABASE
from chload.commit.locks import Holder, Sql, _start_time
from chload.commit.request import _bare
from chload.schema import quote_str

ORPHAN_STAGE_SECONDS = 24 * 3600  # a stage of another machine untouched this long is dropped


def orphan(name: str, age: int, exclusive: bool, holder: Holder, lease: float) -> bool:
    """Is this stage (or broken lock) of nobody? Under an exclusive lock (embedded),
    every stage not of this process; else those of a dead process on this machine,
    and any untouched for a day (ORPHAN_STAGE_SECONDS) elsewhere."""
    if name.startswith("lockbroken_"):
        return age > lease
    parts = name.split("_")
    if exclusive:
        return parts[1:3] != [holder.machine, str(holder.pid)]
    if len(parts) != 4 or not parts[2].isdigit():
        return age > ORPHAN_STAGE_SECONDS
    if parts[1] == holder.machine:
        return int(parts[2]) != holder.pid and _start_time(int(parts[2])) < 0
    return age > ORPHAN_STAGE_SECONDS


def committing_stages(sql: Sql, names: list[str]) -> set[str]:
    """Those of `names` that a file of any table, still `committing`, needs."""
    listed = ", ".join(quote_str(s) for n in names for s in (n, f"{DATABASE}.{n}"))
    rows = sql.rows(
        f"SELECT stage FROM (SELECT argMax(state, seq) AS st, argMax(stage, seq) AS stage "
        f"FROM {DATABASE}.files WHERE uri IN (SELECT uri FROM {DATABASE}.files WHERE "
        f"stage IN ({listed})) GROUP BY target_table, uri) WHERE st = '{COMMITTING}'")
    return {_bare(r["stage"]) for r in rows}
