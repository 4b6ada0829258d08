"""`chload sources` for MySQL/MariaDB follows: each followed table's binlog position,
the server's, the lag between them, and whether the binlog files it needs are still there.

The ledger says where a follow stands (its stream's committed end, a
mysql_table.position) and when it last committed; the server says where its binlog is now
(SHOW MASTER STATUS) and which files it still keeps (SHOW BINARY LOGS, with their sizes):
the lag in bytes is the binlog written since the follow's end, across files; in seconds
the time since the last commit while there is lag. No slot holds the binlog for a follow:
the server purges files by age (`expire_logs_days` / `binlog_expire_logs_seconds`) or on
PURGE BINARY LOGS, so the warning is a file the follow needs that is gone (it cannot
resume) or that is the oldest left (next to go).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from chload.commit.ledger import RUNS
from chload.errors import ChloadError
from chload.schema import quote_str
from chload.sources.changes import followed, mysql_table
from chload.sources.changes.mysql import SCHEME, Server
from chload.sources.databases.table import DbUrl

if TYPE_CHECKING:
    from chload.targets.base import Target

_EXPIRY = ("expire_logs_days", "binlog_expire_logs_seconds")


def _user(target: Target, table: str, where: str, env: Mapping[str, str]) -> str:
    """The user the table's last load of this source named (the stream's name has none;
    the run history keeps the source as typed, without its password); else MYSQL_USER."""
    rows = target.rows(f"SELECT sources FROM {RUNS} WHERE target_table = {quote_str(table)} "
                       f"AND position(sources, {quote_str('@' + where)}) > 0 "
                       "ORDER BY started_ns DESC LIMIT 1")
    found = re.search(r"mysql://([^@/:\s]+)(?::[^@/\s]*)?@" + re.escape(where),
                      str(rows[0]["sources"])) if rows else None
    return found.group(1) if found else env.get("MYSQL_USER", "")


def _url(target: Target, table: str, stream: str, env: Mapping[str, str]) -> DbUrl:
    """The source a stream name says (mysql-changes://host:port/db/table), its password
    from MYSQL_PWD."""
    parts = urlsplit(stream)
    database, name = [p for p in parts.path.split("/") if p][:2]
    where = f"{parts.hostname}:{parts.port or 3306}/{database}/{name}"
    return DbUrl("mysql", _user(target, table, where, env), parts.hostname or "",
                 parts.port or 3306, database, database, name, env.get("MYSQL_PWD"))


def lag_bytes(logs: list[tuple[str, int]], at: tuple[str, int],
              now: tuple[str, int]) -> int:
    """The binlog written from `at` to `now` (file, offset) over the files kept, in order
    (SHOW BINARY LOGS: name, size)."""
    if at[0] == now[0]:
        return max(0, now[1] - at[1])
    later = [size for name, size in logs if at[0] < name < now[0]]
    size = dict(logs).get(at[0], at[1])
    return max(0, size - at[1]) + sum(later) + now[1]


def _expiry(server: Server) -> str:
    said = []
    for name in _EXPIRY:
        found = server.rows(f"SHOW VARIABLES LIKE {quote_str(name)}")
        if found:
            said.append(f"{name}={found[0][1]}")
    return ", ".join(said) or "the server's binlog expiry"


def _warning(server: Server, table: str, logs: list[tuple[str, int]], needed: str,
             current: str) -> str | None:
    names = [n for n, _ in logs]
    if needed not in names and needed < current:
        return (f"binlog {needed}, which the follow of {table} reads next, is no longer on "
                f"the server (purged; oldest left: {names[0] if names else 'none'}): the "
                "follow cannot resume; copy the table again with a new --table (or drop "
                f"{table} in ClickHouse and load it again), and forget this follow "
                f"(chload sources --drop {table})")
    if names and needed == names[0] and needed != current:
        return (f"binlog {needed}, which the follow of {table} reads next, is the oldest "
                f"left on the server: the next purge removes it ({_expiry(server)}); run "
                "the follow now, or lengthen the expiry")
    return None


def follows(target: Target, env: Mapping[str, str], drop: str | None = None,
            clusters: Sequence[Target] = ()) -> list[dict[str, Any]]:
    """One entry per followed MySQL table (with `drop`: that table's follows, forgotten;
    none when it has no MySQL follow): table, source, binlog (the position loaded),
    server_binlog, lag_bytes, lag_seconds, warning (or error). `clusters`: the target's
    Distributed tables, opened (followed.py), whose follows are listed too."""
    found = followed.streams(target, clusters, SCHEME)
    if drop is not None:
        wanted = drop if "." in drop else f"{target.database}.{drop}"
        found = [f for f in found if f.table == wanted]
    out = []
    for f in found:
        table, stream = f.table, f.stream
        url = _url(target, table, stream, env)  # (the run history: the target server's)
        entry: dict[str, Any] = {"table": table, "source": url.with_user, "kind": "mysql"}
        if drop is not None:
            out.append({**entry, "dropped": False})
            continue
        if f.error or f.end is None:
            out.append({**entry, "error": f.error})
            continue
        end = f.end
        try:
            server = Server(url)
        except ChloadError as exc:
            out.append({**entry, "error": str(exc)})
            continue
        try:
            now = server.master()
            at = mysql_table.log_of(end, now[0])
            logs = [(str(r[0]), int(r[1])) for r in server.rows("SHOW BINARY LOGS")]
            lag = lag_bytes(logs, at, now)
            since = (time.time_ns() - followed.last_commit_ns(f.where, table, stream)) / 1e9
            entry.update(binlog=f"{at[0]}:{at[1]}", server_binlog=f"{now[0]}:{now[1]}",
                         lag_bytes=lag, lag_seconds=round(since, 1) if lag else 0.0)
            warning = _warning(server, table, logs, at[0], now[0])
            if warning:
                entry["warning"] = warning
        except ChloadError as exc:
            entry["error"] = str(exc)
        finally:
            server.close()
        out.append(entry)
    return out
