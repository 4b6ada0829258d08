"""Running a pipelines file's loads: one after another, or all at once when one follows.

When no load follows, each runs to its end in the file's order, its own target opened
and closed as `chload.load` does. When one follows (a Kafka topic, until SIGINT or
SIGTERM), they must run at once, each on a thread of this process: chDB holds one
engine path a process, so loads into the embedded target share one opening of it
(`api.shared_target`), and a server target's loader engine (chDB in memory) cannot
start beside it: such a mix, or two embedded directories, is refused up front. The
first SIGINT/SIGTERM ends every following load after its round in flight
(runtime.stopping); a load that does not follow goes on to its end; a second SIGINT
interrupts (a unit in flight is a killed unit: it loads on the next run).

Metrics ports are held for the whole run, so a load's series stay served after it ends
and every load of the file given one port shares it (core/metrics.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from chload import api
from chload.core import metrics
from chload.errors import ChloadError, UsageError
from chload.pipelines.file import Declared, Pipelines
from chload.runtime import stopping
from chload.targets.base import Target


@dataclass(frozen=True)
class Outcome:
    """One load's end: its report, or the one line of the error that ended it."""

    name: str
    report: api.LoadReport | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.report is not None and self.report.ok and not self.error


Done = Callable[[Outcome], None]


def together(pipelines: Pipelines) -> bool:
    """Whether the loads run at once (one follows); such a run's targets are checked:
    one embedded directory at most, not beside a server, and no table of it loaded
    twice at once."""
    if not any(load.follows for load in pipelines.loads):
        return False
    places = {load.name: api.where(load.spec.target) for load in pipelines.loads}
    embedded = {name: path for name, (_, path) in places.items() if path is not None}
    servers = [name for name, (_, path) in places.items() if path is None]
    if len(set(embedded.values())) > 1 or (embedded and servers):
        first, second = _two_apart(embedded, servers, places)
        raise UsageError(f"{pipelines.path}: loads {first} and {second} run at once (a load "
                         f"follows) into {places[first][0]} and {places[second][0]}: a "
                         "process holds one ClickHouse engine (one embedded directory, none "
                         "beside a server target); put them in two pipelines files")
    tables: dict[str, str] = {}
    for load in pipelines.loads:
        if load.name in embedded:
            other = tables.setdefault(load.spec.table, load.name)
            if other != load.name:
                raise UsageError(f"{pipelines.path}: loads {other} and {load.name} both load "
                                 f"{load.spec.table} of {places[load.name][0]} at once (a "
                                 "load follows); give them one table each, or two files")
    return True


def _two_apart(embedded: dict[str, str], servers: list[str],
               places: dict[str, tuple[str, str | None]]) -> tuple[str, str]:
    """Two loads that cannot share a process: two directories, or one beside a server."""
    first = next(iter(embedded))
    second = next((name for name, path in embedded.items() if path != embedded[first]),
                  servers[0] if servers else first)
    return first, second


def run(pipelines: Pipelines, done: Done) -> list[Outcome]:
    """Every load of the file (`done` told of each as it ends), in the file's order."""
    ports = {load.metrics_port for load in pipelines.loads} - {None}
    with contextlib.ExitStack() as held:
        for port in sorted(p for p in ports if p is not None):
            held.enter_context(metrics.serving(port))
        if together(pipelines):
            return _at_once(pipelines.loads, done)
        outcomes = []
        for load in pipelines.loads:
            outcomes.append(_one(load, lambda spec, port: api.load(spec, metrics_port=port)))
            done(outcomes[-1])
        return outcomes


def _one(load: Declared, how: Callable[[api.LoadSpec, int | None], api.LoadReport]) -> Outcome:
    try:
        return Outcome(load.name, how(load.spec, load.metrics_port))
    except ChloadError as exc:
        return Outcome(load.name, None, str(exc))


def _at_once(loads: Sequence[Declared], done: Done) -> list[Outcome]:
    """Each load on a thread of its own, those into the embedded target sharing it."""
    path = next((p for load in loads for _, p in [api.where(load.spec.target)] if p), None)
    outcomes: dict[str, Outcome] = {}
    failed: list[BaseException] = []
    guard = threading.Lock()
    with _shared(path, loads) as shared:

        def work(load: Declared) -> None:
            how = ((lambda spec, port: api.load_on(shared, spec, metrics_port=port))
                   if shared is not None else
                   (lambda spec, port: api.load(spec, metrics_port=port)))
            try:
                outcome = _one(load, how)
            except BaseException as exc:  # noqa: BLE001 (a bug: raised in the main thread,
                with guard:                # once the following loads have ended)
                    failed.append(exc)
                stopping.stop_following()
                return
            with guard:
                outcomes[load.name] = outcome
                done(outcome)

        threads = [threading.Thread(target=work, args=(load,), name=f"chload_run_{load.name}",
                                    daemon=True) for load in loads]
        with _signals_stop_following():
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)  # (a bare join would hold signals off)
    if failed:
        raise failed[0]
    return [outcomes[load.name] for load in loads]


@contextlib.contextmanager
def _shared(path: str | None, loads: Sequence[Declared]) -> Iterator[Target | None]:
    if path is None:
        yield None
        return
    with api.shared_target(loads[0].spec.target) as target:  # (every load's: `together`)
        yield target


@contextlib.contextmanager
def _signals_stop_following() -> Iterator[None]:
    """The first SIGINT/SIGTERM ends the following loads (after their round in flight);
    then the handlers are as before, so a second SIGINT interrupts."""
    stopping.reset()
    with stopping.on_signals(stopping.stop_following):
        yield
