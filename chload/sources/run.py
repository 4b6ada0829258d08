"""The sources of one run (`RunSources`): one object per kind, opened once, closed at
the end, so what a source keeps from listing to loading (a database snapshot) is the
run's and not a global. Which module reads a kind comes from `Kinds` (the registry,
given by the caller): nothing here names a kind of source.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from chload.sources.base import InPlace, KnownKeys, Skipped, Source, SourceContext, SourceFile

if TYPE_CHECKING:
    from chload.schema import Column


class Kinds(Protocol):
    """Which source reads what (sources/registry.py is one)."""

    def kind_of(self, pattern: str) -> str: ...

    def source_for(self, what: str | SourceFile) -> Source: ...


def _once(fetch: Callable[[], SourceFile]) -> SourceFile:
    return fetch()


class RunSources:
    """The sources of one run: one object per kind (`Source.open`), so what a source
    keeps from listing to loading (a database snapshot) is this run's, and ends with it
    (`close`). Listing, fetching, releasing and describing go through here."""

    def __init__(self, context: SourceContext, kinds: Kinds) -> None:
        self.context = context
        self.kinds = kinds
        self._open: dict[str, Source] = {}
        self._listed: dict[str, list[SourceFile]] = {}
        self._guard = threading.Lock()
        self._known: KnownKeys | None = None

    def of(self, what: str | SourceFile) -> Source:
        """This run's object for the kind of source that lists `what`."""
        kind = what.kind if isinstance(what, SourceFile) else self.kinds.kind_of(what)
        with self._guard:
            if kind not in self._open:
                self._open[kind] = self.kinds.source_for(what).open()
            return self._open[kind]

    def against(self, known: KnownKeys | None) -> None:
        """Listings begun from now on may pass by the units of `known` they meet
        unchanged (SourceContext.known), yielding them as `Skipped`; None: list all."""
        self._known = known

    def list(self, pattern: str) -> Iterator[SourceFile | Skipped]:
        """The pattern's units as its source lists them, one at a time. Only those for
        which listing made something (a link, stdin's spool: a `local_path` that is not
        the uri) are kept, to be released at `close`: a listing of a million files is
        never held here."""
        source = self.of(pattern)
        kind = self.kinds.kind_of(pattern)
        context = replace(self.context, known=self._known) if self._known is not None \
            else self.context
        for f in source.list(pattern, context):
            if isinstance(f, Skipped):
                yield f
                continue
            if source.known_empty(f):
                f = replace(f, empty=True)
            if f.is_stream or f.local_path not in (None, f.uri):
                with self._guard:
                    self._listed.setdefault(kind, []).append(f)
            yield f

    def described(self, files: Sequence[SourceFile]) -> builtins.list[SourceFile]:
        """The units the plan loads, with what only their bytes tell (Source.described),
        in their order."""
        by_kind: dict[str, builtins.list[int]] = {}
        for i, f in enumerate(files):
            by_kind.setdefault(f.kind, []).append(i)
        out = builtins.list(files)
        for indexes in by_kind.values():
            group = [files[i] for i in indexes]
            for i, f in zip(indexes, self.of(group[0]).described(group, self.context), strict=True):
                out[i] = f
        return out

    def release(self, files: Iterable[SourceFile]) -> None:
        """Release what listing made for these files now (a second spelling of one)."""
        by_kind: dict[str, list[SourceFile]] = {}
        for f in files:
            by_kind.setdefault(f.kind, []).append(f)
        for kind, group in by_kind.items():
            with self._guard:
                listed = self._listed.get(kind, [])
                self._listed[kind] = [f for f in listed if all(f is not g for g in group)]
            self.of(group[0]).release(group)

    def close(self) -> None:
        """The run is over: release every file still listed, end every source's session."""
        with self._guard:
            opened, listed = dict(self._open), self._listed
            self._open, self._listed = {}, {}
        try:
            for kind, source in opened.items():
                source.release(listed.get(kind, []))
        finally:
            for source in opened.values():
                source.close()

    def unit(self, patterns: Sequence[str]) -> str:
        """What the summary calls one unit of a run of `patterns` (Source.unit): one
        kind's word, else `file`."""
        units = {self.kinds.source_for(p).unit for p in patterns}
        return units.pop() if len(units) == 1 else "file"

    def notes(self) -> builtins.list[str]:
        """What this run's sources found worth a line of the report (Source.notes)."""
        with self._guard:
            opened = list(self._open.values())
        return [note for source in opened for note in source.notes()]

    def listing_calls(self) -> int:
        """The listing requests this run's sources made (Source.listing_calls)."""
        with self._guard:
            opened = list(self._open.values())
        return sum(source.listing_calls() for source in opened)

    def options(self) -> set[str]:
        """The LoadSpec fields some source of this run reads (Source.options)."""
        with self._guard:
            return {name for source in self._open.values() for name in source.options}

    def display(self, pattern: str) -> str:
        """`pattern` without its secrets (Source.display)."""
        return self.kinds.source_for(pattern).display(pattern)

    def reads_in_place(self, files: Sequence[SourceFile]) -> bool:
        """True when the engine reads every one of `files` where it is (a file, an
        object, stdin's spool; not a unit a source makes readable)."""
        return all(self.of(f).reads_in_place for f in files)

    def loads_alone(self, file: SourceFile) -> bool:
        return self.of(file).loads_alone(file)

    def start(self, file: SourceFile, limit: int) -> bytes | None:
        """A remote unit's first `limit` bytes as stored (Source.start); None: not
        readable so, the engine reads its first line."""
        return self.of(file).start(file, limit, self.context)

    def stream(self, file: SourceFile) -> Callable[[], Iterator[bytes]] | None:
        """How to read a remote unit's bytes as stored, here (Source.stream); None: the
        engine reads it."""
        return self.of(file).stream(file, self.context)

    def grows(self, file: SourceFile) -> bool:
        """True when `file` may still be written when listed (Source.grows)."""
        return self.of(file).grows

    def columns(self, files: Sequence[SourceFile]) -> builtins.list[Column] | None:
        """The data's columns as its source knows them; None (infer them) when it does
        not, or when the files are of several kinds."""
        if not files or len({f.kind for f in files}) != 1:
            return None
        return self.of(files[0]).columns(files)

    def sorting_key(self, files: Sequence[SourceFile]) -> str | None:
        if not files or len({f.kind for f in files}) != 1:
            return None
        return self.of(files[0]).sorting_key(files)

    def stored(self, columns: Sequence[Column], read: Sequence[Column], engine: str,
               rejects: bool) -> None:
        """The run's table as the target stores it, before any unit is fetched: told to
        the sources that check values against it (a database's, databases/base.py `stored`)."""
        with self._guard:
            opened = list(self._open.values())
        for source in opened:
            source.stored(columns, read, engine, rejects)

    def settle(self) -> None:
        """Before a commit (LoadJob.settle), and once the units ran: wait for what the
        sources check of every unit (Source.settle); raise what they found."""
        with self._guard:
            opened = list(self._open.values())
        for source in opened:
            source.settle()

    @contextlib.contextmanager
    def fetched(self, files: Sequence[SourceFile], columns: Sequence[Column],
                attempt: Callable[[Callable[[], SourceFile]], SourceFile] = _once,
                ) -> Iterator[tuple[SourceFile, ...]]:
        """`files` readable by the engine (Source.fetch into the context's workdir, each
        call made by `attempt`, e.g. with retries) for the duration of their load; what
        a fetch made (a spool) is released by its source after, loaded or not."""
        workdir = self.context.workdir
        made: list[tuple[Source, SourceFile, SourceFile]] = []
        kinds: dict[str, tuple[Source, bool]] = {}  # kind -> its source, read in place
        try:
            for f in files:
                if f.kind not in kinds:
                    source = self.of(f)
                    kinds[f.kind] = source, type(source).fetch is InPlace.fetch
                source, in_place = kinds[f.kind]
                copy = f if in_place else attempt(functools.partial(source.fetch, f, columns,
                                                                    workdir))
                made.append((source, f, copy))
            yield tuple(copy for _, _, copy in made)
        finally:
            for source, original, copy in made:
                if copy is not original:
                    source.release([copy])
