"""The MySQL/MariaDB snapshot reader where the native one (mysql_native.py) cannot be
built: a `mariadb` (or `mysql`) client process fed statements on stdin.

Its `SELECT` has the server format each field (mysql.py `_column`); the client prints
the rows `--batch --raw`, and `run` relays its output in 1 MiB chunks up to a marker
row that follows each statement. The password goes to the client by its environment
(MYSQL_PWD), never its command line (which `ps` shows).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from typing import IO, Any

from chload.errors import UsageError
from chload.sources.pipes import enlarge, write_all

_CHUNK = 1 << 20


class ClientReader:
    """A client process in one snapshot (mysql.py's pool), fed statements on stdin; its
    output goes to a file descriptor up to the marker that follows each statement."""

    native = False

    def __init__(self, client: str, proc: subprocess.Popen[bytes], errors: IO[bytes],
                 fail: Callable[[str], Exception]) -> None:
        self.client, self.proc, self.errors, self.fail = client, proc, errors, fail
        self.marker = f"chload-end-{os.urandom(8).hex()}".encode()

    @classmethod
    def start(cls, client: str, url: Any, password: str | None, setup: Sequence[str],
              fail: Callable[[str], Exception]) -> ClientReader:
        """Start the client and run `setup` (the statements that start the snapshot)."""
        argv = [client, "--no-defaults", "--protocol=TCP", "-h", url.host, "-P",
                str(url.port), *(["-u", url.user] if url.user else []), "--batch", "--raw",
                "--skip-column-names", "--unbuffered", "--quick",
                "--default-character-set=utf8mb4", url.database]
        env = {**os.environ}
        if password is not None:
            env["MYSQL_PWD"] = password
        errors = tempfile.TemporaryFile()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=errors, env=env)
        assert proc.stdout is not None
        enlarge(proc.stdout.fileno())  # fewer, larger reads by the relay
        reader = cls(client, proc, errors, fail)
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            reader.run("; ".join(setup), null)
        finally:
            os.close(null)
        return reader

    def run(self, statement: str, out: int, checks: str = "") -> None:
        """Run `statement`; write what it prints to the file descriptor `out` (zero
        dates and ranges are the statement's to check here: mysql.py `_zero_guard`,
        `_range_guard`)."""
        end = self.marker + b"\n"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(f"{statement};\nSELECT '{self.marker.decode()}';\n".encode())
            self.proc.stdin.flush()
        except OSError:
            raise self._failed() from None
        fd, held = self.proc.stdout.fileno(), b""  # held: the last bytes, maybe the marker's
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                raise self._failed()
            if len(chunk) < len(end):  # (rare) a short read: join it to what is held
                chunk, held = held + chunk, b""
            write_all(out, held)
            if chunk.endswith(end):
                write_all(out, memoryview(chunk)[:-len(end)])
                return
            write_all(out, memoryview(chunk)[:-len(end)])
            held = chunk[-len(end):]

    def _failed(self) -> Exception:
        self.proc.wait()
        self.errors.seek(0)
        lines = self.errors.read().decode(errors="replace").strip().splitlines()
        return self.fail(lines[-1] if lines else f"{self.client} ended ({self.proc.returncode})")

    def abort(self) -> None:
        """From another thread: the range being read fails now."""
        self.proc.kill()

    def stop(self, kill: bool = False) -> None:
        """End the client: by closing its input (it ends its transaction), or, when its
        output is no longer read (`kill`), at once."""
        try:
            if kill:
                raise OSError
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.errors.close()


def client() -> str:
    """The `mariadb` (or `mysql`) client's path."""
    found = shutil.which("mariadb") or shutil.which("mysql")
    if not found:
        raise UsageError("the mariadb (or mysql) client is needed on this machine to read "
                         "MySQL/MariaDB: install it (e.g. apt-get install mariadb-client)")
    return found
