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
    and any untouched for a day (ORPHAN_STAGE_SECONDS) elsewhere.

    A process is its pid and its start (stage_name): a pid alone is given again to
    new processes and threads (pid_max may be 32768), and a dead loader's stage whose
    pid a long-lived thread took would be kept for as long as it runs. A stage named
    by an older chload (no start) is judged by its pid alone."""
    if name.startswith("lockbroken_"):
        return age > lease
    owner = _owner(name)
    if exclusive:
        return owner != holder
    if owner is None or owner.machine != holder.machine:
        return age > ORPHAN_STAGE_SECONDS
    if owner.start < 0:  # (an older chload's name)
        return owner.pid != holder.pid and _start_time(owner.pid) < 0
    return not owner.alive_here()


def _owner(name: str) -> Holder | None:
    """The process a stage's name names (start -1 in an older chload's name, which
    has none), or None for a name of neither shape."""
    parts = name.split("_")
    if len(parts) == 5 and parts[2].isdigit() and parts[3].isdigit():
        return Holder(parts[1], int(parts[2]), int(parts[3]))
    if len(parts) == 4 and parts[2].isdigit():
        return Holder(parts[1], int(parts[2]), -1)
    return None


def committing_stages(sql: Sql, names: list[str]) -> set[str]:
    """Those of `names` that a file of any table, still `committing`, needs."""
    listed = ", ".join(quote_str(s) for n in names for s in (n, f"{DATABASE}.{n}"))
    rows = sql.rows(
        f"SELECT stage FROM (SELECT argMax(state, seq) AS st, argMax(stage, seq) AS stage "
        f"FROM {DATABASE}.files WHERE uri IN (SELECT uri FROM {DATABASE}.files WHERE "
        f"stage IN ({listed})) GROUP BY target_table, uri) WHERE st = '{COMMITTING}'")
    return {_bare(r["stage"]) for r in rows}
