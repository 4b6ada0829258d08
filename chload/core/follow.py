"""Following files: a load that lists its sources again every `--poll` seconds and loads
what is new, each unit exactly once, until SIGINT or SIGTERM.

Each poll is one run of `load.load_table` over a fresh listing, planned against the
ledger as any load is (planner.decide, streamed: a poll holds what is new, never the
history; an S3 prefix with --after-last-key is listed only after its last key loaded).
A signal sets `stop`: no unit starts after it, the units in flight end committed or not
at all (the committer), and the run ends with its report.

Invariants (docs/sources-files.md, "Following a directory or a prefix", is the user's
side):
- a unit that may still be written (Source.grows: a local file) is taken only once
  unchanged since the previous poll's listing began (its mtime before it): a file
  written slowly is never loaded half; an object (S3, HDFS) is taken when listed;
- a file changed since it was loaded is said once, in the poll that finds it: not
  loaded again (its earlier rows stay), or with --force loaded again whole. The first
  pass with --force loads every file again, as a load with --force does; later polls
  load again only the files that changed;
- each poll's `loaded` events are written before the next poll plans, so the next
  plan skips them;
- a poll costs what is new, not the history: what the table holds by the ledger is
  kept from poll to poll as compact keys (`Known`), and a poll asks the ledger only
  for the units committed since the previous poll asked (Ledger.loaded_since: their
  `committing` or `loaded` events, those of other runs from LATE_NS before that ask);
  the whole is asked again, with crashed commits settled first (Target.recover), at
  the first poll, after a poll with a failure, every RECOVER_SECONDS, and when the
  table is not as it was (dropped, re-created, emptied). Another loader committing
  into the table is so learned before the next plan; a unit it commits while a poll
  runs is refused by the committer's survey (committed since the poll began).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from chload.commit.known import Events, KnownUnits, key
from chload.commit.ledger import FileEvent, Ledger, TableState
from chload.core import load as steps, plan as planner
from chload.core.finish import _committed_any, _finish_reported, _run_record
from chload.core.report import LoadReport, LoadSpec, shards_of
from chload.core.run import LOADED_ELSEWHERE, LOADED_IN_PART, Event, FileResult, Listener, Poll
from chload.errors import ChloadError, NothingMatched, SourceError, TransientError
from chload.runtime import stopping
from chload.sources.base import Skipped, SourceFile
from chload.sources.run import RunSources
from chload.targets.base import Target

POLL_SECONDS = 30.0  # --poll's default
# A file's mtime comes from the kernel's coarse clock, which may be a tick behind
# time.time_ns(): a file written just after a listing began must not look older.
CLOCK_SLACK_NS = 50_000_000
# A run that follows for days loads millions of files: its report lists every failure
# and the first units that loaded (its counts are of all), so its memory stays bounded.
LISTED_RESULTS = 1000
# A file that failed is tried again after 1 poll, then 2, 4, ... up to this many: a bad
# file (or a README.txt in the directory) costs a load and a ledger event now and then,
# not every poll; one that failed on a server gone loads once it is back.
RETRY_POLLS_MAX = 16
# A `loaded` event may reach the ledger a while after its time (`seq`, by its writer's
# clock): another loader writes its events in batches (commit/ledger.py LoadedEvents),
# and hosts' clocks differ. Each poll asks for other runs' events from this long before
# its previous ask too (those met again are merged as no change).
LATE_NS = 60_000_000_000
# What crashed commits left (Target.recover: a look at the table's whole ledger) is
# settled, and the keys asked whole, by the first poll, by a poll after one with a
# failure, and else this often (a stage a crashed neighbour left is dropped then, and a
# neighbour whose clock is more than LATE_NS behind is learned); between, the
# committer's survey settles a broken lock before any commit (committer.py rule 3).
RECOVER_SECONDS = 600.0
# Keys learned since the previous poll merged in Python at most (or an eighth of those
# known, if more); more are asked whole, the engine sorting them.
MERGED_MOST = 4096


@dataclass(slots=True)
class Known:
    """What the table holds by the ledger, kept from poll to poll as KnownUnits' compact
    keys (16 bytes a unit, sorted): asked whole (Ledger.known) at the first poll and
    whenever the table is not as it was at the previous ask (dropped, re-created under
    another uuid, holding no rows) or much came meanwhile, else only the keys of the
    events since that ask (Ledger.loaded_since), merged in. For --after-last-key, each
    prefix's greatest uri loaded: asked once, then moved on by this run's loads (a key
    another run loaded past it is listed again, and skipped by the keys)."""

    ledger: Ledger
    table: str  # as the ledger names it (TableName.display)
    run_id: str
    uris: array = field(default_factory=lambda: array("Q"))
    identities: array = field(default_factory=lambda: array("Q"))
    events: Events | None = None  # the ledger's events of some uris (KnownUnits.events)
    state: TableState | None = None  # the table at the last ask (None: ask whole)
    asked_ns: int = 0
    last: dict[str, str] = field(default_factory=dict)  # --after-last-key: prefix -> uri

    def __call__(self, state: TableState) -> tuple[KnownUnits, str]:
        """The keys for a plan of the table as it is now (`state`), and why the ledger's
        other loads are not the table's (load.KnownOf)."""
        asked, why, new = time.time_ns(), "", None
        if self.state is not None and _same_table(self.state, state):
            new = self.ledger.loaded_since(self.table, state, self.asked_ns - LATE_NS,
                                           self.run_id, self.asked_ns)
        if new is None or len(new) // 2 > max(MERGED_MOST, len(self.uris) // 8):
            known, why = self.ledger.known(self.table, state)
            self.uris, self.identities = known.uris, known.identities
            self.events = known.events if len(known) else self._events  # (none known yet:
            self.last.clear()  # the units merged in later are asked of the ledger)
        else:
            self.merge(new)
        self.state, self.asked_ns = state, asked
        known = KnownUnits(self.uris, self.identities)
        if self.events is not None:
            known.events = self.events
        return known, why

    def _events(self, uris: list[str]) -> Mapping[str, FileEvent]:
        return self.ledger.loaded_of(self.table, uris)

    def merge(self, pairs: array) -> None:
        """Keys (uri's, identity's, in pairs, in the order of the uri's) into the run's:
        a known uri takes the identity, a new one is inserted in order (the arrays
        copied once, whatever the count)."""
        inserted: list[tuple[int, int, int]] = []
        for n in range(0, len(pairs), 2):
            k, i = pairs[n], pairs[n + 1]
            at = bisect_left(self.uris, k)
            if at < len(self.uris) and self.uris[at] == k:
                self.identities[at] = i
            else:
                inserted.append((at, k, i))
        if not inserted:
            return
        uris, identities, start = array("Q"), array("Q"), 0
        for at, k, i in inserted:
            uris += self.uris[start:at]
            identities += self.identities[start:at]
            uris.append(k)
            identities.append(i)
            start = at
        self.uris = uris + self.uris[start:]
        self.identities = identities + self.identities[start:]

    def learn(self, results: list[FileResult]) -> None:
        """After a poll: its loads move each prefix's last key on; units another run
        committed while the poll ran (the committer found them taken) are asked by uri
        and merged in."""
        for r in results:
            for prefix, last in self.last.items():
                if r.status != "failed" and r.uri.startswith(prefix) and r.uri > last:
                    self.last[prefix] = r.uri
        taken = [r.uri for r in results if r.note in (LOADED_ELSEWHERE, LOADED_IN_PART)]
        if taken and self.events is not None:
            pairs = sorted((key(uri), key(e.identity)) for uri, e in self.events(taken).items())
            self.merge(array("Q", [k for pair in pairs for k in pair]))

    def last_loaded(self, prefix: str) -> str:
        """The greatest uri under `prefix` loaded into the table (--after-last-key: where
        its listing starts), asked of the ledger once."""
        if prefix not in self.last:
            self.last[prefix] = self.ledger.last_loaded(
                self.table, self.state or TableState(False), prefix)
        return self.last[prefix]


