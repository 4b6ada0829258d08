"""The end of a cluster load, apart from the loading itself (cluster/target.py): the stages'
and route tables' drops (on threads of their own, waited for by flush and close), the
shard servers' counters read at the start and the end of the data (shard_load.py), the
per-shard report, and the shards' last writes and closing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence

from chload.commit.ledger import LOADED, FileEvent
from chload.errors import ChloadError
from chload.targets.cluster import shard_load
from chload.targets.cluster.layout import Shard, at_once, each_at_once
from chload.targets.cluster.round import Round
from chload.targets.server.target import ServerTarget


class Ending:
    """ClusterTarget's end of a run (a mixin: the attributes are ClusterTarget's)."""

    entry: ServerTarget
    shards: list[Shard]
    _busy_guard: threading.Lock
    _dropping: list[threading.Thread]
    _counters: list[shard_load.Counters | BaseException]
    _counting: threading.Thread | None
    _ending: threading.Thread | None
    _ends: list[shard_load.Counters | BaseException]
    _loaded_at_end: dict[int, list[FileEvent]]
    _end_drops: dict[int, list[str]]
    _round: Round

    def _read_counters(self) -> list[shard_load.Counters | BaseException]:
        return each_at_once([(lambda s=s: shard_load.read(s.target.rows))  # type: ignore[misc]
                             for s in self.shards])


    def _drop(self, stage: str | None, route: str | None, shards: Sequence[Shard]) -> None:
        """Drop the route and the stages, at once (one the server did not drop now is
        tried again at close; a stage of a process gone is an orphan the next run drops)."""
        calls: list[Callable[[], None]] = [] if route is None else [
            lambda: self.entry._drop(route)]
        if stage is not None:
            calls += [(lambda s=s: s.target._drop(stage)) for s in shards]  # type: ignore[misc]
        at_once(calls)

    def _drop_later(self, stage: str | None, route: str | None,
                    shards: Sequence[Shard]) -> None:
        """`_drop` on a thread of its own: a unit's answer does not wait for it; waited
        for by flush and close. (The last round's stages: `_drop_stage`.)"""
        def drop() -> None:
            with contextlib.suppress(ChloadError):  # left over: an orphan the next run drops
                self._drop(stage, route, shards)

        thread = threading.Thread(target=drop, name="chload_drop", daemon=True)
        with self._busy_guard:
            self._dropping.append(thread)
        thread.start()

    def _drop_stage(self, stage: str, shards: Sequence[Shard]) -> None:
        """A committed unit's stage: dropped now (on a thread), or, in the last round,
        at the end of the run, after its last writes (`flush`, `_drop_end`)."""
        if not self._round.final:
            self._drop_later(stage, None, shards)
            return
        with self._busy_guard:
            for shard in shards:
                self._end_drops.setdefault(shard.number, []).append(stage)

    def _drop_end(self) -> None:
        """The last round's stages, each shard's in turn on a thread of its own, once the
        run's last ledger writes are done (flush): dropped with those writes, all the
        DROPs at once slowed the writes and held the loader's GIL. A stage left by a
        crash before is an orphan the next run drops (committer.py rule 6)."""
        with self._busy_guard:
            drops, self._end_drops = self._end_drops, {}
        for shard in self.shards:
            stages = drops.get(shard.number, [])

            def drop(shard: Shard = shard, stages: list[str] = stages) -> None:
                for stage in stages:
                    with contextlib.suppress(ChloadError):
                        shard.target._drop(stage)

            if stages:
                thread = threading.Thread(target=drop, name="chload_drop", daemon=True)
                with self._busy_guard:
                    self._dropping.append(thread)
                thread.start()

    def _dropped(self) -> None:
        """Wait for the drops under way (`_drop_later`)."""
        with self._busy_guard:
            threads, self._dropping = self._dropping, []
        for thread in threads:
            thread.join()

    def cost_report(self) -> dict:
        """When the rows moved (the entry server routes them: its data requests); the
        per-unit commit costs are per shard (shard_report)."""
        entry = self.entry.cost_report()
        return {k: entry[k] for k in ("first_byte_s", "data_s") if k in entry}

    def shard_report(self) -> list[dict]:
        """Per shard: where, rows and bytes committed this run, seconds committing, and
        how busy its server was meanwhile (`server`: shard_load.saturation; {} when its
        counters could not be read, which fails nothing)."""
        if self._counting is not None:
            self._counting.join()
        if self._ending is not None:
            self._ending.join()
        ends = (self._ends or self._read_counters()) if self._counters else []
        report = []
        for i, s in enumerate(self.shards):
            start, end = (self._counters[i], ends[i]) if ends else (None, None)
            server = (shard_load.saturation(start, end, s.target.caps.max_threads)
                      if isinstance(start, shard_load.Counters)
                      and isinstance(end, shard_load.Counters) else {})
            report.append({"shard": s.number, "weight": s.weight, "replica": s.replica.name,
                           "url": s.target.url.display, "rows": s.rows, "bytes": s.bytes,
                           "seconds": round(s.seconds, 3), "server": server})
        return report

    def flush(self) -> None:
        """The shards' waiting `loaded` events (and the entry's; the last round's are
        held for this one INSERT per shard: `_commit`), at once, with their kept locks'
        release, the stages' drops and the shard servers' counters at the end of the load
        (read here, with the run's last writes, for shard_report)."""
        if self._counting is not None and self._ending is None:
            self._counting.join()
            if self._counters:
                self._ending = threading.Thread(
                    target=lambda: setattr(self, "_ends", self._read_counters()),
                    name="chload_counters", daemon=True)
                self._ending.start()
        with self._busy_guard:
            held, self._loaded_at_end = self._loaded_at_end, {}
        at_once([(lambda s=s: s.target.committer.release_kept()) for s in self.shards]
                + [(lambda s=s: _flush(s, held.get(s.number, []))) for s in self.shards]
                + [self.entry.flush])
        self._drop_end()
        self._dropped()

    def close(self, failed: bool = False) -> None:
        """Close the shards' targets (the entry is its opener's to close), once the
        stages' drops are done."""
        self._drop_end()
        self._dropped()
        each_at_once([(lambda s=s: _release_and_close(s))  # type: ignore[misc]
                      for s in self.shards])


def _flush(shard: Shard, held: Sequence[FileEvent]) -> None:
    """The shard's `loaded` events, while its kept lock is released (flush): the lock
    guards attaches, and `committing` already says these attached (one round trip in
    the tail instead of a chain of two)."""
    shard.target.loaded.add(e.moved(LOADED) for e in held)  # (writes them if due)
    shard.target.flush()  # (the rest: no round trip when none is left)


def _release_and_close(shard: Shard) -> None:
    try:
        shard.target.committer.release_kept()
    finally:
        shard.target.close()
