"""What a Distributed table is made of, read from the servers before any row: its engine's
arguments, the cluster's layout in system.clusters, one ServerTarget per shard (its first
replica that answers, checked to be of that shard), and the shards' local tables checked
alike. Apart from cluster/target.py, which loads into what this module opened, so the loading
paths read apart from the metadata they rest on.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from chload.errors import ChloadError, TransientError, UsageError
from chload.schema import Column, display_table, quote_ident, quote_str, split_table
from chload.targets.server.http import HttpClient, TargetURL, parse_target_url
from chload.targets.server.target import ServerTarget

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Distributed:
    """A Distributed engine's arguments."""

    cluster: str
    database: str
    table: str
    key: str | None  # the sharding expression; None: no key

    @property
    def local(self) -> str:
        return f"{quote_ident(self.database)}.{quote_ident(self.table)}"


def parse_distributed(engine_full: str) -> Distributed | None:
    """`Distributed(c, db, t[, key[, policy]])` (system.tables.engine_full) -> its args."""
    match = re.match(r"^\s*Distributed\s*\((.*)\)\s*$", engine_full, re.S)
    if not match:
        return None
    args = _split_args(match.group(1))
    if len(args) < 3:
        return None
    names = [a.strip().strip("'`\"") for a in args[:3]]
    key = args[3].strip() if len(args) > 3 and args[3].strip() else None
    return Distributed(names[0], names[1], names[2], key)


def _split_args(text: str) -> list[str]:
    """Top-level comma-separated arguments (parentheses and quotes respected)."""
    args, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = ""
        elif ch in "'`\"":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i])
            start = i + 1
    args.append(text[start:])
    return args


def plain_engine(engine_full: str) -> str:
    """A Replicated*MergeTree's engine clause without replication (its two path/replica
    arguments dropped), for a stage of the same keys: `ReplicatedMergeTree('/p', 'r')
    ORDER BY id` -> `MergeTree() ORDER BY id`."""
    match = re.match(r"^Replicated(\w*MergeTree)\s*\(", engine_full)
    if not match:
        return engine_full
    depth, end = 1, match.end()
    while depth and end < len(engine_full):
        depth += {"(": 1, ")": -1}.get(engine_full[end], 0)
        end += 1
    args = _split_args(engine_full[match.end():end - 1])
    rest = ", ".join(a.strip() for a in args[2:] if a.strip())
    return f"{match.group(1)}({rest}){engine_full[end:]}"


@dataclass(frozen=True, slots=True)
class Replica:
    shard: int
    weight: int
    number: int
    host: str
    port: int  # native TCP, as system.clusters names it
    is_local: bool

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"


def parse_shard_map(values: Sequence[tuple[str, str]]) -> dict[str, str]:
    """--shard HOST:TCP_PORT=URL pairs -> {HOST:TCP_PORT: URL}, checked."""
    found = {}
    for name, url in values:
        host, _, port = name.rpartition(":")
        if not host or not port.isdigit() or not url.startswith(("http://", "https://")):
            raise UsageError(f"--shard {name}={url}: write it as HOST:TCP_PORT=http(s)://HOST:"
                             "PORT, the replica as system.clusters names it and its HTTP URL")
        found[name] = url
    return found


@dataclass(slots=True)
class Shard:
    """One shard: the replica that takes its inserts, as a ServerTarget of its own."""

    number: int
    weight: int
    replica: Replica
    target: ServerTarget
    local_display: str
    engine: str = ""
    local: list[dict] = field(default_factory=list)  # its local table's columns, engine
    stage_engine: str = ""  # ' ENGINE = ...' for a stage of a Replicated table
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return f"shard {self.number} ({self.replica.name})"


# -- opening --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Described:
    """What the target server says of a table, in one query (`describe`)."""

    dist: Distributed | None  # None: not a Distributed table
    replicas: list[dict]  # system.clusters, every cluster
    columns: list[Column] | None  # as ServerTarget.table_columns (None: no such table)


def describe(server: ServerTarget, table: str) -> Described:
    """The table's engine arguments, its columns and system.clusters, in one round trip
    rather than three in a chain (engine, cluster, columns)."""
    database, name = split_table(table)
    where = f"database = {quote_str(database)}"
    rows = server.rows(
        f"SELECT 'engine' AS k, engine AS a, engine_full AS b, '' AS c, '' AS d, '' AS e, "
        f"'' AS f FROM system.tables WHERE {where} AND name = {quote_str(name)} "
        f"UNION ALL SELECT 'column', name, type, default_kind, '', '', '' FROM system.columns "
        f"WHERE {where} AND table = {quote_str(name)} "
        f"UNION ALL SELECT 'replica', cluster, toString(shard_num), toString(shard_weight), "
        f"toString(replica_num), host_name, concat(toString(port), ' ', toString(is_local)) "
        f"FROM system.clusters")
    engine = next((r for r in rows if r["k"] == "engine"), None)
    dist = None
    if engine is not None and engine["a"] == "Distributed":
        dist = parse_distributed(engine["b"])
        if dist is None:
            raise UsageError(f"table {display_table(table)}: cannot read its Distributed "
                             f"arguments ({engine['b']})")
    columns = [Column(r["a"], r["b"], r["c"]) for r in rows if r["k"] == "column"]
    return Described(dist, [r for r in rows if r["k"] == "replica"], columns or None)