def _same_table(before: TableState, now: TableState) -> bool:
    """Whether keys asked of the table as it was `before` stand for it `now`, with the
    events since: the same table (by uuid, where it has one), not emptied; or a table
    made since (every load into it came after that ask)."""
    return now.exists and now.rows > 0 and (not before.exists or before.uuid == now.uuid)


@dataclass(slots=True)
class _Run:
    """What a run that follows carries from poll to poll: the report it adds to, the
    files whose change it has said already (uris: only files that changed), the files
    that failed (held back a few polls), and when the previous poll's listing began
    (ns)."""

    report: LoadReport
    looked_ns: int
    known: Known
    recover_at: float = 0.0  # (time.monotonic) from when a poll settles crashed commits
    told: set[str] = field(default_factory=set)
    held: dict[str, tuple[int, int]] = field(default_factory=dict)  # a failed file's uri:
    # the poll from which it is tried again, and the polls it waited


def follow(spec: LoadSpec, target: Target, sources: RunSources, listener: Listener,
           stop: threading.Event | None = None) -> LoadReport:
    """Load the spec's files into its table, then every `spec.poll` seconds what is new,
    until `stop` is set (api.load: by SIGINT or SIGTERM, `on_signals`; a pipelines
    file's runner: runtime.stopping). Each poll ends with a `poll` Event. An error
    before anything committed is raised; after, it ends the run with its report (a
    TransientError of a later poll is that poll's, and the next poll tries again)."""
    started_ns, clock = time.time_ns(), time.monotonic()
    table = planner.parse_table(spec.table, steps.default_database(target))
    for pattern in spec.sources:
        sources.of(pattern)  # unknown schemes, before anything is listed
    steps.refuse_unread(spec, sources.options())
    stop = stop or threading.Event()
    every = spec.poll or POLL_SECONDS
    report = LoadReport(table.display, target.display, os.urandom(6).hex())
    report.unit = sources.unit(spec.sources)
    with target.for_table(table.sql, spec.shards, spec.shard_by, os.environ) as t, \
            stopping.registered(stop):  # (a pipelines file's loads: its runner stops them)
        run = _Run(report, started_ns - int(every * 1e9),
                   Known(t.ledger, table.display, report.run_id))
        if spec.after_last_key:  # (where each prefix's listing starts: kept by the run)
            sources.context = replace(sources.context, last_loaded=run.known.last_loaded)
        try:
            _polls(spec, t, table, sources, listener, run, stop, every)
        except ChloadError as exc:
            if not _committed_any(t, run.report):
                raise
            run.report.errors.append(str(exc))
        run.report.seconds = time.monotonic() - clock
        run.report.listing_calls = sources.listing_calls()
        run.report.shards = shards_of(t.shard_report())
        _finish_reported(t, run.report, _run_record(spec, run.report, started_ns, sources))
    return run.report


