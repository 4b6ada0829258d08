"""A followed PostgreSQL table's replication slot and columns, over one `psql`.

The slot (plugin wal2json) is named after the target and the table that follow it, so
two targets following one table each have their own. Positions are LSNs as integers
(`lsn_int`): the ledger's unit names and `_version` hold them so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from chload.errors import SourceError, UsageError
from chload.sources.changes.postgres.sql import PLUGIN, SourceColumn, ident, text
from chload.sources.databases.postgres import _COLUMNS_SQL, _column
from chload.sources.databases.postgres_psql import Control, find_psql
from chload.sources.databases.table import DbColumn, DbUrl

SCHEME = "pgchanges://"


def lsn_int(lsn: str) -> int:
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def slot_name(target: str, table: str, source: str) -> str:
    digest = hashlib.sha1(f"{target}|{table}|{source}".encode()).hexdigest()[:24]
    return f"chload_{digest}"


def stream_name(url: DbUrl, slot: str) -> str:
    """The ledger's name of the stream (never a secret): user, server, table, slot."""
    where = f"{url.host}:{url.port}/{url.database}/{url.schema}.{url.table}"
    return f"{SCHEME}{url.user}@{where}/{slot}"


@dataclass(slots=True)
class Described:
    columns: list[SourceColumn]
    db_columns: list[DbColumn]
    key: list[str]
    identity: str  # relreplident: d (default: the key), f (full), i (index), n (nothing)


class Slot:
    """One connection to the source: the table's columns, the slot, the positions."""

    def __init__(self, url: DbUrl, name: str) -> None:
        self.url, self.name = url, name
        self.relation = f"{ident(url.schema)}.{ident(url.table)}"
        self.control = Control(url, find_psql())

    def close(self) -> None:
        self.control.stop()

    def one(self, sql: str) -> list[str | None]:
        rows = self.control.rows(sql)
        return rows[0] if rows else []

    def describe(self) -> Described:
        if self.one(f"SELECT to_regclass({text(self.relation)}) IS NULL")[0] == "t":
            raise SourceError(f"{self.url.display}: no such table (or no right to see it)")
        rows = [[str(v) for v in r] for r in
                self.control.rows(_COLUMNS_SQL.replace("%s", text(self.relation)))]
        db = [_column(n, t, nn == "t", tt, el) for n, t, nn, tt, el, _ in rows]
        refused = [c for c in db if c.refused]
        if refused:
            raise UsageError(f"{self.url.display}: column {refused[0].name} ({refused[0].refused})"
                             " cannot be followed unchanged; change its type at the source "
                             "or follow a view of it with --query (not yet supported)")
        columns = [SourceColumn(n, t, c.select) for (n, t, *_), c in zip(rows, db, strict=True)]
        key = [r[0] for r in sorted(rows, key=lambda r: int(r[5])) if r[5] != "0"]
        identity = str(self.one(f"SELECT relreplident FROM pg_class WHERE oid = "
                                f"{text(self.relation)}::regclass")[0])
        return Described(columns, db, key, identity)

    def exists(self) -> bool:
        return bool(self.control.rows(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = "
                                      f"{text(self.name)}"))

    def create(self) -> tuple[Control, str]:
        """The slot, new, made on a replication connection: that connection (the snapshot
        it exported stays valid while it is open and idle: close it after the copy's
        session took it) and the snapshot, in which the slot's first change is the
        first one not seen."""
        url = replace(self.url, database=f"dbname={self.url.database} replication=database")
        control = Control(url, find_psql())
        try:
            found = control.rows(f"CREATE_REPLICATION_SLOT {ident(self.name)} LOGICAL "
                                 f"{PLUGIN} (SNAPSHOT 'export')")
        except Exception as exc:
            control.stop()
            raise SourceError(f"{self.url.display}: could not create replication slot "
                              f"{self.name}: {exc}; the role needs REPLICATION, the server "
                              "wal_level=logical and the wal2json plugin "
                              "(postgresql-15-wal2json)") from None
        return control, str(found[0][2])

    def confirmed(self) -> int:
        found = self.one(f"SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE "
                         f"slot_name = {text(self.name)}")
        if not found or found[0] is None:
            raise SourceError(f"{self.url.display}: replication slot {self.name} is gone (dropped "
                              "at the source?); drop the follow (chload sources --drop) and "
                              "follow again")
        return lsn_int(str(found[0]))

    def current(self) -> int:
        return lsn_int(str(self.one("SELECT pg_current_wal_lsn()")[0]))

    def advance(self, to: int) -> None:
        """Move the slot's confirmed position to `to` (never back): called only for
        positions the ledger has committed (or ranges with no change of the table)."""
        if self.confirmed() < to:
            self.one(f"SELECT pg_replication_slot_advance({text(self.name)}, "
                     f"{text(lsn_text(to))}::pg_lsn)")

    def drop(self) -> bool:
        if not self.exists():
            return False
        self.one(f"SELECT pg_drop_replication_slot({text(self.name)})")
        return True

    def retained(self) -> tuple[int, int]:
        """(bytes of WAL the slot keeps from being removed, bytes not yet confirmed)."""
        found = self.one(
            "SELECT (pg_current_wal_lsn() - restart_lsn)::bigint, "
            "(pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots "
            f"WHERE slot_name = {text(self.name)}")
        if not found:
            return 0, 0
        return int(found[0] or 0), int(found[1] or 0)
