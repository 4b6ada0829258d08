"""For bench/databases.py: CPU seconds of a process tree, and a per-connection CPU cap.

`Throttle(db, cores)` gives every source connection that appears while it is active
(a PostgreSQL backend process, a MariaDB connection thread: thread_cache_size is set
to 0 so each connection is a new thread) a cgroup v1 cpu group of its own with a quota
of `cores`: one connection can use at most that much of a core, as on a database host
whose other cores are busy, while several connections together can use more. Linux
only, as root, with the cgroup v1 cpu controller at /sys/fs/cgroup/cpu; everything it
made is removed on exit (tasks moved back to the root group).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import services

CGROUP = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and every descendant, live or reaped (a reaped child's
    time is in its parent's cutime/cstime, so each is counted once)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        todo.extend(_children(p))
    return total / _TICK


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def nothing() -> Iterator[None]:
    yield


class Throttle:
    """A cpu quota of `cores` per source connection while in the `with` block."""

    def __init__(self, db: services.Service, cores: float) -> None:
        self.db, self.cores = db, cores
        self.root = CGROUP / f"chload-bench-{os.getpid()}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.postgres = db.name.startswith("postgres")
        self.known: set[int] = set()

    def __enter__(self) -> Throttle:
        if not (CGROUP / "tasks").exists():
            raise SystemExit("--limit-connection needs the cgroup v1 cpu controller at "
                             f"{CGROUP} (and root)")
        if not self.postgres:
            services.mariadb_sql(self.db, "SET GLOBAL thread_cache_size = 0", admin=True)
        self.root.mkdir()
        self.known = set(self._tasks())
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for group in self.root.iterdir():
            if group.is_dir():
                for task in (group / "tasks").read_text().split():
                    with contextlib.suppress(OSError):
                        (CGROUP / "tasks").write_text(task)
                with contextlib.suppress(OSError):
                    group.rmdir()
        self.root.rmdir()

    def _tasks(self) -> list[int]:
        """Backend processes (PostgreSQL) or threads (MariaDB) of the database now."""
        if self.postgres:
            return _children(self.db.pid)
        return [int(t) for t in os.listdir(f"/proc/{self.db.pid}/task")]

    def _watch(self) -> None:
        while not self.stop.wait(0.02):  # a scan of /proc costs: not more often
            for task in self._tasks():
                if task not in self.known:
                    self.known.add(task)
                    self._limit(task)

    def _limit(self, task: int) -> None:
        group = self.root / f"t{task}"
        with contextlib.suppress(OSError):
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(int(self.cores * PERIOD_US)))
            (group / "tasks").write_text(str(task))
