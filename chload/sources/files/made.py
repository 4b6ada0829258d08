"""What listing made for the engine to read, and removes once a load is over: standard
input's spool, and the plain-named links to local files whose real names the engine's
file() cannot take (local.py). Only ever what this process made, never a source file."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable

from chload.errors import UsageError
from chload.formats import detect
from chload.sources.base import SourceFile

LINKS_PREFIX = "chload-links-"
PROC_FD = "/proc/self/fd/"
_MADE: set[str] = set()  # spools and links this process made and has not released
_MADE_LOCK = threading.Lock()


def spool_stdin(fmt: str | None, compression: str | None, workdir: str) -> SourceFile:
    """Standard input, copied in chunks to a file the engine can read more than once.

    Schema inference reads the start of the data and the load reads all of it, so a
    pipe is spooled (bytes only, bounded memory; no row is parsed in Python). The spool
    is unlinked at once and read through `/proc/self/fd/N` where there is one, so no
    copy outlives the process, even killed; `release()` closes it.
    """
    if not fmt:
        raise UsageError("-: reading standard input needs --format (e.g. --format CSVWithNames)")
    os.makedirs(workdir, exist_ok=True)
    handle, path = tempfile.mkstemp(prefix="stdin-", dir=workdir)
    try:
        with open(handle, "wb", closefd=False) as out:
            shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
        if os.path.exists(f"{PROC_FD}{handle}"):
            os.remove(path)
            path = f"{PROC_FD}{handle}"
        else:
            os.close(handle)
    except BaseException:
        os.close(handle)
        if os.path.exists(path):
            os.remove(path)
        raise
    remember(path)
    st = os.stat(path)
    return SourceFile(
        uri="stdin", size=st.st_size, mtime_ns=st.st_mtime_ns,
        format=detect("stdin", fmt, compression or "none"), local_path=path, is_stream=True,
    )


def remember(path: str) -> None:
    with _MADE_LOCK:
        _MADE.add(path)


def release(files: Iterable[SourceFile]) -> None:
    """Remove what listing made for the engine (stdin's spool, plain-named links) once
    their load is over; only ever what this process made, never a source file."""
    for f in files:
        path = f.local_path or ""
        with _MADE_LOCK:
            if path not in _MADE:
                continue
            _MADE.discard(path)
        if path.startswith(PROC_FD):
            os.close(int(path[len(PROC_FD):]))
            continue
        os.remove(path)
        if os.path.basename(os.path.dirname(path)).startswith(LINKS_PREFIX):
            try:
                os.rmdir(os.path.dirname(path))
            except OSError:
                pass  # other links of the same listing are still in it
