"""Files gone between listing and loading: they fail, alone, and are never `loaded`.

A batch reads many small files with one table function (`file('dir/{a,b,c}')`, and the
same for s3 and hdfs), and the engine passes over a file of the list that is no longer
there as if it were empty. So a file with no rows in a batch's result is looked at
again before the batch commits: where its source can tell cheaply (a local file: still
there and readable; `Source.still_there`) it is asked, any other is read once more,
alone. One that is gone fails the batch, which the runner then
halves until that file loads alone, where it fails with `VanishedFile`. A file that is there and
holds no rows loads, with 0 rows. Only files with no rows pay for the look.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from chload.errors import ChloadError, SourceError, VanishedFile
from chload.runtime.engine import Engine
from chload.schema import Column
from chload.sources.base import SourceFile
from chload.sources.registry import source_for


def vanished(file: SourceFile) -> VanishedFile:
    return VanishedFile(f"{file.uri}: vanished after listing; it was not loaded (put it "
                        "back and run the same command again to load it)")


def check_present(files: Sequence[SourceFile], counts: Mapping[str, int],
                  probe: Callable[[SourceFile], None]) -> None:
    """Raise VanishedFile for the first of `files` without rows in `counts` that is gone;
    `probe` reads a file that is not local alone (it raises SourceError if it cannot)."""
    for f in files:
        if counts.get(f.uri, 0) == 0 and _gone(f, probe):
            raise vanished(f)


def reading(engine: Engine, reader: Callable[..., str],
            columns: Sequence[Column]) -> Callable[[SourceFile], None]:
    """A probe for check_present: `engine` reads a file alone, through `reader`."""
    def probe(file: SourceFile) -> None:
        source = reader(file, file.format.name, columns)
        engine.query(f"SELECT 1 FROM {source} LIMIT 1", "TSV", file.uri)
    return probe


def explain_gone(file: SourceFile, error: ChloadError) -> ChloadError:
    """The error a load of `file` failed with, or VanishedFile if the file is gone (as
    its source can tell cheaply: a local file; the engine's own error names any other)."""
    if isinstance(error, VanishedFile) or source_for(file).still_there(file) is not False:
        return error
    return vanished(file)


def open_listed(file: SourceFile) -> int:
    """Open a local file listed for loading, as a file descriptor; VanishedFile if it
    is gone, SourceError if it cannot be read."""
    assert file.local_path is not None
    try:
        return os.open(file.local_path, os.O_RDONLY)
    except FileNotFoundError:
        raise vanished(file) from None
    except OSError as exc:
        raise SourceError(f"{file.uri}: cannot read it ({exc.strerror})") from None


def _gone(file: SourceFile, probe: Callable[[SourceFile], None]) -> bool:
    there = source_for(file).still_there(file)
    if there is not None:
        return not there
    try:
        probe(file)
    except SourceError:
        return True
    return False

