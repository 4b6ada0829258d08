"""The import methods compared: chload's variants and the classic ways people load
ClickHouse, each a whole process (start-up counts, as it does for users).

A method says which target it writes to (`embedded`: chDB in a fresh directory per
run; `server`: a fresh table on the ClickHouse 18.16 server per run), which file
formats it can take, whether it adds audit columns, and how to build its command line
for one run. The suite times the command, then counts the rows independently.

Audit columns: chload `--audit` adds `_source_file` and `_loaded_at`; the hand-written
methods add `_source_filename` and `_file_ts` (the file's mtime), as the classic Python
loader does. Same work: a file name and a timestamp on every row.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass

from suite.datasets import Dataset

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENGINE_SQL = os.path.join(HERE, "engine_sql.py")
LOADERS = os.path.join(HERE, "loaders.py")

TEXT = frozenset({"csv", "csv.gz", "jsonl", "jsonl.gz"})  # what 18.16 parses itself
GZIP = frozenset({"csv.gz", "jsonl.gz"})
JSON = frozenset({"jsonl", "jsonl.gz"})
ALL = frozenset({"csv", "csv.gz", "jsonl", "jsonl.gz", "parquet"})
SERVER_AUDIT_COLUMNS = ", _source_filename String, _file_ts DateTime"


@dataclass(frozen=True)
class Env:
    """What commands need to know about this run of the suite."""

    python: str
    parallel: int  # client processes/threads of the "parallel" variants
    server_url: str = ""  # http://127.0.0.1:PORT
    server_tcp: int = 0
    database: str = "bench"


@dataclass(frozen=True)
class Slot:
    """Where one run writes: a fresh embedded directory or a fresh server table."""

    dataset: Dataset
    directory: str = ""  # embedded: the chDB directory (table `t`)
    table: str = ""  # server: db.table


Build = Callable[[Env, Slot], list[str]]


@dataclass(frozen=True)
class Method:
    name: str
    target: str  # embedded | server
    mode: str  # sequential | parallel N | engine threads | auto
    build: Build
    exts: frozenset[str] = ALL
    audit: bool = False
    chload: bool = False
    creates_table: bool = False  # else the suite creates the server table first
    about: str = ""

    @property
    def key(self) -> str:
        return f"{self.name} [{self.target}]"

    def command(self, env: Env, slot: Slot) -> list[str]:
        return self.build(env, slot)


def _chload(audit: bool, server: bool, pythonpath: str = "") -> Build:
    """chload's own command; with `pythonpath`, the copy of another commit found there
    (scripts/bench --chload-vs REV: both commits measured in one run)."""
    def build(env: Env, slot: Slot) -> list[str]:
        ds = slot.dataset
        if server:
            db, table = slot.table.split(".")
            where = ["--table", table, "--target", f"{env.server_url}/{db}"]
        else:
            where = ["--table", "t", "--target", slot.directory]
        other = ["env", f"PYTHONPATH={pythonpath}"] if pythonpath else []
        return [*other, env.python, "-m", "chload", "load", ds.glob, *where, "--schema",
                ds.schema, "--order-by", ds.order_by, "--json",  # the report: runner.costs_of
                *(["--audit"] if audit else [])]
    return build


def _engine_embedded(tuned: bool, audit: bool) -> Build:
    def build(env: Env, slot: Slot) -> list[str]:
        ds = slot.dataset
        return [env.python, ENGINE_SQL, "embedded", slot.directory, ds.glob, ds.format,
                ds.schema, ds.order_by, *(["--tuned"] if tuned else []),
                *(["--audit"] if audit else [])]
    return build


def _engine_push(audit: bool) -> Build:
    def build(env: Env, slot: Slot) -> list[str]:
        ds = slot.dataset
        return [env.python, ENGINE_SQL, "push", env.server_url, slot.table, ds.glob, ds.format,
                ds.schema, *(["--audit"] if audit else [])]
    return build


def _insert_url(env: Env, slot: Slot) -> str:
    query = f"INSERT INTO {slot.table} FORMAT {slot.dataset.format}".replace(" ", "%20")
    return f"{env.server_url}/?query={query}"


def _curl(parallel: bool) -> Build:
    def build(env: Env, slot: Slot) -> list[str]:
        gz = "-H 'Content-Encoding: gzip' " if slot.dataset.compression == "gzip" else ""
        curl = f"curl -sS --fail {gz}--data-binary @\"$f\" {shlex.quote(_insert_url(env, slot))}"
        if parallel:  # xargs exits non-zero when any curl fails
            script = (f"printf '%s\\0' \"$@\" | xargs -0 -P {env.parallel} -n 1 "
                      f"sh -c {shlex.quote('f=$1; ' + curl)} _")
        else:
            script = f"for f in \"$@\"; do {curl} || exit 1; done"
        return ["bash", "-c", script, "_", *slot.dataset.paths()]
    return build


def _client(parallel: bool) -> Build:
    def build(env: Env, slot: Slot) -> list[str]:
        insert = f"INSERT INTO {slot.table} FORMAT {slot.dataset.format}"
        pipe = (f"gunzip -c \"$f\" | clickhouse-client --host 127.0.0.1 "
                f"--port {env.server_tcp} --query {shlex.quote(insert)}")
        if parallel:
            one = "set -o pipefail; f=$1; " + pipe
            script = (f"printf '%s\\0' \"$@\" | xargs -0 -P {env.parallel} -n 1 "
                      f"bash -c {shlex.quote(one)} _")
        else:
            script = f"set -o pipefail; for f in \"$@\"; do {pipe} || exit 1; done"
        return ["bash", "-c", script, "_", *slot.dataset.paths()]
    return build


def _python(kind: str, parallel: bool) -> Build:
    def build(env: Env, slot: Slot) -> list[str]:
        ds = slot.dataset
        return [env.python, LOADERS, kind, env.server_url + "/", slot.table, ds.format,
                str(env.parallel if parallel else 1), *ds.paths()]
    return build


def vs_methods(label: str, pythonpath: str) -> list[Method]:
    """chload of another commit (`label`), on both targets, with and without audit: its
    ratio_vs_chload is then the measured commit against that one, in the same run."""
    about = f"chload at {label}, copied to {pythonpath}"
    return [Method(f"chload @{label}{' --audit' if audit else ''}", target, "auto",
                   _chload(audit, target == "server", pythonpath), audit=audit,
                   creates_table=True, about=about)
            for target in ("embedded", "server") for audit in (False, True)]


def all_methods(parallel: int) -> list[Method]:
    """Every method, chload's first. `parallel` is the client count of parallel variants."""
    par = f"parallel {parallel}"
    return [
        Method("chload", "embedded", "auto", _chload(False, False), chload=True,
               creates_table=True, about="chload load into a directory (chDB)"),
        Method("chload --audit", "embedded", "auto", _chload(True, False), audit=True,
               chload=True, creates_table=True, about="same, adding _source_file, _loaded_at"),
        Method("chDB SQL (defaults)", "embedded", "engine threads", _engine_embedded(False, False),
               creates_table=True, about="CREATE TABLE + INSERT SELECT FROM file(glob)"),
        Method("chDB SQL (tuned)", "embedded", "engine threads", _engine_embedded(True, False),
               creates_table=True, about="same with expert settings (engine_sql.TUNED)"),
        Method("chDB SQL + audit columns", "embedded", "engine threads",
               _engine_embedded(False, True), audit=True, creates_table=True,
               about="same, adding _file and _time virtual columns"),
        Method("chload", "server", "auto", _chload(False, True), chload=True, creates_table=True,
               about="chload load --target http://127.0.0.1:PORT/bench"),
        Method("chload --audit", "server", "auto", _chload(True, True), audit=True, chload=True,
               creates_table=True, about="same, adding _source_file, _loaded_at"),
        Method("chDB SQL push (Native)", "server", "engine threads", _engine_push(False),
               about="chDB reads the files, INSERT INTO FUNCTION url(..., Native)"),
        Method("chDB SQL push + audit columns", "server", "engine threads", _engine_push(True),
               exts=ALL, audit=True, about="same, adding _file and _time virtual columns"),
        Method("curl POST, sequential", "server", "sequential", _curl(False), exts=TEXT,
               about="for f in files: curl --data-binary @f (Content-Encoding: gzip)"),
        Method(f"curl POST, {par}", "server", par, _curl(True), exts=TEXT,
               about=f"xargs -P {parallel} curl --data-binary @f"),
        Method("gunzip | clickhouse-client, sequential", "server", "sequential", _client(False),
               exts=GZIP, about="for f in files: gunzip -c f | clickhouse-client --query INSERT"),
        Method(f"gunzip | clickhouse-client, {par}", "server", par, _client(True), exts=GZIP,
               about=f"xargs -P {parallel} (gunzip -c f | clickhouse-client)"),
        Method("Python requests POST, sequential", "server", "sequential", _python("post", False),
               exts=TEXT, about="requests.post(file as is) per file"),
        Method(f"Python requests POST, {par}", "server", par, _python("post", True), exts=TEXT,
               about=f"same, {parallel} threads"),
        Method("Python orjson audit, sequential", "server", "sequential", _python("audit", False),
               exts=JSON, audit=True,
               about="parse each line, add _source_filename/_file_ts, orjson, gzip, POST"),
        Method(f"Python orjson audit, {par}", "server", par, _python("audit", True), exts=JSON,
               audit=True, about=f"same, {parallel} processes"),
    ]


def server_ddl(ds: Dataset, table: str, audit: bool) -> str:
    """The table the classic server methods load into (chload makes its own)."""
    columns = ds.schema + (SERVER_AUDIT_COLUMNS if audit else "")
    return f"CREATE TABLE {table} ({columns}) ENGINE = MergeTree ORDER BY {ds.order_by}"


def python_env() -> str:
    return sys.executable
