"""Build a C reader shipped as source in the package into a shared library, once.

The Kafka and MySQL readers (sources/kafka_spool.c, sources/mysql_copy.c) are small C
files linked against a library already on the machine (librdkafka, libmariadb). They
are compiled with `cc` on first use into `$CHLOAD_CACHE/native` (default
~/.cache/chload/native), named by a digest of the source and the library's real path,
so an upgrade of either builds afresh and nothing is rebuilt otherwise. Every failure
is a reason in one line, for the caller's note; the caller falls back to its slower
pure-Python path.
"""

from __future__ import annotations

import ctypes.util
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                "/usr/lib", "/usr/local/lib")


class Once:
    """A reader's library, built and loaded once per process (`build` returns the
    ctypes library or None, and why not); threads asking at once wait for the first."""

    def __init__(self, build: Callable[[], tuple[Any, str]]) -> None:
        self._build, self._lock = build, threading.Lock()
        self._result: tuple[Any, str] | None = None

    def __call__(self) -> tuple[Any, str]:
        with self._lock:
            if self._result is None:
                self._result = self._build()
            return self._result


def system_library(names: Sequence[str], short: str) -> str:
    """The path of the first of `names` in the usual library folders, else what the
    linker cache knows as `short` (only a path: cc needs a file); '' if none."""
    for folder in LIBRARY_DIRS:
        for name in names:
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name)
    found = ctypes.util.find_library(short)
    return found if found and os.path.isabs(found) else ""


def cache_dir() -> Path:
    root = os.environ.get("CHLOAD_CACHE") or Path.home() / ".cache" / "chload"
    return Path(root) / "native"


def build(source: Path, library: str, prefix: str, what: str) -> tuple[Path | None, str]:
    """The shared library built from `source` and linked with `library` (its path; ''
    for none), or None and why not. `what` names the reader in the reasons ("native
    Kafka reader")."""
    linked = os.path.realpath(library) if library else ""
    digest = hashlib.sha256(source.read_bytes() + linked.encode())
    out = cache_dir() / f"{prefix}_{digest.hexdigest()[:16]}.so"
    if out.exists():
        return out, ""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if not compiler:
        return None, f"no C compiler (cc) to build the {what}"
    why = _compile(compiler, source, library, out, what)
    return (None, why) if why else (out, "")


def load(source: Path, library: str, prefix: str, what: str,
         bind: Callable[[Any], Any]) -> tuple[Any, str]:
    """`build`, then load the result and `bind` its functions' types: the bound library,
    or None and why not."""
    out, why = build(source, library, prefix, what)
    if out is None:
        return None, why
    try:
        return bind(ctypes.CDLL(str(out))), ""
    except (OSError, AttributeError) as exc:
        return None, f"the {what} did not load: {exc}"


def _compile(compiler: str, source: Path, library: str, out: Path, what: str) -> str:
    """Build into a temp name, then rename: concurrent first uses do not collide."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
    except OSError as exc:
        return f"no cache directory for the {what}: {exc}"
    argv = [compiler, "-O2", "-shared", "-fPIC", "-o", tmp, str(source)]
    if library:  # (a reader of its own, e.g. the local walk's, links nothing)
        argv += [library, f"-Wl,-rpath,{os.path.dirname(os.path.realpath(library))}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            return f"cc could not build the {what}: {tail}"
        os.replace(tmp, out)
        return ""
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cc could not build the {what}: {exc}"
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
