"""--mode replace-table: a run loads a new table and swaps it in for the old one, exactly
once, whatever instant a crash comes at.

The run loads every unit into `<table>__chload_new` (CREATE TABLE ... AS the table, each
unit through the committer as ever), then, only if every unit committed:

1. logs SWAPPING (uri: the new table; identity: its uuid where the engine has one);
2. swaps in one statement: `EXCHANGE TABLES t AND new` (the embedded engine), else
   `RENAME TABLE t TO <table>__chload_old, new TO t` (ClickHouse 18.16 has no EXCHANGE);
3. logs TABLE_REPLACED and, after it, the run's units as `loaded` into the table: the
   ledger's `loaded` events before a TABLE_REPLACED are superseded (tables.loaded_where),
   so a later append run loads again a file that only the old table held;
4. drops the old table.

Readers see the old table until the swap statement and the new one after it, never a
table half loaded. A crash before 1 leaves the old table as it was: the next run
(`settle`, before any load into the table) drops the leftover tables and starts over. A
crash between 1 and 3 is settled by `settle` from what the tables show: the table's uuid
is the new table's (or, without uuids, the new table is gone), so the swap happened and
3 and 4 are done now; else it did not, and the attempt is logged abandoned. A RENAME cut
between its two renames (the table missing, the new one there) is finished first.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from chload.commit.ledger import (
    COMMITTING,
    FAILED,
    FILES,
    LOADED,
    SWAP_ABANDONED,
    SWAPPING,
    TABLE_REPLACED,
    FileEvent,
    Ledger,
    Sql,
)
from chload.errors import ChloadError
from chload.runtime.faults import crash_point
from chload.schema import quote_ident, quote_str

NEW, OLD = "__chload_new", "__chload_old"
ABANDONED = SWAP_ABANDONED  # a SWAPPING whose swap did not happen (settle)


class TableSwap:
    """The swap of one table (`database`.`name`, shown as `display`) through `sql`,
    recorded in `ledger`. `exchange`: the engine has EXCHANGE TABLES."""

    def __init__(self, sql: Sql, ledger: Ledger, database: str, name: str,
                 display: str, exchange: bool) -> None:
        self.sql, self.ledger, self.exchange = sql, ledger, exchange
        self.database, self.name, self.display = database, name, display
        self.new_name, self.old_name = f"{name}{NEW}", f"{name}{OLD}"

    def _sql(self, name: str) -> str:
        return f"{quote_ident(self.database)}.{quote_ident(name)}"

    @property
    def table(self) -> str:
        return self._sql(self.name)

    @property
    def new(self) -> str:
        return self._sql(self.new_name)

    @property
    def new_display(self) -> str:
        return f"{self.database}.{self.new_name}"

    # -- before a run ------------------------------------------------------------------
    def settle(self) -> str:
        """Finish or undo a swap an earlier run was cut in (module docstring); return
        what was done ('' nothing, 'finished' or 'abandoned')."""
        # A swap's events name the new table as their uri, a replaced table's none
        # (`superseding`): read through the ledger's order (target_table, uri, seq),
        # not the state of each of a long history's events, every run.
        rows = self.sql.rows(
            f"SELECT state, uri, identity, run_id FROM {FILES} WHERE target_table = "
            f"{quote_str(self.display)} AND uri IN ('', {quote_str(self.new_display)}) AND "
            f"state IN ('{SWAPPING}', '{TABLE_REPLACED}', '{ABANDONED}') ORDER BY seq DESC "
            "LIMIT 1")
        if not rows or rows[0]["state"] != SWAPPING:
            return ""
        intent = rows[0]
        if self._swapped(str(intent["identity"])):
            self._complete(str(intent["run_id"]))
            return "finished"
        self.ledger.record([FileEvent(self.display, self.new_display, "", 0, 0, ABANDONED,
                                      run_id=str(intent["run_id"]))])
        return "abandoned"

    def _swapped(self, new_uuid: str) -> bool:
        have = self._tables()
        if new_uuid:
            return have.get(self.name) == new_uuid
        if self.new_name in have and self.name not in have and self.old_name in have:
            self.sql.command(f"RENAME TABLE {self.new} TO {self.table}")  # (cut between
            return True                                                   # its renames)
        return self.new_name not in have

    def _tables(self) -> dict[str, str]:
        """name -> uuid ('' where the engine has none) of the table and its two others."""
        names = ", ".join(quote_str(n) for n in (self.name, self.new_name, self.old_name))
        found = self.sql.rows(f"SELECT name FROM system.tables WHERE database = "
                              f"{quote_str(self.database)} AND name IN ({names})")
        return {r["name"]: self.ledger.table_state(self.database, r["name"]).uuid
                for r in found}

    def start_over(self) -> None:
        """Before a replace-table run: what a run cut before its swap left goes (its new
        table, an old one kept, and its committing units, which must not be settled into
        the next run's new table)."""
        self.settle()
        pending = self.ledger.latest(self.new_display, [COMMITTING])
        if pending:
            self.ledger.record([e.moved(FAILED, "its replace-table run was cut before the "
                                               "swap; the next run loads it again")
                                for e in pending])
        self.drop(self.new_name)
        self.drop(self.old_name)

    def drop(self, name: str) -> None:
        with contextlib.suppress(ChloadError):  # housekeeping: the next run drops it
            self.sql.command(f"DROP TABLE IF EXISTS {self._sql(name)}")

    # -- the swap ----------------------------------------------------------------------
    def swap(self, run_id: str, table_exists: bool) -> None:
        """Swap the loaded new table in (or rename it in, where there was no table)."""
        uuid = self.ledger.table_state(self.database, self.new_name).uuid
        self.ledger.record([FileEvent(self.display, self.new_display, uuid, 0, 0, SWAPPING,
                                      run_id=run_id)])
        crash_point("before-swap")
        if not table_exists:
            self.sql.command(f"RENAME TABLE {self.new} TO {self.table}")
        elif self.exchange:
            self.sql.command(f"EXCHANGE TABLES {self.table} AND {self.new}")
        else:
            self.sql.command(f"RENAME TABLE {self.table} TO {self._sql(self.old_name)}, "
                             f"{self.new} TO {self.table}")
        crash_point("after-swap")
        self._complete(run_id)

    def _complete(self, run_id: str) -> None:
        """The swap happened: the table's history restarts with the run's units."""
        units = [e for e in self.ledger.of_run(run_id)
                 if e.target_table == self.new_display and e.state in (COMMITTING, LOADED)]
        self.ledger.record(superseding(self.display, units, run_id,
                                       self.ledger.table_state(self.database, self.name).uuid))
        self.drop(self.new_name if self.exchange else self.old_name)
        self.drop(self.old_name)


def superseding(display: str, units: Sequence[FileEvent], run_id: str,
                uuid: str) -> list[FileEvent]:
    """TABLE_REPLACED for `display`, then each unit `loaded` into it, in that order."""
    now = time.time_ns()
    marker = FileEvent(display, "", "", 0, 0, TABLE_REPLACED, run_id=run_id, seq=now,
                       table_uuid=uuid)
    return [marker] + [
        FileEvent(display, e.uri, e.identity, e.size, e.mtime_ns, LOADED, e.rows, e.bytes,
                  run_id=run_id, seq=now + 1 + i, table_uuid=uuid)
        for i, e in enumerate(units)]

