"""One loader process watched as a user sees it: its progress bar read off a terminal.

`chload load` draws its bar (rows, rate, ETA: chload/cli/render.py) only on a terminal,
so the process runs on a pseudo-terminal and the bench reads the bar as drawn: the ETA
it shows when the rows reach given fractions of the total is the ETA a user would have
read then. The process can be killed (SIGKILL) when its rows reach a fraction, as a
crash half-way. Its peak RSS, CPU and blocks written come from wait4(), the kernel's
account of the process (and of the children it waited for), taken by a small launcher
process: a peak RSS read by this process would start from its own (a child's maximum
counts the memory of the process it was forked from).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

# Runs argv[2:], then writes its rusage (JSON) to argv[1] and exits as it did.
_LAUNCHER = r"""
import json, os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, use = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as out:
    json.dump({"peak_rss_bytes": use.ru_maxrss * 1024, "cpu_s": use.ru_utime + use.ru_stime,
               "written_bytes": use.ru_oublock * 512}, out)
sys.exit(os.waitstatus_to_exitcode(status) % 256)
"""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]")
# render.ProgressView's columns: ... "<rows> rows" "<rate> rows/s" <elapsed> "ETA" <left>
_BAR = re.compile(r"([\d,]+) rows\s+[\d,]+ rows/s.*?ETA\s+(-:--:--|\d+:\d\d:\d\d)")


@dataclass
class Eta:
    """What the bar said when its rows first reached `mark` of the total."""

    mark: float
    at_s: float  # seconds since the process started
    rows: int
    eta_s: float | None  # the bar's ETA (None: it showed -:--:--)


@dataclass
class Watched:
    """A finished (or killed) process, as the kernel and its progress bar told it."""

    seconds: float
    returncode: int
    peak_rss_bytes: int
    cpu_s: float
    written_bytes: int
    killed: bool = False
    etas: list[Eta] = field(default_factory=list)
    tail: str = ""

    def eta_errors(self) -> dict[str, dict[str, float | None]]:
        """Per mark: the ETA shown, the time that was actually left, their error."""
        out: dict[str, dict[str, float | None]] = {}
        for eta in self.etas:
            left = self.seconds - eta.at_s
            error = (eta.eta_s - left) / left if eta.eta_s is not None and left > 0 else None
            out[f"{eta.mark:.0%}"] = {"at_s": eta.at_s, "eta_s": eta.eta_s,
                                      "actual_left_s": left, "error": error}
        return out


def _clock(text: str) -> float | None:
    if text.startswith("-"):
        return None
    h, m, s = (int(x) for x in text.split(":"))
    return h * 3600.0 + m * 60 + s


def _terminal(columns: int = 240) -> tuple[int, int]:
    """A pseudo-terminal wide enough that rich draws every column of the bar."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    return master, slave


def _launch(argv: Sequence[str], env: dict[str, str], out: int | IO[bytes],
            err: int | IO[bytes]) -> tuple[subprocess.Popen[bytes], str]:
    """`argv` under the launcher, in a process group of its own; the rusage file's path."""
    fd, usage = tempfile.mkstemp(prefix="chload-bench-usage-")
    os.close(fd)
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, usage, *argv],
                            stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                            env={**os.environ, **env}, start_new_session=True)
    return proc, usage


def _ended(proc: subprocess.Popen[bytes], usage: str, started: float, **kw: object) -> Watched:
    """Reap `proc`; its figures (zeros where it was killed before the launcher wrote)."""
    proc.wait()
    seconds = time.perf_counter() - started
    with open(usage) as fh:
        text = fh.read()
    os.remove(usage)
    used = json.loads(text) if text else {"peak_rss_bytes": 0, "cpu_s": 0.0,
                                           "written_bytes": 0}
    return Watched(seconds=seconds, returncode=proc.returncode, **used, **kw)  # type: ignore


def watch(argv: Sequence[str], env: dict[str, str], total_rows: int,
          marks: Sequence[float] = (0.1, 0.5), kill_at: float | None = None,
          timeout: float = 48 * 3600) -> Watched:
    """Run `argv` on a terminal; note the bar's ETA at each of `marks` (fractions of
    `total_rows`); SIGKILL it once its rows reach `kill_at`."""
    master, slave = _terminal()
    started = time.perf_counter()
    proc, usage = _launch(argv, {"COLUMNS": "240", "TERM": "xterm", **env}, slave, slave)
    os.close(slave)
    etas: list[Eta] = []
    pending = sorted(marks)
    text, killed = "", False
    try:
        while time.perf_counter() - started < timeout:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every end of the terminal closed, the process ended
                break
            if not chunk:
                break
            text = (text + _ANSI.sub("", chunk.decode(errors="replace")))[-8192:]
            bars = _BAR.findall(text)
            if not bars:
                continue
            rows, eta = int(bars[-1][0].replace(",", "")), _clock(bars[-1][1])
            now = time.perf_counter() - started
            while pending and rows >= pending[0] * total_rows:
                etas.append(Eta(pending.pop(0), now, rows, eta))
            if kill_at is not None and not killed and rows >= kill_at * total_rows:
                os.killpg(proc.pid, signal.SIGKILL)  # the loader and its launcher
                killed = True
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        os.close(master)
    return _ended(proc, usage, started, killed=killed, etas=etas, tail=text[-1500:])


def run_plain(argv: Sequence[str], env: dict[str, str], timeout: float = 48 * 3600,
              ) -> tuple[Watched, str]:
    """Run `argv` with its output kept (no terminal: no bar); also return its stdout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc, usage = _launch(argv, env, out, err)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        return _ended(proc, usage, started, tail=stdout[-800:] + stderr[-1500:]), stdout
