"""Commit locks: who may attach into a table now (the committer, committer.py, runs its
protocol inside one). The lock is the only thing that differs between targets:

- a server is shared by loader processes on many hosts, so its lock is a table on the
  server (`TableLock`): `CREATE TABLE chload.lock_<t>` is an atomic test-and-set on
  every ClickHouse version, survives a server restart, and is broken when its holder
  is gone (committer.py rule 3);
- an embedded target's directory is held by one process (engine.py's `flock`), so no
  other process can stage or commit there; within the process the committer's
  per-table turn already lets one commit at a time in (`ProcessLock`).

Both remember a commit that gave up holding the lock (it may have attached part of its
stage): the next `acquire` breaks that lock, leaving `chload.dirty_<t>` for the
committer to settle the table by the mark rule before it attaches anything more.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from chload.commit.ledger import DATABASE
from chload.errors import ChloadError, EngineError, TransientError, missing_table
from chload.runtime.retry import RetryPolicy
from chload.schema import quote_str

try:  # CPython's own SHA-1: the same digest as hashlib's, without loading OpenSSL at
    from _sha1 import sha1  # every start; names of locks and machines only
except ImportError:  # pragma: no cover -- a Python built without it
    from hashlib import sha1

LEASE_SECONDS = 60.0
LOCK_WAIT_SECONDS = 600.0
LOCK_WAIT = RetryPolicy(attempts=0, base_seconds=0.02, max_seconds=0.5, jitter=False)
_TABLE_EXISTS = 57


class Sql:
    """What the committer and a lock need from the target: statements (with a query id,
    which a server shows in system.processes) and rows."""

    def __init__(self, command: Callable[[str, str], None],
                 rows: Callable[[str], list[dict]]) -> None:
        self.command = command
        self.rows = rows


class CommitLock(Protocol):
    """One table's commit lock. `exclusive`: no other process can stage or commit in
    this target (so every stage not of this process is an orphan)."""

    exclusive: bool

    def acquire(self, table: str, display: str) -> None:
        """Wait for the lock (TransientError when it cannot be had); a lock its holder
        left behind is broken, leaving the table's dirty marker."""
        ...

    def release(self, table: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Holder:
    """A process, recognizable across machines and pid reuse."""

    machine: str
    pid: int
    start: int

    @classmethod
    def this_process(cls) -> Holder:
        return cls(machine_id(), os.getpid(), _start_time(os.getpid()))

    @classmethod
    def decode(cls, text: str) -> Holder | None:
        parts = text.strip("'").split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        return cls(parts[0], int(parts[1]), int(parts[2]))

    def encode(self) -> str:
        return f"{self.machine}:{self.pid}:{self.start}"

    @property
    def query_prefix(self) -> str:
        return f"chload-commit-{self.machine}-{self.pid}-{self.start}-"

    def alive_here(self) -> bool:
        """On this machine: is the process still running (same pid and start time)?"""
        return _start_time(self.pid) == self.start


def machine_id() -> str:
    boot = ""
    with contextlib.suppress(OSError):
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    return sha1(f"{os.uname().nodename}:{boot}".encode()).hexdigest()[:12]


def _start_time(pid: int) -> int:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[19])


def lock_name(table: str) -> str:
    return f"lock_{sha1(table.encode()).hexdigest()[:16]}"


def dirty_name(table: str) -> str:
    return f"dirty_{sha1(table.encode()).hexdigest()[:16]}"


def mark_dirty(sql: Sql, table: str, query_id: str) -> None:
    """Leave the marker that says: settle this table's commits before the next."""
    sql.command(f"CREATE TABLE IF NOT EXISTS {DATABASE}.{dirty_name(table)} "
                "(at DateTime DEFAULT now()) ENGINE = Memory", query_id)


class ProcessLock:
    """The embedded target's lock: the directory's `flock` (engine.py) keeps every other
    process out, and the committer's per-table turn lets one commit of this process in
    at a time; what is left to remember is a commit that gave up inside."""

    exclusive = True

    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        self._held: set[str] = set()
        self._guard = threading.Lock()

    def acquire(self, table: str, display: str) -> None:
        with self._guard:
            left = table in self._held  # by a commit that gave up: none of ours is inside
            self._held.add(table)
        if left:
            mark_dirty(self.sql, table, "")

    def release(self, table: str) -> None:
        with self._guard:
            self._held.discard(table)