def layout_from(server: ServerTarget, described: Described, table: str) -> list[Replica]:
    """The replicas of the Distributed table's cluster (`describe`), by shard and number."""
    assert described.dist is not None
    cluster = described.dist.cluster
    found = []
    for r in (r for r in described.replicas if r["a"] == cluster):
        port, is_local = r["f"].split()
        found.append(Replica(int(r["b"]), int(r["c"]), int(r["d"]), r["e"], int(port),
                             bool(int(is_local))))
    if not found:
        raise UsageError(f"table {display_table(table)}: cluster {cluster} is not in "
                         f"system.clusters of {server.url.display}")
    return sorted(found, key=lambda r: (r.shard, r.number))


def endpoint(replica: Replica, url: TargetURL, shard_map: dict[str, str],
             env: dict[str, str]) -> TargetURL:
    """A replica's HTTP endpoint: --shard's, else its host with the target URL's scheme
    and port."""
    given = shard_map.get(replica.name)
    if given is not None:
        mapped = parse_target_url(given, env)
        return replace(url, scheme=mapped.scheme, host=mapped.host, port=mapped.port)
    return replace(url, host=replica.host)


def open_shards(entry: ServerTarget, table: str, dist: Distributed,
                shard_map: dict[str, str], env: dict[str, str],
                layout: list[Replica]) -> list[Shard]:
    """One ServerTarget per shard: its first replica that answers and is the replica
    system.clusters says (checked by its own is_local row, where it lists the cluster).
    A shard no replica of answers is a UsageError, before any row. The shards are
    opened at once (a few round trips each, which in series would add up at start-up)."""
    seen: dict[str, str] = {}
    guard = threading.Lock()

    def one(number: int) -> Callable[[], Shard]:
        # the target server's own replica first: prefer_localhost_replica sends the
        # route's rows for its shard there
        replicas = sorted((r for r in layout if r.shard == number), key=lambda r: (
            endpoint(r, entry.url, shard_map, env).base != entry.url.base, r.number))
        return lambda: _open_shard(entry, replicas, shard_map, env, (seen, guard), dist)

    opened = each_at_once([one(n) for n in sorted({r.shard for r in layout})])
    shards = [s for s in opened if isinstance(s, Shard)]
    failed = [e for e in opened if isinstance(e, BaseException)]
    if failed:
        for shard in shards:
            shard.target.close()
        raise failed[0]
    return shards


def _open_shard(entry: ServerTarget, replicas: list[Replica], shard_map: dict[str, str],
                env: dict[str, str], seen: tuple[dict[str, str], threading.Lock],
                dist: Distributed) -> Shard:
    tried = []
    for replica in replicas:
        url = endpoint(replica, entry.url, shard_map, env)
        label = f"shard {replica.shard} replica {replica.number}"
        with seen[1]:
            other = seen[0].setdefault(url.display, label)
        if other != label:
            raise UsageError(f"cluster {dist.cluster}: {other} and {label} both "
                             f"map to {url.display}; name each with --shard {replica.name}="
                             "http(s)://HOST:PORT")
        ahead = _Ahead(url, _identity_sql(dist))  # asked while the server is probed
        try:
            target = ServerTarget(url)
        except TransientError as exc:
            ahead.wait()
            tried.append(f"{replica.name} -> {url.display}: {exc}")
            continue
        local = _check_identity(target, replica, dist, url, ahead.wait())
        return Shard(replica.shard, replica.weight, replica, target, "", local=local)
    raise UsageError(f"cluster {dist.cluster}: shard {replicas[0].shard} has no replica that "
                     f"answers ({'; '.join(tried)}); start one, or map it with --shard "
                     "HOST:TCP_PORT=URL; nothing was loaded")


class _Ahead:
    """One query of chload's own asked on a thread with a connection of its own, while
    the caller does something else (a shard's identity check while its ServerTarget
    probes the server: one round trip fewer in the start-up chain); `wait` gives its
    rows, or None if it failed (the caller asks again, with its own error handling)."""

    def __init__(self, url: TargetURL, sql: str) -> None:
        self.rows: list[dict] | None = None
        self._thread = threading.Thread(target=self._ask, args=(url, sql), daemon=True,
                                        name="chload_ahead")
        self._thread.start()

    def _ask(self, url: TargetURL, sql: str) -> None:
        client = HttpClient(url)
        try:
            text = client.post(sql, context=f"server {url.host}:{url.port}", fmt="JSONEachRow",
                               params={"output_format_json_quote_64bit_integers": "0"})
            self.rows = [json.loads(line) for line in text.decode().splitlines() if line]
        except ChloadError:
            self.rows = None
        finally:
            client.close()

    def wait(self) -> list[dict] | None:
        self._thread.join()
        return self.rows


