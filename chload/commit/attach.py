"""The statements a commit runs against a user's table, and the mark rule that settles
them. The one module that attaches: committer.py decides when (turns, groups, the
lock, the survey); this module says how, for every target (a shard of a cluster is a
server target with its own committer).

- `log_committing` / `log_group`: the files' `committing` events, each with the mark
  (the table's highest block number before its attach), under the commit lock;
- `attach`: ATTACH PARTITION ID ... FROM chload.<stage>, partition by partition (in
  chDB: the stage's partition MOVEd TO TABLE, below); under
  --mode replace-partitions the partitions a commit replaces (its events' `replaced`:
  those no earlier commit of this run replaced) are REPLACE PARTITION ... FROM the stage
  instead, or DROP PARTITION where the stage holds none of it (a cluster's shard that
  got no rows of a partition another shard did); both take the table's next block
  numbers, so the mark rule settles them as it settles an attach, and a DROP done twice
  drops nothing more;
- `settle`: after a crash or a lost answer, attach each stage partition with no part
  above the logged mark (committer.py rules 1, 3, 4);
- `drop_stage` / `drop_orphans`: stages no commit needs any more (rule 6).

In chDB an ATTACH ... FROM (and a REPLACE) cancels every merge running in the table and
holds merges off while it runs: a load committing a stage every second or so keeps the
table's merges from ever ending, its parts pile up to the end of the load, and each
merge started again over more parts holds more memory. A MOVE PARTITION ... TO TABLE
stops merges only in the stage (stopped already): the table merges as the load goes on.
It numbers the parts from the table's blocks as an attach does, and leaves the stage
without that partition, which the mark rule reads as attached (settle).

Every statement carries a query id naming this process and the table, so `wait_idle`
can tell whether an attach whose answer was lost is still running on the server.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence

from chload.commit.ledger import COMMITTING, DATABASE, LOADED, FileEvent, Ledger
from chload.commit.locks import Holder, Sql, lock_name
from chload.commit.orphans import committing_stages, orphan
from chload.commit.request import _bare, _crash_point, _files, _Request, block_tops
from chload.errors import ChloadError, CommitInterrupted, TransientError
from chload.runtime.faults import crash_point
from chload.runtime.retry import RetryPolicy
from chload.schema import quote_str, split_table

# Waits bounded by a deadline (RetryPolicy.tries), not by a number of tries:
SETTLE_EVERY = RetryPolicy(attempts=0, base_seconds=2.0, max_seconds=2.0, jitter=False)
IDLE_POLL = RetryPolicy(attempts=0, base_seconds=0.2, max_seconds=0.2, jitter=False)
STAGE_DROP = RetryPolicy(attempts=5, base_seconds=0.1, jitter=False)  # 0.1 s ... 0.8 s


class Attacher:
    """Logs, attaches and settles stages into tables for one Committer. `exclusive`:
    the commit lock keeps every other process out (embedded), so the mark is read
    before the log rather than in it."""

    def __init__(self, sql: Sql, ledger: Ledger, holder: Holder, exclusive: bool,
                 sleep: Callable[[float], None], moves: bool = False) -> None:
        self.sql, self.ledger, self.holder = sql, ledger, holder
        self.exclusive, self.sleep = exclusive, sleep
        self.moves = moves  # the engine MOVEs a stage's partition TO TABLE (docstring)
        # --mode replace-partitions: table -> (run, the partitions that run replaced);
        # a table absent appends. The first commit of a run holding rows of a partition
        # replaces it, later ones of the run add to it: the partition ends as the union
        # of the run's units holding it, however they were grouped (docs/modes.md)
        self._replacing: dict[str, tuple[str, set[str]]] = {}
        # stage -> the partitions a replace of it covers besides its own (a cluster's
        # unit: every shard's, so a shard that got no rows of one drops it)
        self.covers: dict[str, Sequence[str]] = {}
        self._modes = threading.Lock()

    # -- the load mode ---------------------------------------------------------------
    def use_mode(self, table: str, replace_partitions: bool, run_id: str) -> None:
        """The mode of the run `run_id` into `table`: append, or replace partitions (a
        new run replaces each partition again)."""
        with self._modes:
            if not replace_partitions:
                self._replacing.pop(table, None)
            elif self._replacing.get(table, ("", set()))[0] != run_id:
                self._replacing[table] = (run_id, set())

    def replaces(self, table: str) -> bool:
        return table in self._replacing

    def _to_replace(self, table: str, stage: str, partitions: Sequence[str]) -> str:
        """The partitions a commit of `stage` replaces (the `replaced` it logs): those of
        the stage (and its covers) no earlier commit of this run replaced."""
        with self._modes:
            done = self._replacing.get(table)
            if done is None:
                return ""
            return ",".join(sorted((set(partitions) | set(self.covers.get(stage, ())))
                                   - done[1]))

    def replaced(self, table: str, replaced: str) -> None:
        """A commit of this run logged (or settled) these partitions replaced."""
        with self._modes:
            done = self._replacing.get(table)
            if done is not None and replaced:
                done[1].update(replaced.split(","))

    # -- the commit ------------------------------------------------------------------
    def attach_new(self, table: str, stage: str, partitions: Sequence[str] | None,
                   events: Sequence[FileEvent]) -> None:
        """Log the files `committing` with the table's mark, then attach the stage's
        partitions."""
        partitions = self.log_committing(table, stage, partitions, events)
        _crash_point("before-attach")
        self.attach(table, stage, partitions, events[0].replaced if events else "")

    def attach(self, table: str, stage: str, partitions: Sequence[str],
               replaced: str = "") -> None:
        """Attach the partitions of chload.<stage> into `table`, in order; those in
        `replaced` replace the table's (module docstring)."""
        self._attach(table, f"{DATABASE}.{stage}", partitions, replaced, crash_points=True)
        _crash_point("after-attach")

    def _attach(self, table: str, source: str, partitions: Sequence[str], replaced: str = "",
                crash_points: bool = False) -> None:
        """The one ATTACH (REPLACE, DROP) statement of chload (settling passes no crash
        point)."""
        replacing = set(replaced.split(",")) - {""}
        for partition in sorted(set(partitions) | replacing):
            named = f"PARTITION ID {quote_str(partition)}"
            if partition not in replacing and self.moves:
                self.run(f"ALTER TABLE {source} MOVE {named} TO TABLE {table}", table)
            elif partition not in replacing:
                self.run(f"ALTER TABLE {table} ATTACH {named} FROM {source}", table)
            elif partition in partitions:
                self.run(f"ALTER TABLE {table} REPLACE {named} FROM {source}", table)
            else:
                self.run(f"ALTER TABLE {table} DROP {named}", table)
            if crash_points:
                crash_point("attach-partition")

    def log_committing(self, table: str, stage: str, partitions: Sequence[str] | None,
                       events: Sequence[FileEvent]) -> Sequence[str]:
        """Log the events `committing`, with the mark; return the stage's partitions.

        A server reads the mark as it writes the log (one round trip, and the mark is
        exact even right after another attach). In-process a round trip is cheap while
        a statement reading the mark once per file is not, so the mark is read first,
        with the stage's partitions, in one query."""
        if not self.exclusive:
            for event in events:
                event.stage, event.state, event.mark = stage, COMMITTING, 0
            partitions = partitions if partitions is not None else self.partitions(stage)
            replaced = self._log_replaced(table, stage, partitions, events)
            self.ledger.record(list(events), mark_of=split_table(table))
        else:
            tops = block_tops(self.sql, [table, f"{DATABASE}.{stage}"])
            mark = max(tops.get(table, {}).values(), default=0)
            partitions = partitions if partitions is not None else sorted(
                tops.get(f"{DATABASE}.{stage}", {}))
            replaced = self._to_replace(table, stage, partitions)
            for event in events:  # (one pass: a batch of many small files, an event a file)
                event.stage, event.state, event.mark, event.replaced = (stage, COMMITTING,
                                                                        mark, replaced)
            self.ledger.record(list(events))
        self.replaced(table, replaced)
        return partitions

    def _log_replaced(self, table: str, stage: str, partitions: Sequence[str],
                      events: Sequence[FileEvent]) -> str:
        replaced = self._to_replace(table, stage, partitions)
        for event in events:
            event.replaced = replaced
        return replaced

    def log_group(self, table: str, todo: Sequence[_Request]) -> None:
        """Log every request `committing`, in one INSERT that reads the table's mark M,
        each with the mark it would read just before its own attach: M plus the parts
        the stages before it attach. MergeTree numbers each attached part with the next
        block number of the table (a sealed stage has one part per partition, rule 2),
        and under the lock nothing else takes one, so the mark rule settles each stage
        exactly as if it had been logged alone."""
        offset = 0
        for request in todo:
            for event in request.events:
                event.stage, event.state, event.mark = request.stage, COMMITTING, offset
            offset += len(request.partitions or ())
        self.ledger.record([e for r in todo for e in r.events], mark_of=split_table(table))
        _crash_point("before-attach")

    def partitions(self, stage: str) -> list[str]:
        """The partition ids of a stage (chload.<stage>) that hold rows."""
        return sorted(block_tops(self.sql, [f"{DATABASE}.{stage}"]).get(f"{DATABASE}.{stage}", {}))

    # -- settling --------------------------------------------------------------------
    def settle(self, table: str, event: FileEvent) -> None:
        """Attach the stage partitions that have no part above the event's mark."""
        if not event.stage:
            return
        stage = f"{DATABASE}.{_bare(event.stage)}"
        tops = block_tops(self.sql, [table, stage])
        done = {p for p, top in tops.get(table, {}).items() if top > event.mark}
        replaced = ",".join(p for p in event.replaced.split(",") if p and p not in done)
        self._attach(table, stage, sorted(set(tops.get(stage, {})) - done), replaced)

    def settle_all(self, table: str, display: str) -> int:
        """Settle every `committing` file of `table`, in the order of their marks: a
        group logged together (log_group) is attached in its order, each stage's parts
        taking the block numbers its mark counts on. The caller holds the lock."""
        pending = sorted(self.ledger.latest(display, [COMMITTING]),
                         key=lambda e: (e.mark, e.seq))
        for event in pending:
            self.settle(table, event)
            self.ledger.record([event.moved(LOADED)])
            if event.stage:
                self.drop_stage(_bare(event.stage))
        return len(pending)

    def settle_own(self, table: str, display: str, stage: str, events: Sequence[FileEvent],
                   deadline: float, error: TransientError) -> None:
        """Finish our commit after an error of unknown outcome, by the mark rule: tried
        again every SETTLE_EVERY while `deadline` allows, then CommitInterrupted."""
        uris = {e.uri for e in events}
        for _ in SETTLE_EVERY.tries(self.sleep, until=deadline, wait_first=True):
            try:
                self.wait_idle(table, deadline)
                logged = [e for e in self.ledger.latest(display)
                          if e.uri in uris and e.stage == stage and e.state == COMMITTING]
                if logged:
                    self.settle(table, logged[0])
                    self.replaced(table, logged[0].replaced)
                else:
                    self.attach_new(table, stage, None, events)
                return
            except TransientError as exc:
                error = exc
        raise CommitInterrupted(
            f"{_files(events)}: commit into {display} interrupted ({error}); run the same "
            "command again to finish it (no file will be loaded twice)")

    def wait_idle(self, table: str, deadline: float) -> None:
        """Wait until no commit query of ours on `table` runs (an ATTACH whose answer was
        lost may still be running on the server)."""
        prefix = f"{self.holder.query_prefix}{_scope(table)}-"
        for _ in IDLE_POLL.tries(self.sleep, until=deadline):
            rows = self.sql.rows(f"SELECT count() AS n FROM system.processes WHERE "
                                 f"startsWith(query_id, {quote_str(prefix)})")
            if not rows or int(rows[0]["n"]) == 0:
                return

    def run(self, statement: str, table: str = "") -> None:
        """A statement whose query id says who runs it, for which table (wait_idle)."""
        scope = _scope(table) if table else "x"
        self.sql.command(statement, f"{self.holder.query_prefix}{scope}-{os.urandom(4).hex()}")

    # -- stages no commit needs ------------------------------------------------------
    def drop_orphans(self, rows: list[dict], lease: float) -> int:
        """Drop the stages in `rows` (name, age in seconds) that no commit needs: their
        process is gone (or, elsewhere, a day old): orphans.py."""
        keep = committing_stages(self.sql, [r["name"] for r in rows])
        dropped = 0
        for row in rows:
            if row["name"] not in keep and orphan(row["name"], int(row["age"]),
                                                  self.exclusive, self.holder, lease):
                dropped += self.drop_stage(row["name"])
        return dropped

    def drop_stage(self, name: str) -> bool:
        """Drop chload.<name>, a stage no commit needs: housekeeping, never the reason a
        load fails. A stage a killed run was creating can be listed before the server
        has written its metadata file (18.16 adds the table, then renames its `.sql`
        into place); a DROP then fails with "File not found" and the server keeps the
        table. So a failed DROP is tried again (STAGE_DROP), then the stage is left for
        the next run, which drops it the same way."""
        for _ in STAGE_DROP.tries(self.sleep):
            with contextlib.suppress(ChloadError):
                self.run(f"DROP TABLE IF EXISTS {DATABASE}.{name}")
                return True
        return False


def _scope(table: str) -> str:
    """The part of a commit query's id that names its table (wait_idle)."""
    return lock_name(table)[5:13]