def _polls(spec: LoadSpec, target: Target, table: planner.TableName, sources: RunSources,
           listener: Listener, run: _Run, stop: threading.Event, every: float) -> None:
    """Poll after poll, each begun `every` seconds after the one before (at once if it
    took longer), until stopped."""
    number = 0
    while not stop.is_set():
        number += 1
        began, look_ns = time.monotonic(), time.time_ns()
        try:
            poll = _poll(spec, target, table, sources, listener, run, number, stop)
        except TransientError as exc:
            if number == 1:
                raise
            poll = Poll(number, error=str(exc), seconds=time.monotonic() - began)
        run.looked_ns = look_ns
        listener(Event("poll", poll=poll))
        stop.wait(max(0.0, began + every - time.monotonic()))


def _poll(spec: LoadSpec, target: Target, table: planner.TableName, sources: RunSources,
          listener: Listener, run: _Run, number: int, stop: threading.Event) -> Poll:
    """One poll: list, plan against the ledger, load what is new; files changed since
    loaded said once (loaded again with --force). Its results go into the run's report."""
    began, calls_before = time.monotonic(), sources.listing_calls()
    target.begin_run()  # (what earlier polls committed is another run's to the committer)
    waiting, walks = _Count(), _Count()
    listed = _settled(_listing(spec, sources, walks), sources,
                      run.looked_ns - CLOCK_SLACK_NS, waiting, run, number)
    done = _load(replace(spec, force=spec.force and number == 1), target, table, sources,
                 listed, listener, run, stop)
    results = _started(done.files)
    run.known.learn(results)
    if any(r.status == "failed" for r in results):  # (a commit cut short: settled first)
        run.recover_at = 0.0
    refused = [r for r in results if r.changed and r.status == "failed"]
    if refused and spec.force and not stop.is_set():  # (a later poll: the changed ones)
        again = _load(spec, target, table, sources, _relisted(sources, refused), listener,
                      run, stop)
        results = [r for r in results if r not in refused] + _started(again.files)
        refused = [r for r in results if r.changed and r.status == "failed"]
    said = [r for r in refused if r.uri in run.told]  # said by an earlier poll
    results = [r for r in results if r not in said]
    changed = tuple(r.uri for r in refused if r not in said)
    run.told.update(changed)
    _add(run.report, _once(run, results), done, first=number == 1)
    _hold(run, results, changed, number)
    with contextlib.suppress(ChloadError):  # (written with the run's last writes, which
        target.flush()  # report their error)
    return Poll(number, files=sum(r.status == "loaded" for r in results),
                rows=sum(r.rows for r in results if r.status == "loaded"),
                listing_calls=sources.listing_calls() - calls_before + walks.n,
                waiting=waiting.n,
                changed=changed,
                reloaded=tuple(r.uri for r in results if r.changed and r.status == "loaded"),
                failed=sum(r.status == "failed" for r in results) - len(changed),
                seconds=time.monotonic() - began)


def _load(spec: LoadSpec, target: Target, table: planner.TableName, sources: RunSources,
          listed: Iterable[SourceFile | Skipped], listener: Listener, run: _Run,
          stop: threading.Event) -> LoadReport:
    recover = time.monotonic() >= run.recover_at
    if recover:  # (and the keys asked whole: a commit settled failed is no longer known)
        run.recover_at = time.monotonic() + RECOVER_SECONDS
        run.known.state = None
    return steps.load_table(spec, target, table, sources, listed, listener,
                            run_id=run.report.run_id, record=False, halt=stop,
                            known_of=run.known, recover=recover)


