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

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("CHLOAD_CACHE") or Path.home() / ".cache" / "chload"
    return Path(root) / "native"


def build(source: Path, library: str, prefix: str, what: str) -> tuple[Path | None, str]:
    """The shared library built from `source` and linked with `library` (its path),
    or None and why not. `what` names the reader in the reasons ("native Kafka reader")."""
    digest = hashlib.sha256(source.read_bytes() + os.path.realpath(library).encode())
    out = cache_dir() / f"{prefix}_{digest.hexdigest()[:16]}.so"
    if out.exists():
        return out, ""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if not compiler:
        return None, f"no C compiler (cc) to build the {what}"
    why = _compile(compiler, source, library, out, what)
    return (None, why) if why else (out, "")


def _compile(compiler: str, source: Path, library: str, out: Path, what: str) -> str:
    """Build into a temp name, then rename: concurrent first uses do not collide."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
    except OSError as exc:
        return f"no cache directory for the {what}: {exc}"
    argv = [compiler, "-O2", "-shared", "-fPIC", "-o", tmp, str(source), library,
            f"-Wl,-rpath,{os.path.dirname(os.path.realpath(library))}"]
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
