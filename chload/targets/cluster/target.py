"""The cluster target: a Distributed table loaded shard by shard, exactly once per
(unit, shard), rows on the shard the Distributed engine would put them on.

For a `Distributed(cluster, db, local, key)` table, `for_table` (cluster/open.py) opens a
ServerTarget per shard, with its own ledger, committer and lock. By rows, each unit goes
through a temporary Distributed table over per-shard stages (insert_distributed_sync=1),
so the server routes every row by the table's own key; by file, a unit goes whole to one
shard chosen by a hash of its uri. docs/target-cluster.md explains both and argues why a
crash between two shards' commits loses and doubles nothing.

Invariants: a unit is loaded when every shard it goes to has committed its share, and a
rerun commits only on the shards whose ledger lacks it; every shard's stages go through
that shard's Committer (`_commit`): nothing here attaches.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from chload.commit.committer import stage_name
from chload.commit.ledger import DATABASE, LOADED, FileEvent, Ledger
from chload.commit.locks import sha1
from chload.commit.rejects import ErrorBudget
from chload.errors import ChloadError, DataError, SourceError, TransientError, UsageError
from chload.runtime.faults import crash_point
from chload.schema import Column, display_table, quote_ident, split_table
from chload.sources import identity
from chload.sources.base import SourceFile
from chload.targets.base import Loaded, LoadJob, Target
from chload.targets.batching import group_small_files
from chload.targets.cluster import columns as cluster_columns, shard_load
from chload.targets.cluster.end import Ending
from chload.targets.cluster.layout import (
    Distributed,
    Shard,
    at_once,
    each_at_once,
    parse_distributed as parse_distributed,
    plain_engine as plain_engine,
)
from chload.targets.cluster.ledger import LAYOUT, ClusterLedger, adding_up, file_shares, layout_of
from chload.targets.cluster.round import Round, Unit
from chload.targets.server.http import TargetURL
from chload.targets.server.stages import seal
from chload.targets.server.target import ServerTarget, _event

if TYPE_CHECKING:
    from chload.runtime.adaptive import Controller



# A shard's `loaded` events are written this often (a unit's `committing` event already
# settles a crash): each write is a part of the ledger and its summary on the shard
LOADED_EVERY_S = 5.0


@dataclass(slots=True)
class _Loaded:
    """What the ledgers of the shards say of the units: shard number -> uri -> event."""

    by_shard: dict[int, dict[str, FileEvent]] = field(default_factory=dict)


class ClusterTarget(Ending):
    """A Distributed table's shards; the target server (`entry`) keeps the run history,
    routes rows, and answers SQL. Implements the Target protocol."""

    reads_pipes = False  # piped units (Kafka, databases) are not routed to shards yet
    single_writer = False
    wants_key_order = False  # (no gain shown through the routing)
    notes: Sequence[str] = ()

    def __init__(self, entry: ServerTarget, table: str, dist: Distributed,
                 shards: list[Shard], by_file: bool) -> None:
        self.entry, self.table, self.dist, self.shards = entry, table, dist, shards
        self.by_file = by_file
        self.table_display = display_table(table)
        self.local = dist.local
        self.total_weight = sum(s.weight for s in shards)
        self.display = (f"{entry.display}: {self.table_display} on cluster {dist.cluster} "
                        f"({len(shards)} shards, by {'file' if by_file else 'row'})")
        self.ledger: Ledger = ClusterLedger(self)
        self.known = _Loaded()
        self.columns_read: list[Column] | None = None  # (cluster_open: table_columns)
        self.replicas: list[tuple[str, TargetURL]] = []  # those no shard target is on
        self.read_ahead: dict[int, list] = {}  # shard -> its ledger's answers (_recover)
        self._round = Round()
        self._counters: list[shard_load.Counters | BaseException] = []  # at open_streams
        self._counting: threading.Thread | None = None
        self.relayout: list[int] = []  # shards whose layout record to write (cluster_ledger)
        self._layout_written = threading.Event()
        self._layout_written.set()
        self._layout_error: ChloadError | None = None
        self._busy_since: dict[int, list] = {}  # shard -> [commits under way, since when]
        self._busy_guard = threading.Lock()
        self._dropping: list[threading.Thread] = []  # _drop_later
        self._end_drops: dict[int, list[str]] = {}  # shard -> the last round's stages
        self._loaded_at_end: dict[int, list[FileEvent]] = {}  # the last round's (_commit)
        self._ending: threading.Thread | None = None  # the counters at the end (flush)
        self._ends: list[shard_load.Counters | BaseException] = []
        for shard in shards:
            shard.target.committer.linger = lambda: self._round.in_flight > 1
            shard.target.loaded.every = LOADED_EVERY_S
        # The route writes each shard's rows to the replica chload chose: the target
        # server's own, else the first that answers, as in_order picks (open_shards).
        entry.insert_params = {"insert_distributed_sync": "1", "load_balancing": "in_order",
                               "prefer_localhost_replica": "1"}

    # -- what the entry server answers -------------------------------------------------
    @property
    def database(self) -> str:
        return self.entry.database

    @property
    def workdir(self) -> str:
        return self.entry.workdir

    @property
    def engine_name(self) -> str:
        return self.entry.engine_name

    def has_type(self, name: str) -> bool:
        return self.entry.has_type(name)

    def command(self, sql: str) -> None:
        self.entry.command(sql)

    def rows(self, sql: str) -> list[dict]:
        return self.entry.rows(sql)

    def text(self, sql: str, fmt: str) -> str:
        return self.entry.text(sql, fmt)

    def binary(self, sql: str, fmt: str) -> bytes:
        return self.entry.binary(sql, fmt)

    def infer_rows(self, sql: str) -> list[dict]:
        return self.entry.infer_rows(sql)

    def reader(self, file: SourceFile, fmt: str, columns: Sequence[Column] | None) -> str:
        return self.entry.reader(file, fmt, columns)

    def table_columns(self, table: str) -> list[Column] | None:
        """The Distributed table's columns as read when it was opened (cluster_layout
        `describe`), the first time; asked again, the server's answer."""
        if table == self.table and self.columns_read is not None:
            columns, self.columns_read = self.columns_read, None
            return columns
        return self.entry.table_columns(table)

    def create_table(self, table: str, columns: Sequence[Column], order_by: str | None,
                     partition_by: str | None, engine: str = "MergeTree") -> None:
        raise UsageError(f"table {display_table(table)}: chload does not create tables on "
                         f"cluster {self.dist.cluster}; create the local and Distributed "
                         "tables first")

    def table_engines(self, table: str) -> list[tuple[str, str]]:
        """Each shard's local table (read as the cluster was opened: check_locals)."""
        if table != self.table:
            return self.entry.table_engines(table)
        return [(f"{s.local_display} on {s.name}",
                 next((r["engine_full"] for r in s.local if r["k"] == "engine"), ""))
                for s in self.shards]

    def add_columns(self, table: str, columns: Sequence[Column]) -> list[str]:
        """Every shard's local table, then the Distributed one (cluster/columns.py)."""
        if table != self.table:
            return self.entry.add_columns(table, columns)
        return cluster_columns.add_columns(self, columns)

    # -- planning ----------------------------------------------------------------------
    def recover(self, table: str) -> int:
        """Settle each shard's crashed commits (its own ledger and lock), and drop this
        machine's orphaned route tables on the target server."""
        settled = at_once([lambda s=s: self._recover(s) for s in self.shards] + [
            lambda: self.entry.committer.start(self.table, self.table_display)])
        return sum(settled[:-1])

    def _recover(self, shard: Shard) -> int:
        """Settle the shard's crashed commits, then read at once what planning asks of
        its ledger next (cluster_ledger: table state, loaded units, layout record): one
        round trip after recovery instead of two in a chain, each waiting for every
        shard."""
        settled = shard.target.committer.start(self.local, shard.local_display)
        ledger, local = shard.target.ledger, split_table(self.local)
        self.read_ahead[shard.number] = each_at_once([
            lambda: ledger.table_state(*local), lambda: ledger.loaded(shard.local_display),
            lambda: ledger.latest(f"{shard.local_display} {LAYOUT}", [LAYOUT])])
        return settled

    def default_workers(self, files: Sequence[SourceFile]) -> int:
        return self.entry.default_workers(files)

    def open_streams(self, streams: int, adapt: Controller | None = None) -> int:
        """Also the first reading of each shard server's counters (shard_load.py)."""
        if adapt is not None:
            adapt.freeze("fixed: a cluster's shards load at the estimate")
        for shard in self.shards:
            shard.target.open_streams(streams)
        self._record_layout()
        self._counting = threading.Thread(  # off the path to the first row (a round trip)
            target=lambda: setattr(self, "_counters", self._read_counters()),
            name="chload_counters", daemon=True)
        self._counting.start()
        opened = self.entry.open_streams(streams)
        self._round.gather = max(1, opened // 2)
        return opened

    def _record_layout(self) -> None:
        """The layout this run routes by, on each shard whose record of it is missing or
        old (cluster_ledger.check_layout allowed the change): written while the first
        units route, and waited for before any commit (`_layout_recorded`)."""
        layout, shards = layout_of(self), [s for s in self.shards if s.number in self.relayout]
        self.relayout = []
        if not shards:
            return
        self._layout_written.clear()

        def write() -> None:
            try:
                at_once([(lambda s=s: s.target.ledger.record([FileEvent(  # type: ignore[misc]
                    f"{s.local_display} {LAYOUT}", LAYOUT, layout, 0, 0, LAYOUT)]))
                    for s in shards])
            except ChloadError as exc:
                self._layout_error = exc
            finally:
                self._layout_written.set()

        threading.Thread(target=write, name="chload_layout", daemon=True).start()

    def _layout_recorded(self) -> None:
        """Before a commit: the layout record is written (or its error raised)."""
        self._layout_written.wait()
        if self._layout_error is not None:
            raise self._layout_error

    def plan_batches(self, files: Sequence[SourceFile], budget: ErrorBudget,
                     workers: int) -> list[tuple[SourceFile, ...]]:
        """By file: each shard's files batched as a server's are. By row: small files
        in groups too (gathered in the loader's engine, then routed as one)."""
        if budget.allows_errors and not self.by_file:
            raise UsageError(f"--max-errors/--max-error-ratio into {self.table_display} by "
                             "row: not supported yet (the server routes every row); load "
                             "with --shard-by file, or without an error budget")
        if budget.allows_errors:
            return [(f,) for f in files]
        if not self.by_file:
            return self._round.plan(self.entry.plan_batches(files, budget, workers))
        groups: list[tuple[SourceFile, ...]] = []
        for shard in self.shards:
            mine = [f for f in files if self._shard_for(f) is shard]
            groups += group_small_files(mine) if mine else []
        return groups

    def shard_of(self, uri: str) -> Shard:
        """The shard a whole unit goes to: by weight, from a hash of its uri."""
        return self._at_slot(int(sha1(uri.encode()).hexdigest()[:12], 16) % self.total_weight)

    def _shard_for(self, file: SourceFile) -> Shard:
        """The shard a whole unit goes to; every unit of a stream (a Kafka partition) to
        the same one, whose ledger then holds the stream's units in order (its commit
        checks the partition's position there: committer.py rule 5)."""
        return self.shard_of(file.position.stream if file.position else file.uri)

    def _at_slot(self, slot: int) -> Shard:
        """The shard whose weight range holds `slot` (as the Distributed engine maps
        `key % total weight`)."""
        for shard in self.shards:
            if slot < shard.weight:
                return shard
            slot -= shard.weight
        raise AssertionError("slot beyond the total weight")

    def responsible(self, uri: str) -> list[Shard]:
        return [self.shard_of(uri)] if self.by_file else list(self.shards)

    # -- loading -----------------------------------------------------------------------
    def load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> Loaded:
        if self.by_file:
            return self._on_shard(job, progress, lambda t, j, p: [t.load_file(j, p)])[0]
        return self._split(job, progress)[0]

    def load_batch(self, job: LoadJob, progress: Callable[[int, int], None]) -> list[Loaded]:
        if self.by_file:
            return self._on_shard(job, progress, lambda t, j, p: t.load_batch(j, p))
        return self._split(job, progress)

    def _on_shard(self, job: LoadJob, progress: Callable[[int, int], None],
                  load: Callable[[ServerTarget, LoadJob, Callable[[int, int], None]],
                                 list[Loaded]]) -> list[Loaded]:
        """A whole unit (or batch) into its shard's local table, as into one server."""
        self._layout_recorded()
        shard = self._shard_for(job.file)
        with self._busy(shard):
            done = load(shard.target, self._local_job(job), progress)
        self._count(shard, sum(d.rows for d in done), sum(d.bytes for d in done))
        return done

    def _local_job(self, job: LoadJob) -> LoadJob:
        return replace(job, table=self.local, table_display=self.shards[0].local_display)

    def _split(self, job: LoadJob, progress: Callable[[int, int], None]) -> list[Loaded]:
        """Route the unit's rows through a temporary Distributed table into a stage on
        every shard, then commit each stage where the shard's ledger lacks the unit."""
        with self._round.unit() as routed:
            return self._split_one(job, progress, routed)

    def _split_one(self, job: LoadJob, progress: Callable[[int, int], None],
                   routed: Callable[[], None]) -> list[Loaded]:
        todo = self._pending(job) or list(self.shards)  # none lacks it: --force
        stage = stage_name(self.entry.committer.holder)
        route = f"{stage}r"
        try:
            job = identity.as_read(job)
            self.entry._streams.stage_turn()
            at_once([(lambda s=s: s.target.command(
                f"CREATE TABLE {DATABASE}.{stage} AS {self.local}{s.stage_engine}"))
                for s in self.shards] + [lambda: self.entry.command(
                    f"CREATE TABLE {DATABASE}.{route} AS {self.table} ENGINE = Distributed("
                    f"{quote_ident(self.dist.cluster)}, {DATABASE}, {stage}, {self.dist.key})")])
            done, by_file = self._route(job, route, stage)
            self._drop_later(None, route, [])  # (not left for the tail: 10 DROPs fewer)
            sealed = at_once([lambda s=s: seal(s.target, stage)  # type: ignore[misc]
                               for s in self.shards])
            shares = {s.number: share for s, share in zip(self.shards, sealed, strict=True)}
            identity.check_read(job)
            by_file = adding_up(by_file, shares)
        except ChloadError:
            self._drop(stage, route, self.shards)
            raise
        routed()
        # one file's rows are known only from the shards' stages (its Loaded says 0)
        parsed = sum(d.rows for d in done) if job.batch else sum(n for n, _ in sealed)
        crash_point("cluster-routed")  # every shard's stage filled, none committed
        self._layout_recorded()
        # The bar counts a unit once committed: routed units queue for the shards' commit
        # locks, and counting them done made the ETA short. A unit of the last round waits
        # for every other to route, then all commit at once: it counts once routed.
        waits = self._round.final
        if waits:
            progress(parsed, sum(d.bytes for d in done))
        committed, failed = self._round.commit(
            Unit(job, stage, todo, shares, done, by_file), self._commit)
        if not waits:
            progress(parsed, sum(d.bytes for d in done))
        # A commit that may have attached (not a TransientError) keeps its stage: the
        # shard's next run settles it by the mark rule (committer.py rule 4).
        keep = {n for n, exc in failed.items() if not isinstance(exc, TransientError)}
        self._drop_stage(stage, [s for s in self.shards if s.number not in keep])
        if failed:
            raise next(iter(failed.values()))
        if not committed:
            return [Loaded(0, d.bytes, elsewhere=True) for d in done]
        if job.follows and len(committed) < len(todo):
            # (a stream's unit some of whose shards took another loader's: this run's
            # rows are those of the shards that took its own)
            return [Loaded(sum(shares[n][0] for n in committed), d.bytes, partly=True)
                    for d in done]
        if not job.batch:  # one file: the rows of the shares committed now
            return [Loaded(sum(shares[n][0] for n in committed), done[0].bytes)]
        return done

    def _route(self, job: LoadJob, route: str, stage: str,
               ) -> tuple[list[Loaded], dict[str, dict[int, int]] | None]:
        """Fill the route table (the server splits by the key and writes each shard's
        stage); a batch is gathered in the loader's engine first, where each file's rows
        per shard are counted (`_by_file`)."""
        entry = self.entry
        if job.batch:
            by_file: dict[str, dict[int, int]] = {}
            done = entry._gather(job, route, lambda memory: by_file.update(
                self._by_file(memory)))
            return done, by_file or None
        try:
            return [Loaded(0, entry._fill(job, route, fallback=False))], None
        except DataError:
            if entry.path_for(job) != "raw":
                raise
            for shard in self.shards:  # 18.16 reads fewer dialects: the loader's engine
                shard.target.command(f"TRUNCATE TABLE {DATABASE}.{stage}")
            return [Loaded(0, entry._push(job, route))], None

    def _by_file(self, memory: str) -> dict[str, dict[int, int]]:
        """A gathered batch's rows per file and shard: the key evaluated by the loader's
        engine on the rows as cast to the table's types, modulo the total weight, onto
        the weight ranges. The route's placement stays the server's; these counts are
        kept only if they add up to every shard's stage (cluster_ledger.adding_up); an
        engine that cannot evaluate the key leaves them out (rows 0 per file)."""
        try:
            rows = self.entry.engine.rows(
                f"SELECT _chload_file AS f, toUInt64(({self.dist.key}) % {self.total_weight}) "
                f"AS slot, count() AS n FROM {memory} GROUP BY f, slot", "batch rows per shard")
        except ChloadError:
            return {}
        found: dict[str, dict[int, int]] = {}
        for row in rows:
            shard = self._at_slot(int(row["slot"])).number
            per = found.setdefault(row["f"], {})
            per[shard] = per.get(shard, 0) + int(row["n"])
        return found

    def _commit(self, units: list[Unit]) -> list[tuple[set[int], dict[int, BaseException]]]:
        """Each unit's share on each shard into its local table with its own ledger
        entry, each shard's units as one group (committer.py `commit_group`), the shards at
        once; per unit, the shards that attached its share and the errors of those that
        failed. A shard that fails stops nothing of the others: a retry loads only the
        shards still lacking the unit. A batch's files get their own rows of the shard
        where they were counted (`by_file`), else 0 (the shard's total is right).

        A stream's unit (Kafka, change capture: its commit follows its stream, committer.py
        rule 5) is committed first on the first shard that lacks it, and on the others only
        if it attached there: of two loaders of one partition, the one that shard takes is
        the one every shard takes, and a unit a crash leaves on some shards only is the
        stream's next unit, its range read again (sources/base.py `partly_committed`)."""
        outcomes: list[tuple[set[int], dict[int, BaseException]]] = [(set(), {}) for _ in units]
        held = self._round.final

        def on(shard: Shard, chosen: Callable[[Unit], bool]) -> None:
            mine = [(i, u) for i, u in enumerate(units)
                    if chosen(u) and any(s is shard for s in u.todo)]
            if mine:
                self._commit_on(shard, mine, outcomes, held)

        if not any(u.job.follows for u in units):
            at_once([(lambda s=s: on(s, lambda u: True)) for s in self.shards])  # type: ignore[misc]
            return outcomes
        at_once([(lambda s=s: on(s, lambda u: u.todo[0] is s))  # type: ignore[misc]
                 for s in self.shards])
        first_took = {id(u) for i, u in enumerate(units) if u.todo[0].number in outcomes[i][0]}
        at_once([(lambda s=s: on(s, lambda u: id(u) in first_took  # type: ignore[misc]
                                 and u.todo[0] is not s)) for s in self.shards])
        return outcomes

    def _commit_on(self, shard: Shard, mine: list[tuple[int, Unit]],
                   outcomes: list[tuple[set[int], dict[int, BaseException]]],
                   held: bool) -> None:
        """`mine` (index, unit) committed on `shard` as one group; each outcome noted."""
        events = {i: self._events(u, shard) for i, u in mine}
        committer = shard.target.committer
        for _, u in mine:  # a replaced partition: on every shard, also where it got none
            if u.job.mode == "replace-partitions":  # (the shards' targets are this run's)
                committer.use_mode(self.local, u.job.mode, u.job.run_id)
                committer.attacher.covers[u.stage] = sorted(
                    {p for _, parts in u.shares.values() for p in parts})
        crash_point(f"cluster-commit-shard-{shard.number}")  # (tests: one shard late)
        with self._busy(shard):
            results = shard.target.committer.commit_group(
                self.local, shard.local_display,
                [(u.stage, u.shares[shard.number][1], events[i], shard.target._started_ns)
                 for i, u in mine], [u.job.follows for _, u in mine])
        loaded: list[FileEvent] = []
        for _, u in mine:
            if u.job.mode == "replace-partitions":
                committer.attacher.covers.pop(u.stage, None)
        for (i, u), result in zip(mine, results, strict=True):
            if isinstance(result, BaseException):
                outcomes[i][1][shard.number] = result
            elif result:
                loaded += events[i]
                self._remember(shard, events[i])
                rows = u.shares[shard.number][0]
                self._count(shard, rows, u.read * rows // u.total)
                outcomes[i][0].add(shard.number)
        if held:  # the last round: written with the run's end (flush)
            with self._busy_guard:
                self._loaded_at_end.setdefault(shard.number, []).extend(loaded)
        else:
            shard.target.loaded.add(e.moved(LOADED) for e in loaded)  # once a second

    def _events(self, unit: Unit, shard: Shard) -> list[FileEvent]:
        """The unit's ledger events on `shard`: its files with their rows there."""
        rows = unit.shares[shard.number][0]
        job = unit.job
        return [_event(replace(job, file=f, table_display=shard.local_display), "",
                       rows=mine, read=bytes_read) for f, mine, bytes_read in
                file_shares(job, shard.number, rows, unit.read * rows // unit.total,
                            unit.done, unit.by_file)]

    def _pending(self, job: LoadJob) -> list[Shard]:
        """The shards whose ledger lacks any of the job's files at their identity. A file
        some shards have under another identity while others lack it (it changed after
        a crash between shards' commits) is refused: its shares would mix versions."""
        known = self.known.by_shard
        for f in job.files:
            events = {s.number: known.get(s.number, {}).get(f.uri) for s in self.shards}
            stale = [n for n, e in events.items() if e is not None and e.identity != f.identity]
            if stale and None in events.values():
                raise SourceError(
                    f"{f.uri}: changed since shard {stale[0]} loaded it, and shard "
                    f"{next(n for n, e in events.items() if e is None)} has not: its shares "
                    "would mix two versions; restore it, or drop the shards' rows of it and "
                    "load with --force")
        return [s for s in self.shards if any(
            (e := known.get(s.number, {}).get(f.uri)) is None or e.identity != f.identity
            for f in job.files)]

    def _remember(self, shard: Shard, events: Sequence[FileEvent]) -> None:
        for event in events:
            self.known.by_shard.setdefault(shard.number, {})[event.uri] = event

    def _count(self, shard: Shard, rows: int, read: int) -> None:
        shard.rows += rows
        shard.bytes += read

    @contextlib.contextmanager
    def _busy(self, shard: Shard) -> Iterator[None]:
        """A commit (by file: a load) on `shard`; its `seconds` are the wall time with at
        least one under way (units committing at once count once)."""
        with self._busy_guard:
            if shard.number not in self._busy_since:
                self._busy_since[shard.number] = [0, time.monotonic()]
            busy = self._busy_since[shard.number]
            busy[0] += 1
            if busy[0] == 1:
                busy[1] = time.monotonic()
        try:
            yield
        finally:
            with self._busy_guard:
                busy[0] -= 1
                if busy[0] == 0:
                    shard.seconds += time.monotonic() - busy[1]

    def begin_run(self) -> None:
        for shard in self.shards:
            shard.target.begin_run()

    def for_table(self, table: str, shards: Sequence[tuple[str, str]], shard_by: str,
                  env: Mapping[str, str]) -> AbstractContextManager[Target]:
        """Already the cluster of its Distributed table."""
        return contextlib.nullcontext(self)
