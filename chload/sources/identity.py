"""A file's identity as it is when its bytes are read, not only when it was listed.

A log that grows, or a file rewritten in place, may be another file by the time the
engine reads it. So a target takes the identity again right before the read (`as_read`:
the ledger records what was read) and checks it right after the INSERT into the stage,
before the commit (`check_read`): a file that changed fails, nothing of it committed.
Each source says how (`Source.current`); remote objects keep their listed identity.
docs/guarantees.md ("What is not checked") says what this cannot see.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from chload.errors import SourceError
from chload.sources.base import SourceFile
from chload.sources.registry import source_for

if TYPE_CHECKING:
    from chload.targets.base import LoadJob


def current(file: SourceFile) -> SourceFile:
    """`file` with its identity as it is now, as its source can tell (Source.current:
    local files are stat'ed again; others keep their listed identity)."""
    return source_for(file).current(file)


def current_all(files: Sequence[SourceFile]) -> Iterator[SourceFile]:
    """`current` of each file, in order, each asked as it is taken: a batch's files of
    one kind asked of their source at once (Source.current_many: local files stat'ed
    in one loop)."""
    kind = files[0].kind if files else ""
    if len(files) > 1 and all(f.kind == kind for f in files):
        return source_for(files[0]).current_many(files)
    return map(current, files)


def as_read(job: LoadJob) -> LoadJob:
    """The job with its files' identities taken now, right before their bytes are read."""
    files = tuple(current_all(job.files))
    return replace(job, file=files[0], batch=files if job.batch else ())


def check_read(job: LoadJob) -> None:
    """After the INSERT into the stage, before the commit: fail if a file changed since
    `as_read` (its rows in the stage may be any mix of before and after); then wait for
    what the run's sources check before anything commits (`LoadJob.settle`)."""
    changed = _changed(job.files)
    if changed:
        before, now = changed
        raise SourceError(f"{before.uri}: changed while being read ({_how(before, now)}); "
                          "nothing of it was loaded: run again once it is stable")
    if job.settle is not None:
        job.settle()


def _changed(files: Sequence[SourceFile]) -> tuple[SourceFile, SourceFile] | None:
    """The first file whose identity is not as read, and what it is now (the files
    after it not asked)."""
    for f, now in zip(files, current_all(files), strict=True):
        if now is not f and now.identity != f.identity:
            return f, now
    return None


def _how(before: SourceFile, now: SourceFile) -> str:
    if before.size != now.size:
        return f"{before.size:,} bytes, now {now.size:,}"
    return "same size, modified meanwhile"