def _started(results: list[FileResult]) -> list[FileResult]:
    """Results of units that ran (a signal leaves the others for the next run)."""
    return [r for r in results if r.status != "not-started"]


class _Count:
    n = 0


def _listing(spec: LoadSpec, sources: RunSources,
             walks: _Count) -> Iterator[SourceFile | Skipped]:
    """Every file the sources name now (load.stream_sources' listing), a pattern that
    names nothing being an empty one: the files may come later. `walks` counts each
    pattern whose source counts no requests of its own (Source.listing_calls: a local
    walk, HDFS's one engine query) as one listing call."""
    def each() -> Iterator[SourceFile | Skipped]:
        for pattern in spec.sources:
            before = sources.listing_calls()
            try:
                yield from sources.list(pattern)
            except NothingMatched:
                pass
            if sources.listing_calls() == before:
                walks.n += 1
    return steps._told(each(), sources)


def _settled(files: Iterable[SourceFile | Skipped], sources: RunSources, since_ns: int,
             waiting: _Count, run: _Run, number: int) -> Iterator[SourceFile | Skipped]:
    """The files, less those that may still be written: a unit of a source whose units
    grow (a local file) modified since `since_ns` (the previous poll's listing, less
    the clock's slack) waits for the next poll; less those that failed, until their
    poll to be tried again (`_hold`). What listing made for them is released. Anything
    else a listing yields (a count of units it found loaded) passes."""
    for f in files:
        if not isinstance(f, SourceFile):
            yield f
        elif run.held.get(f.uri, (0, 0))[0] > number:
            sources.release([f])
        elif not f.is_stream and f.mtime_ns >= since_ns and sources.grows(f):
            waiting.n += 1
            sources.release([f])
        else:
            yield f


def _once(run: _Run, results: list[FileResult]) -> list[FileResult]:
    """The results for the run's report, each file's failure counted once: a file tried
    again (held: it failed before) that fails is not counted again, and one that now
    loads is no longer a failure of the run."""
    kept = []
    for r in results:
        if r.uri not in run.held:
            kept.append(r)
        elif r.status != "failed":  # (loaded now, or by another run)
            run.report.files_failed -= 1
            run.report.files = [f for f in run.report.files
                                if f.uri != r.uri or f.status != "failed"]
            kept.append(r)
    return kept


def _hold(run: _Run, results: list[FileResult], changed: tuple[str, ...],
          number: int) -> None:
    """Files that failed in this poll wait before they are tried again, twice as many
    polls as the last time (up to RETRY_POLLS_MAX); one that loaded waits no more.
    (A file changed since loaded is refused at no cost: not held.)"""
    for r in results:
        if r.status != "failed":
            run.held.pop(r.uri, None)
        elif r.status == "failed" and r.uri not in changed and r.uri not in run.told:
            waited = run.held.get(r.uri, (0, 0))[1]
            wait = min(RETRY_POLLS_MAX, max(1, waited * 2))
            run.held[r.uri] = (number + wait + 1, wait)


def _relisted(sources: RunSources, results: list[FileResult]) -> Iterator[SourceFile]:
    """The files of `results` listed again by their uris (--force: loaded again whole);
    one gone since is left to the next poll."""
    for r in results:
        try:
            for f in sources.list(r.uri):
                if isinstance(f, SourceFile) and f.uri == r.uri:
                    yield f
                elif isinstance(f, SourceFile):
                    sources.release([f])
        except SourceError:
            continue


def _add(report: LoadReport, results: list[FileResult], done: LoadReport,
         first: bool) -> None:
    """A poll's results into the run's report: the units it ran (listed: every failure,
    and others up to LISTED_RESULTS), and the first pass's skipped files (a later poll
    skips the same files again: not counted twice)."""
    report.add_units(results, LISTED_RESULTS, done.files_skipped if first else None)
    report.created_table = report.created_table or done.created_table
    report.table_reset = report.table_reset or done.table_reset
    report.recovered += done.recovered
    report.saturation = done.saturation or report.saturation
    report.concurrency = done.concurrency or report.concurrency
    report.costs = done.costs or report.costs
    report.notes += [n for n in done.notes if n not in report.notes]
    report.schema_changes += done.schema_changes  # (--on-new-column add: a poll's)


@contextlib.contextmanager
def on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop` (on the main thread: where Python runs handlers);
    a second signal acts as it would have (the handlers before are back)."""
    with stopping.on_signals(stop.set):
        yield