def _identity_sql(dist: Distributed) -> str:
    database, name = quote_str(dist.database), quote_str(dist.table)
    return (
        f"SELECT 'shard' AS k, toString(shard_num) AS name, '' AS type, '' AS engine_full "
        f"FROM system.clusters WHERE cluster = {quote_str(dist.cluster)} AND is_local "
        f"UNION ALL SELECT 'column', name, type, '' FROM system.columns WHERE database = "
        f"{database} AND table = {name} UNION ALL SELECT 'engine', '', '', engine_full FROM "
        f"system.tables WHERE database = {database} AND name = {name}")


def _check_identity(target: ServerTarget, replica: Replica, dist: Distributed,
                    url: TargetURL, rows: list[dict] | None = None) -> list[dict]:
    """The server at `url` says it is of the replica's shard (18.16 marks every replica
    of a server's own shard is_local, so the shard is what can be checked); in the same
    round trip, its local table's columns and engine (check_locals; returned). `rows`:
    that query's answer read already (`_Ahead`), else asked here."""
    rows = rows if rows is not None else target.rows(_identity_sql(dist))
    own = sorted({int(r["name"]) for r in rows if r["k"] == "shard"})
    if own and own != [replica.shard]:
        target.close()
        raise UsageError(
            f"cluster {dist.cluster}: {url.display} is a server of shard "
            f"{', '.join(map(str, own))}, not of shard {replica.shard} ({replica.name}); map "
            f"it with --shard {replica.name}=http(s)://HOST:PORT")
    return [r for r in rows if r["k"] != "shard"]


def check_locals(shards: list[Shard], dist: Distributed, table: str) -> None:
    """Every shard's local table exists, with the same columns, and is a MergeTree
    (Replicated on a shard of several replicas): else one UsageError naming it."""
    database, name = dist.database, dist.table
    first: tuple[str, list[tuple[str, str]]] | None = None
    for shard in shards:  # (each one's rows read as it was opened: _check_identity)
        engine = next((r["engine_full"] for r in shard.local if r["k"] == "engine"), "")
        columns = sorted((r["name"], r["type"]) for r in shard.local if r["k"] == "column")
        where = f"{database}.{name} on {shard.name}"
        if not engine:
            raise UsageError(f"table {display_table(table)}: its local table {where} does "
                             "not exist; create it on every shard first; nothing was loaded")
        if not re.match(r"^(Replicated)?\w*MergeTree\b", engine):
            raise UsageError(f"table {display_table(table)}: local table {where} is "
                             f"{engine.split('(')[0]}; chload loads MergeTree-family tables")
        replicated = engine.startswith("Replicated")
        if replicated and " PARTITION BY " in engine:
            raise UsageError(f"table {display_table(table)}: local table {where} is a "
                             "partitioned Replicated table: not loaded yet (its block numbers "
                             "count per partition, which the commit's mark rule does not "
                             "allow for); use an unpartitioned one, or load each replica")
        if first is None:
            first = (shard.name, columns)
        elif columns != first[1]:
            raise UsageError(f"table {display_table(table)}: local tables differ: {where} "
                             f"has ({_cols(columns)}), {first[0]} has ({_cols(first[1])}); "
                             "make them equal; nothing was loaded")
        shard.engine = engine
        shard.local_display = f"{database}.{name}"
        shard.stage_engine = f" ENGINE = {plain_engine(engine)}" if replicated else ""
        if replicated:
            shard.target.stage_engines[dist.local] = shard.stage_engine


def _cols(columns: list[tuple[str, str]]) -> str:
    return ", ".join(f"{n} {t}" for n, t in columns)


def each_at_once(calls: Sequence[Callable[[], T]]) -> list[T | BaseException]:
    """Each call on a thread of its own (one per shard: a round trip or a few each),
    results in the calls' order, a ChloadError as the result of the call that raised it."""
    from chload.core.run import on_threads

    def one(i: int) -> tuple[int, T | BaseException]:
        try:
            return i, calls[i]()
        except ChloadError as exc:
            return i, exc

    results = dict(on_threads(one, range(len(calls)), len(calls) or 1))
    return [results[i] for i in range(len(calls))]


def at_once(calls: Sequence[Callable[[], T]]) -> list[T]:
    """As each_at_once; the first error is raised once every call is done."""
    results = each_at_once(calls)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]
