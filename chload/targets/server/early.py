"""A server target's first requests, begun while the loader still imports.

`chload load` names its target and table before it imports the engine (cli._load), so a
thread connects and runs the probe and a load's first reads meanwhile; ServerTarget takes
them (`claim`). docs/target-server.md ("How it works inside") says why.

Invariants: reads only (a server whose ledger is not complete gets the probe alone); each
answer is given once, for its very SQL, unless a write comes first (ServerTarget.rows /
command); the thread imports nothing (an import on two threads can deadlock on a circular
one): `begin` imports what it runs; any failure leaves nothing and the load asks again.
An early answer is one a run started that much earlier would have read: the commit
protocol trusts it no more than that (committer.py).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from chload.commit.ledger import LEDGER_TABLES, Ledger
from chload.commit.locks import dirty_name
from chload.commit.request import _start_sql  # (the survey's query)
from chload.errors import ChloadError, SchemaError, TransientError, missing_table, retyped
from chload.runtime.retry import RetryPolicy, retry
from chload.schema import display_table, quote_ident, quote_str, split_table
from chload.targets.server.capabilities import Capabilities, probe_gzipped
from chload.targets.server.http import HttpClient, TargetURL, parse_target_url

_SYSTEM_RETRY = RetryPolicy(attempts=6, base_seconds=0.01, jitter=False)  # 10 ms, 20 ms ...
NUMBERS = {"output_format_json_quote_64bit_integers": "0"}  # 64-bit integers as numbers


@dataclass(slots=True)
class Early:
    """What the thread got: the client (connected), the capabilities, the answers."""

    url: TargetURL
    client: HttpClient
    thread: threading.Thread = field(default_factory=threading.Thread)
    caps: Capabilities | None = None
    answers: dict[str, list[dict]] = field(default_factory=dict)


_EARLY: list[Early] = []
# While the thread asks, the main thread imports: an answer that has come back waits
# at most this long for the interpreter's lock (not the default 5 ms) to be read.
_SWITCH, _DEFAULT_SWITCH = 0.0005, sys.getswitchinterval()


def begin(target: str, table: str, env: Mapping[str, str]) -> None:
    """Start asking `target` (a --target URL) what a load into `table` asks first."""
    try:
        url = parse_target_url(target, env)
        client = HttpClient(url)  # (https: ssl is imported here, not on the thread)
    except ChloadError:
        return  # the load reports it
    parts = table.split(".")
    names = (url.database, *parts) if len(parts) == 1 else tuple(parts)
    early = Early(url, client)
    early.thread = threading.Thread(target=_ask_all, args=(early, names), daemon=True,
                                    name="chload-server-early")
    _EARLY.append(early)
    sys.setswitchinterval(_SWITCH)
    early.thread.start()


def claim(url: TargetURL) -> Early | None:
    """What was asked of `url` (waiting for the thread), or None: nothing begun for it,
    or it failed (the caller asks again)."""
    found = [e for e in _EARLY if e.url == url]
    if not found:
        return None
    early = found[0]
    _EARLY.remove(early)
    early.thread.join()
    sys.setswitchinterval(_DEFAULT_SWITCH)
    if early.caps is None:
        early.client.close()
        return None
    return early


def discard() -> None:
    """Close what no target claimed (the load failed before it opened one), without
    waiting: a request still on its way fails on the closed connection."""
    while _EARLY:
        _EARLY.pop().client.close()
        sys.setswitchinterval(_DEFAULT_SWITCH)


def _ask_all(early: Early, names: tuple[str, ...]) -> None:
    reads = _Reads(early)
    try:
        early.caps = probe(early.client, reads.where)
        if len(names) == 2 and LEDGER_TABLES <= early.caps.ledger_tables:
            table = f"{quote_ident(names[0])}.{quote_ident(names[1])}"
            reads.rows(columns_sql(table))
            reads.rows(_start_sql(dirty_name(table), display_table(table)))
            ledger = Ledger(reads)
            ledger.table_state(*names)
            ledger.summed(display_table(table))
    except Exception:  # noqa: BLE001 -- the load asks again, and reports it there
        early.answers.clear()


class _Reads:
    """The reads' side of a ledger's Sql: each answer kept in `early.answers`."""

    def __init__(self, early: Early) -> None:
        self.early = early
        self.where = f"server {early.url.host}:{early.url.port}"

    def rows(self, sql: str) -> list[dict]:
        text = ask(self.early.client, self.where, sql, "JSONEachRow", NUMBERS)
        found = [json.loads(line) for line in text.splitlines() if line]
        self.early.answers[sql] = found
        return found

    def binary(self, sql: str, fmt: str) -> bytes:
        """A long answer (the ledger's keys): not read early, the load asks it."""
        raise RuntimeError(f"asked ahead, short answers only: {sql[:40]}")

    def command(self, sql: str) -> None:
        raise RuntimeError(f"asked ahead, reads only: {sql[:40]}")


def probe(client: HttpClient, where: str) -> Capabilities:
    """The server's capabilities (capabilities.py), the question sent gzipped."""
    def accepts(method: str, body: bytes) -> bool:
        client.request(None, body, context=where, headers={"Content-Encoding": method})
        return True

    return probe_gzipped(lambda sql, body: ask(client, where, sql, "TSV", body=body,
                                               encoding="gzip"), accepts)


def ask(client: HttpClient, where: str, sql: str, fmt: str,
        params: Mapping[str, str] | None = None, body: bytes | None = None,
        encoding: str = "") -> str:
    """chload's own query, answered as text.

    18.16 lists system.tables (and parts) by name and fails the whole query with
    "Table X doesn't exist" when X, any table of a listed database, is dropped
    meanwhile: another stream's stage, after its commit. Asked again, it answers.
    """
    def once() -> str:  # bytes that are not UTF-8 kept as surrogates (engine._text)
        if body is None:
            answer = client.post(sql, context=where, fmt=fmt, params=params)
        else:
            answer = client.request(None, body, context=where, headers={
                "Content-Encoding": encoding}, params={"default_format": fmt})
        return answer.decode(errors="surrogateescape")

    def meanwhile(exc: BaseException) -> bool:
        return isinstance(exc, SchemaError) and dropped_meanwhile(sql, exc)

    try:
        return retry(once, _SYSTEM_RETRY, retry_if=meanwhile)
    except SchemaError as exc:
        if not meanwhile(exc):
            raise
        raise retyped(exc, TransientError) from None


def dropped_meanwhile(sql: str, error: ChloadError) -> bool:
    """A query over system tables failed because a table it does not name was dropped
    while the server listed them (see `ask`)."""
    name = missing_table(error)
    return "system." in sql and name is not None and f"'{name}'" not in sql


def columns_sql(table: str) -> str:
    """A table's columns, and its engine in a row of its own (ServerTarget.table_columns)."""
    database, name = split_table(table)
    where = f"database = {quote_str(database)} AND "
    return (f"SELECT name, type, default_kind, '' AS engine FROM system.columns WHERE "
            f"{where}table = {quote_str(name)} UNION ALL SELECT '', '', '', engine FROM "
            f"system.tables WHERE {where}name = {quote_str(name)}")