class TableLock:
    """A server's lock: the table `chload.lock_<t>`, whose column default names the
    holder (committer.py rule 3 says when it is broken)."""

    exclusive = False

    def __init__(self, sql: Sql, holder: Holder, lease: float = LEASE_SECONDS,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.sql, self.holder, self.lease, self.sleep = sql, holder, lease, sleep

    def acquire(self, table: str, display: str) -> None:
        """Try for the lock with backoff (LOCK_WAIT) for up to LOCK_WAIT_SECONDS."""
        lock = lock_name(table)
        for _ in LOCK_WAIT.tries(self.sleep, until=time.monotonic() + LOCK_WAIT_SECONDS):
            if self._take(table, lock):
                return
        raise TransientError(f"table {display}: another chload has been committing "
                             f"for {LOCK_WAIT_SECONDS:.0f} s (lock {DATABASE}.{lock})")

    def _take(self, table: str, lock: str) -> bool:
        """One try: create the lock table (code 57 if it exists), breaking the lock
        first, as often as it is found stale; False if a live holder has it."""
        while True:
            try:
                self._run(f"CREATE TABLE {DATABASE}.{lock} (holder String DEFAULT "
                          f"{quote_str(self.holder.encode())}) ENGINE = Memory")
                return True
            except EngineError as exc:
                if exc.code != _TABLE_EXISTS:
                    raise
            try:
                holder, age, busy = self._state(lock)
            except ChloadError as exc:  # 18.16: "Table chload.lock_x doesn't exist"
                if missing_table(exc) != lock:
                    raise
                continue  # released between the CREATE and the look: take it now
            if age is None or not self.stale(holder, age, busy):
                return False
            self._break(table, lock, holder)

    def release(self, table: str) -> None:
        self._run(f"DROP TABLE IF EXISTS {DATABASE}.{lock_name(table)}")

    def _state(self, lock: str) -> tuple[str, float | None, list[str]]:
        """(holder text, age in seconds by the server's clock, running commit query ids)."""
        rows = self.sql.rows(
            f"SELECT 'holder' AS k, default_expression AS v FROM system.columns WHERE "
            f"database = '{DATABASE}' AND table = {quote_str(lock)} "
            f"UNION ALL SELECT 'age', toString(now() - metadata_modification_time) FROM "
            f"system.tables WHERE database = '{DATABASE}' AND name = {quote_str(lock)} "
            f"UNION ALL SELECT 'busy', query_id FROM system.processes "
            f"WHERE startsWith(query_id, 'chload-commit-')")
        found: dict[str, list[str]] = {}
        for row in rows:
            found.setdefault(row["k"], []).append(row["v"])
        age = float(found["age"][0]) if found.get("age") else None
        return (found.get("holder") or [""])[0], age, found.get("busy", [])

    def stale(self, holder_text: str, age: float, busy: list[str]) -> bool:
        holder = Holder.decode(holder_text)
        if holder is None:
            return age > self.lease
        if holder == self.holder:
            return True  # a commit of ours that gave up: no thread of ours is inside
        if holder.machine == self.holder.machine and not holder.alive_here():
            return True
        running = any(q.startswith(holder.query_prefix) for q in busy)
        return age > self.lease and not running

    def _break(self, table: str, lock: str, holder_text: str) -> None:
        """Take a stale lock away; the next holder settles what it left (rule 3)."""
        mark_dirty(self.sql, table, self._query_id())
        broken = f"lockbroken_{os.urandom(6).hex()}"
        try:
            self._run(f"RENAME TABLE {DATABASE}.{lock} TO {DATABASE}.{broken}")
        except EngineError:
            return  # someone else broke or released it first
        if self._state(broken)[0] != holder_text:  # a fresh lock came in between: undo
            with contextlib.suppress(EngineError):
                self._run(f"RENAME TABLE {DATABASE}.{broken} TO {DATABASE}.{lock}")
                return
        self._run(f"DROP TABLE IF EXISTS {DATABASE}.{broken}")

    def _run(self, statement: str) -> None:
        self.sql.command(statement, self._query_id())

    def _query_id(self) -> str:
        return f"{self.holder.query_prefix}x-{os.urandom(4).hex()}"
