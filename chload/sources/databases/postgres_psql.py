"""The `psql` processes of a PostgreSQL source: the controlling one and one per range.

`Control` is one `psql` fed statements on stdin, its rows read back up to a marker;
`Psql` is a range's `psql`, writing a COPY into a pipe or spool. The password reaches
psql by its environment (PGPASSWORD) only, never its command line; `error` turns
psql's stderr into one line naming the source, never the password.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import IO

from chload.core.reading import ranges as db_range
from chload.errors import ChloadError, SourceError, TransientError, UsageError
from chload.sources.databases.table import NO_CHECKS, DbUrl, RangeChecks

_LIBEXEC = ("/usr/libexec", "/usr/lib", "/usr/local/libexec")  # where stdbuf's library is
_PG_LIB = "/usr/lib/postgresql"  # Debian's clients, one directory per version
FINISH_SECONDS = 60  # after its output ended, psql only commits and exits
OUT_BUFFER = 1 << 20  # a range's psql writes its COPY output this much at a time (buffered)
_TRANSIENT = ("could not connect", "Connection refused", "server closed the connection",
              "timeout expired", "the database system is starting up")


class Control:
    """The controlling connection: one `psql` fed statements on stdin, each followed by
    `\\echo <marker>`, its rows read from stdout up to the marker (fields split by
    0x1F, NULL shown as 0x1E). psql rather than psycopg, whose import alone would be a
    large part of every run's start."""

    def __init__(self, url: DbUrl, psql: str) -> None:
        self.url = url
        self.marker = f"chload-end-{os.urandom(8).hex()}"
        argv = [psql, "-X", "-q", "-A", "-t", "-F", "\x1f", "-P", "null=\x1e", "-v",
                "ON_ERROR_STOP=1", *connection_args(url)]
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errors, env=client_env(url, psql))

    def rows(self, sql: str) -> list[list[str | None]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(f"{sql};\n\\echo {self.marker}\n".encode())
            self.proc.stdin.flush()
        except OSError:
            raise self._failed() from None
        found: list[list[str | None]] = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise self._failed()
            text = line.decode().rstrip("\n")
            if text == self.marker:
                return found
            found.append([None if v == "\x1e" else v for v in text.split("\x1f")])

    def _failed(self) -> ChloadError:
        self.proc.wait()
        self.errors.seek(0)
        lines = self.errors.read().decode(errors="replace").strip().splitlines()
        said = [line for line in lines if "ERROR" in line or "FATAL" in line
                or line.startswith("psql:")]
        return error(self.url, (said or lines or [f"psql exit {self.proc.returncode}"])[0])

    def stop(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()  # psql ends, and the transaction with it
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.errors.close()


def connection_args(url: DbUrl) -> list[str]:
    """psql's connection arguments (never the password: that is in its environment).
    `-w`: never ask for a password; at a terminal, each psql (two at the start) asked
    for one on /dev/tty under the progress bar, and the run waited (error says how to
    give it)."""
    return ["-w", "-h", url.host, "-p", str(url.port), "-d", url.database,
            *(["-U", url.user] if url.user else [])]


def client_env(url: DbUrl, psql: str) -> dict[str, str]:
    # UTF8 whatever the database's encoding and the user's locale (psql's default is
    # the locale's): a LATIN1 database's text came as Latin-1 bytes, loaded as they were
    env = {**os.environ, "PGAPPNAME": "chload", "PGCONNECT_TIMEOUT": "10",
           "PGCLIENTENCODING": "UTF8"}
    if psql.startswith(_PG_LIB + "/"):  # run without its wrapper: what it would set
        env.setdefault("PGSYSCONFDIR", "/etc/postgresql-common")
    if url.password is not None:
        env["PGPASSWORD"] = url.password
    return env



class Psql:
    """One `psql` writing one range (a sources/pipes.py Reading)."""

    def __init__(self, url: DbUrl, proc: subprocess.Popen[bytes], errors: IO[bytes],
                 checks: RangeChecks = NO_CHECKS) -> None:
        self.url, self.proc, self.errors, self.checks = url, proc, errors, checks

    def feed(self, script: bytes) -> Psql:
        """Give psql its statements (a few hundred bytes: never blocks) and end its
        input, so it exits after them."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(script)
            self.proc.stdin.close()
        except OSError:
            pass  # psql ended already: finish() says why
        return self

    def finish(self) -> None:
        try:
            code = self.proc.wait(timeout=FINISH_SECONDS)
        except subprocess.TimeoutExpired:
            self.stop()
            raise SourceError(f"{self.url.display}: psql did not end within "
                              f"{FINISH_SECONDS} s of its output's end") from None
        self.errors.seek(0)
        message = self.errors.read().decode(errors="replace").strip().splitlines()
        self.errors.close()
        if code:
            for line in message:  # a value a range check refused (_refused)
                found = re.search(rf'"{db_range.MARKER} (\d+) (.*)"$', line)
                if found and int(found.group(1)) in self.checks.guards:
                    raise self.checks.refusal(int(found.group(1)), found.group(2))
            raise error(self.url, message[-1] if message else f"psql exit {code}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.errors.close()



def find_psql() -> str:
    found = shutil.which("psql")
    if not found:
        raise UsageError("psql (PostgreSQL's client) is needed on this machine to read "
                         "PostgreSQL: install it (e.g. apt-get install postgresql-client)")
    return _unwrapped(found)


def buffered(psql: str) -> list[str]:
    """psql under coreutils' `stdbuf -o`, where it is installed: psql writes a COPY's
    rows with stdio's fwrite, one row at a time, into a pipe's 4 KiB stdio buffer, and
    the reader of the pipe (chDB's file(), or the relay posting it to a server) woke
    for every one; with a 1 MiB buffer it wakes rarely. (psql flushes only at the
    COPY's end; stdbuf sets the buffer through its LD_PRELOAD library, then execs psql:
    the same process.) Without stdbuf or its library, psql runs as it is."""
    stdbuf = shutil.which("stdbuf")
    if not stdbuf or not any(os.path.exists(os.path.join(d, "coreutils", "libstdbuf.so"))
                             for d in _LIBEXEC):
        return [psql]
    return [stdbuf, f"--output={OUT_BUFFER}", psql]


def _unwrapped(psql: str) -> str:
    """Debian's `psql` is pg_wrapper, a Perl script that picks a version and execs its
    psql: a Perl start per process, on the path to the first byte (a run starts two at
    once). Given `-h` (chload always passes it) the wrapper ignores
    $PGCLUSTER and runs the newest installed psql, with $PGSYSCONFDIR defaulting to
    /etc/postgresql-common (`client_env`): so that psql is run directly, the same way."""
    if os.path.basename(os.path.realpath(psql)) != "pg_wrapper":
        return psql
    versions = []
    for name in os.listdir(_PG_LIB) if os.path.isdir(_PG_LIB) else []:
        binary = os.path.join(_PG_LIB, name, "bin", "psql")
        if re.fullmatch(r"\d+(\.\d+)?", name) and os.access(binary, os.X_OK):
            versions.append((tuple(int(p) for p in name.split(".")), binary))
    return max(versions)[1] if versions else psql


def error(url: DbUrl, exc: object) -> ChloadError:
    """A psql error as one line naming the source (never the password)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^(psql: )?(error: )?((<stdin>:\d+: )?(ERROR|FATAL):\s+)?", "", text)
    if url.password:
        text = text.replace(url.password, "***")
    if "no password supplied" in text:
        text += ("; give it by $PGPASSWORD, ~/.pgpass or the URL "
                 "(postgresql://user:password@host/...)")
    kind = TransientError if any(t in text for t in _TRANSIENT) else SourceError
    return kind(f"{url.with_user}: {text}")


