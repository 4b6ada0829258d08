"""How a server target fills a stage: the bytes posted as they are (raw), rows pushed
through the loader's engine (push), a batch streamed through that engine (one INSERT
for all its files, their rows counted on the way: `_flow`; over https gathered there
first: `_gather`); and how many rows go into each part the server writes.

Split from server/target.py, whose ServerTarget mixes `StageFilling` in: these are the ways
into a fresh stage (server/target.py's docstring says when each is taken, and why); the
target itself connects, runs SQL, and commits (committer.py).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, BinaryIO

from chload.commit.ledger import DATABASE
from chload.core.reading import fit, sniff
from chload.errors import DataError
from chload.formats import JSON_LINES
from chload.runtime.engine import Engine
from chload.schema import (
    AUDIT_COLUMNS,
    Column,
    header_columns,
    quote_ident,
    quote_str,
    settings_sql,
    structure,
)
from chload.sources.base import SourceFile
from chload.targets.base import Loaded, LoadJob
from chload.targets.server.capabilities import Capabilities
from chload.targets.server.http import HttpClient, TargetURL
from chload.targets.server.push import (
    PUSH_SETTINGS,
    push_error,
    push_sql,
    push_url,
    select_many_sql,
    select_sql,
    stream_push,
)
from chload.targets.server.relay import Unfit, open_relay, relayable
from chload.targets.server.stages import Streams
from chload.targets.vanished import check_present, open_listed, reading

RAW, PUSH = "raw", "push"
GATHERED_FILES = 16  # a batch of this many small files is read by the loader's engine
FLOW_DATABASE = "chload_flow"  # the loader's engine's tables of a streamed batch (_flow)
PIPE_CHUNK = 1 << 20  # bytes read from a pipe per HTTP chunk
_NUMERIC = re.compile(r"^(Nullable\()?(U?Int\d+|Float\d+|Decimal.*)\)?$")
PART_BYTES = 128 << 20  # rows in memory per part the server writes for a stage ...
DEFAULT_PART_ROWS, MAX_PART_ROWS = 1 << 20, 1 << 26  # ... within these (server default)
PARQUET_BLOCK_BYTES, PARQUET_DEFAULT_ROWS = 16 << 20, 65409  # a pushed Parquet block
SERIAL_PARSE_BELOW = 1 << 20  # files (as stored) a push parses without parallel parsing
PIPE_PART_BYTES = 512 << 20  # ... and for a piped unit (a database range, at most about
# 3M rows: sources/databases/base.py RANGE_ROWS): its stage in one part, so no merge after the
# stream (docs/sources-databases.md "How a table is read")


class StageFilling:
    """The ways into a stage, mixed into ServerTarget: its URL, capabilities, HTTP
    client, loader's engine and data streams, and its SQL (declared below for mypy)."""

    url: TargetURL
    caps: Capabilities
    client: HttpClient
    engine: Engine
    _streams: Streams
    insert_params: dict[str, str]  # server settings of every data INSERT (a cluster's route)

    if TYPE_CHECKING:
        def command(self, sql: str) -> None: ...

        def rows(self, sql: str) -> list[dict]: ...

        def reader(self, file: SourceFile, fmt: str,
                   columns: Sequence[Column] | None) -> str: ...

        def table_columns(self, table: str) -> list[Column] | None: ...

    def path_for(self, job: LoadJob) -> str:
        """raw when the server reads the bytes as they are; else push through chDB."""
        f = job.file
        if self.url.path == PUSH:  # ?path=push in the target URL
            return PUSH
        known = all(name in self.caps.settings for name, _ in job.settings)
        if (not job.audit and (f.local_path or relayable(job)) and known
                and self.caps.parses(f.format.name)
                and not any(g.constants for g in job.files)  # (only a read adds them)
                and self.caps.accepts(f.format.compression) and not self._empty_differs(job)
                and _header_fits(job)):
            return RAW
        return PUSH

    def _empty_differs(self, job: LoadJob) -> bool:
        """Whether the server would read an empty CSV field of a Nullable column as the
        type's default (0, '') where chDB reads NULL: a server without the setting
        `input_format_csv_empty_as_default` (18.16) does. A file whose start has such a
        field (fit.empty_fields) is pushed, so the table holds what the embedded target
        would (tests/integration/test_values_fit.py); one that writes NULL as `\\N`, as
        ClickHouse does, is posted as it is (a push costs more). An empty field after
        the first 16 KB is read as 0."""
        return self._empty_matters(job) and fit.empty_fields(job.file)

    def _empty_matters(self, job: LoadJob) -> bool:
        return (job.file.format.name.startswith("CSV")
                and "input_format_csv_empty_as_default" not in self.caps.settings
                and any("Nullable(" in c.type for c in job.columns))

    def _fill(self, job: LoadJob, stage: str, fallback: bool = True) -> int:
        """Fill the stage; return the bytes read from the source."""
        if self.path_for(job) == RAW:
            try:
                return self._post_raw(job, stage)
            except Unfit:  # (a remote object: nothing posted) the loader's engine reads it
                pass
            except DataError:
                if not fallback or is_pipe(job.file):  # a pipe cannot be read again
                    raise
                # 18.16 reads fewer dialects than chDB: let the loader's engine try.
                self.command(f"TRUNCATE TABLE {DATABASE}.{stage}")
        return self._push(job, stage)

    def _post_raw(self, job: LoadJob, stage: str) -> int:
        f = job.file
        if f.local_path is None:
            return self._relay(job, stage)
        names = _raw_names(job)
        with os.fdopen(open_listed(f), "rb") as body:
            if is_pipe(f):  # a source writing as it reads (a database range): posted
                counted = [0]  # chunked, as the bytes come
                with self._streams.data() as slot:
                    self._insert_raw(job, stage, names, _counted(
                        iter(partial(body.read, PIPE_CHUNK), b""), counted), PIPE_PART_BYTES)
                    slot.bytes = counted[0]
                return counted[0]
            if not f.size:  # no rows to post (and sendfile refuses a length of 0)
                return 0
            with self._streams.data() as sent:
                sent.bytes = f.size
                self._insert_raw(job, stage, names, body, length=f.size)
        return f.size

    def _relay(self, job: LoadJob, stage: str) -> int:
        """A remote object's bytes posted as they come from its source (relay.py);
        Unfit (nothing posted) when the loader's engine is to read it."""
        relay = open_relay(job, self._empty_matters(job), self.caps.version)
        try:
            if relay.empty:
                return 0
            counted = [0]
            with self._streams.data() as slot:
                slot.bytes = job.file.size
                self._insert_raw(job, stage, relay.names, _counted(relay.chunks, counted))
            return counted[0]
        finally:
            relay.close()

    def _insert_raw(self, job: LoadJob, stage: str, names: Sequence[str],
                    body: BinaryIO | Iterator[bytes], budget: int = PART_BYTES,
                    length: int | None = None) -> None:
        """One INSERT of a file's bytes as they are (`names`: its columns in its order),
        with its compression said and its parts sized (_part_rows)."""
        f = job.file
        headers = {}
        if f.format.compression != "none":
            headers["Content-Encoding"] = f.format.compression
        params = {"max_insert_block_size": str(self._part_rows(job, budget)),
                  **self.insert_params, **dict(job.settings)}
        columns = ", ".join(quote_ident(name) for name in names)
        self.client.request(f"INSERT INTO {DATABASE}.{stage} ({columns}) FORMAT "
                            f"{f.format.name}", body, length=length, headers=headers,
                            params=params, context=f.uri)

    def _part_rows(self, job: LoadJob, budget: int = PART_BYTES) -> int:
        """Rows per part the server writes: one part per file up to `budget` bytes of
        rows in memory (~128 MB; a piped database range 512 MB), so most stages need no
        merge before the attach (committer.py rule 2), a merge that would run after the
        stream is gone (bench/databases.py variant `onepart`)."""
        width = sum(_width(c.type) for c in job.columns) + (64 if job.audit else 0)
        return max(DEFAULT_PART_ROWS, min(MAX_PART_ROWS, budget // max(1, width)))

    def _gathers(self, job: LoadJob) -> bool:
        """Read a batch in the loader's engine (`_flow`) when it would push anyway, and
        for JSON lines with other than numeric columns: 18.16 parses strings, dates and
        arrays in JSON slowly, while numbers only are faster a request per file; and a
        batch of GATHERED_FILES small files or more: one request for all of them, not
        two a file (its post, and its rows counted)."""
        if self.path_for(job) == PUSH or len(job.files) >= GATHERED_FILES:
            return True
        return (job.file.format.name in JSON_LINES
                and not all(_NUMERIC.match(c.type) for c in job.columns))

    def _batch_select(self, job: LoadJob, audit: dict[str, str] | None) -> str:
        """Every file of a batch, read as the table's columns, each row's uri as
        `_chload_file`: one table function where the files can share one."""
        return select_many_sql(job.files, job.columns, job.read_columns, audit,
                               "_chload_file") or " UNION ALL ".join(
            f"SELECT *, {quote_str(f.uri)} AS _chload_file FROM "
            f"({select_sql(f, job.columns, job.read_columns, audit)})" for f in job.files)

    def _flow(self, job: LoadJob, stage: str) -> list[Loaded]:
        """A batch of small files streamed to the stage as the loader's engine reads
        them, each file's rows counted on the way: one INSERT into a Null table in the
        engine, whose two views push the rows to the server (a URL table: one Native
        request) and count them per file (a Memory table).

        As fast as chDB's own push of the same files; gathering each batch in a Memory
        table first leaves the server idle until every file is read.
        Over https the engine cannot reach the server with our CA (push.py): _gather."""
        if self.url.secure:
            return self._gather(job, stage)
        columns, audit = self._push_columns(job)
        names = ", ".join(quote_ident(c.name) for c in columns)
        context = f"batch of {len(job.files)} files from {job.file.uri}"
        flow = f"{FLOW_DATABASE}.f{os.urandom(6).hex()}"
        insert = f"INSERT INTO {DATABASE}.{stage} ({names}) FORMAT Native"
        squash = {"min_insert_block_size_rows": str(self._part_rows(job)),
                  "min_insert_block_size_bytes": str(PART_BYTES), **self.insert_params}
        url = push_url(self.url, insert, self._push_encoding(), squash)
        tables = [
            f"CREATE DATABASE IF NOT EXISTS {FLOW_DATABASE} ENGINE = Memory",  # (no disk:
            # the URL table's DDL holds the password)
            f"CREATE TABLE {flow}_in ({structure(columns)}, _chload_file "
            "LowCardinality(String)) ENGINE = Null",  # (LowCardinality, as `_file` is: a
            # String per row is costly on narrow rows)
            f"CREATE TABLE {flow}_out ({structure(columns)}) ENGINE = {url}",
            f"CREATE TABLE {flow}_n (f String, n UInt64) ENGINE = Memory",
            f"CREATE MATERIALIZED VIEW {flow}_push TO {flow}_out AS SELECT {names} "
            f"FROM {flow}_in",
            f"CREATE MATERIALIZED VIEW {flow}_count TO {flow}_n AS SELECT _chload_file AS f, "
            f"count() AS n FROM {flow}_in GROUP BY f"]
        try:
            for sql in tables:
                self.engine.query(sql, "TSV", context)
            with self._streams.data() as sent:
                sent.bytes = sum(f.size for f in job.files)
                self.engine.execute(
                    f"INSERT INTO {flow}_in {self._batch_select(job, audit)} SETTINGS "
                    f"{settings_sql(self._push_settings(job))}", context,
                    partial(push_error, context=context, url=self.url))
            counts = {r["f"]: int(r["n"]) for r in self.engine.rows(
                f"SELECT f, sum(n) AS n FROM {flow}_n GROUP BY f", context)}
        finally:
            for name in ("_push", "_count", "_in", "_out", "_n"):
                self.engine.query(f"DROP TABLE IF EXISTS {flow}{name}", "TSV", context)
        check_present(job.files, counts, reading(self.engine, self.reader, job.read_columns))
        return [Loaded(counts.get(f.uri, 0), f.size) for f in job.files]

    def _gather(self, job: LoadJob, stage: str,
                inspect: Callable[[str], None] | None = None) -> list[Loaded]:
        """A batch of small files through the loader's engine: one query reads every file
        into a Memory table that keeps each row's file (exact rows per file), then one
        Native stream fills the stage. The stage gets one part and needs no merge; a
        request per file made a part per file, merged before the attach.
        `inspect` is given the Memory table's name (in the loader's engine, its rows'
        file in `_chload_file`) once it is filled: a cluster counts each file's rows
        per shard there."""
        columns, audit = self._push_columns(job)
        memory = f"chload_batch_{os.urandom(6).hex()}"
        context = f"batch of {len(job.files)} files from {job.file.uri}"
        union = self._batch_select(job, audit)
        self.engine.query(f"CREATE TABLE {memory} ({structure(columns)}, _chload_file String) "
                          "ENGINE = Memory", "TSV", context)
        try:
            self.engine.execute(f"INSERT INTO {memory} {union} SETTINGS "
                                f"{settings_sql(self._push_settings(job))}", context)
            counts = {r["f"]: int(r["n"]) for r in self.engine.rows(
                f"SELECT _chload_file AS f, count() AS n FROM {memory} GROUP BY f", context)}
            check_present(job.files, counts, reading(self.engine, self.reader, job.read_columns))
            names = ", ".join(quote_ident(c.name) for c in columns)
            self._push(job, stage, f"SELECT {names} FROM {memory}")
            if inspect is not None:
                inspect(memory)
        finally:
            self.engine.query(f"DROP TABLE IF EXISTS {memory}", "TSV", context)
        return [Loaded(counts.get(f.uri, 0), f.size) for f in job.files]


    def _push_columns(self, job: LoadJob) -> tuple[list[Column], dict[str, str] | None]:
        """The stage's columns a push fills, with the audit columns' types (if any)."""
        columns = list(job.columns)
        audit = None
        if job.audit:
            table = {c.name: c.type for c in self.table_columns(job.table) or []}
            audit = {name: table.get(name, typ) for name, typ in AUDIT_COLUMNS.items()}
            columns += [Column(n, t) for n, t in audit.items()]
        return columns, audit

    def _push_settings(self, job: LoadJob, extra: Sequence[tuple[str, str]] = (),
                       ) -> tuple[tuple[str, str], ...]:
        """The loader's settings for a push; `extra` over the loader's own, the user's
        over all. Each name once: in a SETTINGS clause with a name twice, chDB keeps the
        first (`max_block_size=1000, max_block_size=100000` reads blocks of 1,000 rows),
        so a user's `--setting input_format_parallel_parsing=0` was ignored.
        Files too small for two chunks of chDB's parallel parsing (10 MB of text; under
        SERIAL_PARSE_BELOW as stored, so gzip's expanded text too) are parsed on the thread that
        reads them: less loader CPU for many small files."""
        small = all(0 < f.size < SERIAL_PARSE_BELOW for f in job.files)
        merged = dict((*PUSH_SETTINGS, ("session_timezone", self.caps.timezone),
                       ("input_format_parquet_max_block_size",
                        str(parquet_block_rows(job.columns))),
                       *((("input_format_parallel_parsing", "0"),) if small else ()),
                       *extra, *job.settings))
        return tuple(merged.items())

    def _push(self, job: LoadJob, stage: str, select: str | None = None,
              extra: Sequence[tuple[str, str]] = ()) -> int:
        """Fill the stage through the loader's engine: `select` (default: the file's
        rows, cast to the table's types) as one Native stream; `extra` settings for the
        loader's read (before the user's --setting values, which win)."""
        columns, audit = self._push_columns(job)
        names = ", ".join(quote_ident(c.name) for c in columns)
        insert = f"INSERT INTO {DATABASE}.{stage} ({names}) FORMAT Native"
        squash = {"min_insert_block_size_rows": str(self._part_rows(job)),
                  "min_insert_block_size_bytes": str(PART_BYTES), **self.insert_params}
        select = select or select_sql(job.file, job.columns, job.read_columns, audit)
        read = self._send(insert, columns, select, self._push_settings(job, extra),
                          job.file.uri, squash, sum(f.size for f in job.files))
        return read or job.file.size

    def _send(self, insert: str, columns: Sequence[Column], select: str,
              settings: Sequence[tuple[str, str]], context: str,
              squash: dict[str, str] | None = None, size: int = 0) -> int:
        """The loader's engine runs `select` and the server `insert` (FORMAT Native) on
        its rows: through chDB's url() over http, through our own client over https.
        Returns the bytes the engine read from storage, where it says (0 otherwise).
        `size`: the files' bytes, the request's size for the stream controller."""
        with self._streams.data() as sent:
            sent.bytes = size
            if self.url.secure:
                stream_push(self.engine, self.client, insert, select, settings, context,
                            squash)
                return 0
            sql = push_sql(self.url, insert, columns, select, self._push_encoding(),
                           settings, squash)
            errors = partial(push_error, context=context, url=self.url)
            return self.engine.execute(sql, context, errors)[1]

    def _push_encoding(self) -> str:
        """No compression on this machine (CPU is the limit); gzip over a network."""
        if self.url.is_loopback or not self.caps.accepts("gzip"):
            return "none"
        return "gzip"


def _raw_names(job: LoadJob) -> list[str]:
    """The columns a posted file fills, in the file's order: its header's, as a server
    as old as 18.16 reads a header's columns by position (the planner checked they are
    the table's), else the run's."""
    fields = sniff.header_names(job.file) if job.file.format.has_header else None
    return header_columns(fields) if fields else [c.name for c in job.columns]


def _header_fits(job: LoadJob) -> bool:
    """Whether a posted file's header names only columns the run fills: a column it
    names that the table lacks (--on-new-column ignore) is dropped by the loader's
    engine, as a server reading a header by position (18.16) cannot."""
    return not job.file.format.has_header or set(_raw_names(job)) <= {
        c.name for c in job.columns}


_WIDTHS = {"UInt8": 1, "Int8": 1, "Enum8": 1, "UInt16": 2, "Int16": 2, "Enum16": 2, "Date": 2,
           "UInt32": 4, "Int32": 4, "Float32": 4, "DateTime": 4, "Decimal32": 4, "UInt64": 8,
           "Int64": 8, "Float64": 8, "Decimal64": 8, "UUID": 16, "Decimal128": 16}


def _width(typ: str) -> int:
    """Bytes a value takes in memory, roughly (strings and arrays: 64)."""
    nullable = typ.startswith("Nullable(")
    inner = typ[len("Nullable("):-1] if nullable else typ
    family = inner.split("(", 1)[0]
    if family == "Decimal":
        digits = int((inner.split("(", 1)[1].split(",")[0] or "38").strip() or 38)
        size = 4 if digits <= 9 else 8 if digits <= 18 else 16
    elif family == "FixedString":
        size = int(inner[len("FixedString("):-1] or 16)
    else:
        size = _WIDTHS.get(family, 64)
    return size + nullable


def parquet_block_rows(columns: Sequence[Column]) -> int:
    """Rows per block the loader's engine reads from Parquet for a push: ~PARQUET_BLOCK_BYTES
    of the table's rows in memory, within chDB's default (65,409) and 1M rows. By default
    a narrow file's row group of 250,000 rows went to the server as 4 Native blocks, one
    is cheaper for the loader (docs/benchmarks.md). By rows, not by chDB's
    input_format_parquet_prefer_block_bytes: that one counts compressed bytes, so a wide
    row group of well-compressed strings became a single block of 100 MB."""
    width = sum(_width(c.type) for c in columns)
    return max(PARQUET_DEFAULT_ROWS, min(1 << 20, PARQUET_BLOCK_BYTES // max(1, width)))


def is_pipe(f: SourceFile) -> bool:
    """A unit the engine reads from a pipe (Source.fetch streaming it): read once, its
    length unknown until its end."""
    if f.size or not f.local_path:
        return False
    try:
        return stat.S_ISFIFO(os.stat(f.local_path).st_mode)
    except OSError:
        return False


def _counted(chunks: Iterator[bytes], sent: list[int]) -> Iterator[bytes]:
    """`chunks`, their total in `sent[0]`."""
    for chunk in chunks:
        sent[0] += len(chunk)
        yield chunk
