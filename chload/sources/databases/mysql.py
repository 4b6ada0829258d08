"""MySQL and MariaDB tables and queries, read range by range in one snapshot.

A session opens `workers` readers, each in a REPEATABLE READ transaction started `WITH
CONSISTENT SNAPSHOT`, all taken while the table cannot change (`FLUSH TABLES WITH READ
LOCK` with RELOAD, else `LOCK TABLES <table> READ`), released once every reader has its
snapshot: every reader sees the same rows. A reader is the C reader (mysql_native.py),
else a `mariadb`/`mysql` client process whose output a thread relays up to a marker row.
docs/sources-databases.md says how a table is read and why the C reader.

Invariants: no row passes through Python either way; the password (URL,
$MYSQL_PWD or ~/.my.cnf) goes to libmariadb in this process or to the client by its
environment, never a command line.
"""

from __future__ import annotations

import configparser
import copy
import os
import queue
import threading
from collections.abc import Sequence
from typing import Any

from chload.core.reading import ranges as db_range
from chload.errors import ChloadError, SourceError, TransientError, UsageError
from chload.sources.base import SourceContext
from chload.sources.databases.base import DatabaseSource, workers_of
from chload.sources.databases.mysql_client import ClientReader, client
from chload.sources.databases.mysql_columns import (
    INTEGERS,
    TIME_AXIS,
    base_of,
    column_of,
    ident,
    kept,
    range_guard,
    zero_flags,
)
from chload.sources.databases.mysql_native import (
    OUT_OF_RANGE,
    ZERO_DATE,
    Connection,
    NativeError,
    NativeReader,
    checks_of,
    load as load_native,
)
from chload.sources.databases.session import Range, range_predicate, stream_read
from chload.sources.databases.table import (
    NO_CHECKS,
    DbUrl,
    RangeChecks,
    TableInfo,
)
from chload.sources.pipes import Reading

_TRANSIENT_CODES = {2002, 2003, 2006, 2013, 1040, 1205}
_DENIED = (1227, 1044, 1142)  # access denied (to RELOAD, to the database, to the table)
_SETUP = ("SET SESSION sql_mode = ''", "SET SESSION time_zone = '+00:00'",
          "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
          "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")


class MysqlSession:
    """One snapshot of one MySQL/MariaDB table (or query), read range by range."""

    range_checks = NO_CHECKS  # set once the target's types are known (core/reading/ranges.py)
    bounds_in_snapshot = True  # False where no lock could be taken (_take_snapshot)

    def __init__(self, url: DbUrl, query: str | None, incremental_by: str | None,
                 workers: int, schema: str | None = None) -> None:
        self.url, self.query, self.schema = url, query, schema
        self.zero = ""  # per column, what a zero date does (zero_flags)
        self._zeros: dict[str, dict[int, str]] = {}  # zero_dates found by `outside`
        self.native, self.why_not_native = load_native()
        self.client = "" if self.native else client()
        self.password = _password(url)
        self.conn = self._connect()
        self._readers: queue.Queue[ClientReader | NativeReader] = queue.Queue()
        self._alive = 0
        self._guard = threading.Lock()
        try:
            self.info = self._describe(incremental_by)
            self.snapshot, self._bounds = self._take_snapshot(max(1, workers))
        except BaseException:
            self.close()
            raise

    # -- connecting ------------------------------------------------------------------
    def _connect(self) -> Any:
        """The controlling connection: libmariadb's where the native reader built (no
        pymysql import, a noticeable part of the start), else pymysql's."""
        if self.native is not None:
            try:
                return Connection(self.native, self.url.host, self.url.port, self.url.user,
                                  self.password, self.url.database)
            except NativeError as exc:
                raise _error(self.url, exc, self.password) from None
        pymysql = _pymysql()
        try:
            return pymysql.connect(host=self.url.host, port=self.url.port,
                                   user=self.url.user or None, password=self.password or "",
                                   database=self.url.database, connect_timeout=10,
                                   charset="utf8mb4", autocommit=True)
        except pymysql.Error as exc:
            raise _error(self.url, exc, self.password) from None

    def _all(self, sql: str, params: tuple[str, ...] = ()) -> list[tuple]:
        """The rows of `sql`, its `%s` replaced by `params` as string literals."""
        found = self._ask(sql % tuple(_string(p) for p in params) if params else sql)
        assert found is not None
        return found

    def _ask(self, sql: str, denied_ok: bool = False) -> list[tuple] | None:
        """The rows of `sql`; None if `denied_ok` and the user may not run it."""
        native = isinstance(self.conn, Connection)
        errors = NativeError if native else _pymysql().Error
        try:
            if native:
                return list(self.conn.rows(sql))
            with self.conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        except errors as exc:
            if denied_ok and exc.args and exc.args[0] in _DENIED:
                return None
            raise _error(self.url, exc, self.password) from None

    # -- the table -------------------------------------------------------------------
    def _describe(self, incremental_by: str | None) -> TableInfo:
        relation = self._relation()
        if self.query:
            self._all(f"CREATE TEMPORARY TABLE chload_query AS SELECT * FROM ({self.query}) "
                      "AS q LIMIT 0")
            relation = "chload_query"
        elif not self._all("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                           "AND BINARY TABLE_NAME = %s", (self.url.schema, self.url.table)):
            raise SourceError(f"{self.url.display}: no such table (or no right to see it)"
                              f"{self._alike()}")
        rows = self._all(f"SHOW COLUMNS FROM {relation}")
        keys = self._all(f"SHOW KEYS FROM {relation} WHERE Key_name = 'PRIMARY'")
        if self.query:
            self._all("DROP TEMPORARY TABLE chload_query")
        columns = [column_of(str(r[0]), str(r[1]).lower(),
                           r[2] == "YES" or bool(self.query)) for r in rows]
        types = {str(r[0]): str(r[1]).lower() for r in rows}
        key = [str(k[4]) for k in sorted(keys, key=lambda k: int(k[3]))]
        axis = incremental_by or (key[0] if len(key) == 1 and base_of(types[key[0]])
                                  in INTEGERS else "")
        if axis and axis not in types:
            raise UsageError(f"--incremental-by {axis}: {self.url.display} has no such "
                             f"column; it has {', '.join(types)}")
        integer = not axis or base_of(types[axis]) in INTEGERS
        if incremental_by and not integer and base_of(types[axis]) not in TIME_AXIS:
            raise UsageError(f"--incremental-by {axis}: its type is {types[axis]}; use an "
                             "integer, date or datetime column that only grows")
        columns, self.zero = zero_flags(columns, types, self.schema)
        return TableInfo(columns, key, axis, integer)

    def _alike(self) -> str:
        """A table of that name spelt in another case (table names are case-sensitive on
        Linux), as '; did you mean ...'."""
        found = self._all("SELECT TABLE_NAME FROM information_schema.TABLES WHERE "
                          "TABLE_SCHEMA = %s AND LOWER(TABLE_NAME) = LOWER(%s) LIMIT 3",
                          (self.url.schema, self.url.table))
        base = self.url.display.rsplit("/", 1)[0]
        names = [f"{base}/{row[0]}" for row in found]
        return f"; did you mean {' or '.join(names)}?" if names else ""

    def _relation(self) -> str:
        return f"{ident(self.url.schema)}.{ident(self.url.table)}"

    def _from(self) -> str:
        return f"({self.query}) AS chload_query" if self.query else self._relation()

    # -- the snapshot ------------------------------------------------------------------
    def _take_snapshot(self, workers: int) -> tuple[str, tuple[str | None, str | None, int]]:
        """Start every reader's snapshot while the table cannot change; read the axis's
        bounds meanwhile (they are the snapshot's)."""
        rows = 0
        if not self.query:
            found = self._all("SELECT TABLE_ROWS FROM information_schema.TABLES WHERE "
                              "TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                              (self.url.schema, self.url.table))
            rows = int(found[0][0] or 0) if found else 0
        self._all("SET SESSION lock_wait_timeout = 60")
        locked = self._lock()
        try:
            for _ in range(workers):
                self._readers.put(self._start_reader())
                self._alive += 1
            low = high = None
            if self.info.axis:
                col = ident(self.info.axis)
                shown = col if self.info.axis_integer else _fixed_time(col)
                low, high = self._all(f"SELECT CAST(min({shown}) AS CHAR), "
                                      f"CAST(max({shown}) AS CHAR) FROM {self._from()}")[0]
            snapshot = self._all("SELECT CAST(NOW(6) AS CHAR)")[0][0]
        finally:
            if locked:
                self._all("UNLOCK TABLES")
        how = locked.split(" ")[0] if locked else "no lock"
        self.bounds_in_snapshot = bool(locked)  # else read after the readers' snapshots
        return f"{snapshot} under {how}", (low, high, rows)

    def _lock(self) -> str:
        """FLUSH TABLES WITH READ LOCK, else LOCK TABLES t READ; '' if neither may be."""
        statements = ["FLUSH TABLES WITH READ LOCK"]
        if not self.query:
            statements.append(f"LOCK TABLES {self._relation()} READ")
        for statement in statements:
            if self._ask(statement, denied_ok=True) is not None:
                return statement
        return ""

    def _start_reader(self) -> ClientReader | NativeReader:
        """A reader in a new snapshot: native (libmariadb, mysql_native.py) where it
        builds, else a client process."""
        fail = self._failed
        if self.native is None:
            return ClientReader.start(self.client, self.url, self.password, _SETUP, fail)
        return NativeReader.start(self.native, self.url, self.password, _SETUP, fail)

    def _failed(self, exc: object) -> ChloadError:
        """A reader's error as one line; a zero date (mysql_copy.c) names its column,
        and the --schema that loads it."""
        args = exc.args if isinstance(exc, NativeError) else ()
        if not args or args[0] not in (OUT_OF_RANGE, ZERO_DATE):
            return _error(self.url, exc, self.password)
        index, _, value = str(args[1]).partition("\t")
        if args[0] == OUT_OF_RANGE:
            return self.range_checks.refusal(int(index), value)
        return RangeChecks(self.url, self.info.columns, {}).refusals({}, {int(index): value})

    @property
    def zero_checked(self) -> bool:
        return "1" in self.zero

    def apart(self) -> MysqlSession:
        """Session.apart: another controlling connection (the control's is not in the
        readers' snapshot either), with no reader of its own to stop."""
        twin = copy.copy(self)
        twin.conn, twin._zeros, twin._readers = self._connect(), {}, queue.Queue()
        return twin

    def zero_dates(self, where: str) -> dict[int, str]:
        """Session.zero_dates (asked with `outside`'s query, where that ran)."""
        found = self._zeros.pop(where, None)
        return self._zeros_in(self._first([], where)) if found is None else found

    def _zeros_in(self, values: list[str | None]) -> dict[int, str]:
        failing = (i for i, flag in enumerate(self.zero) if flag == "1")
        return {i: v for i, v in zip(failing, values, strict=True) if v is not None}

    def _first(self, mins: list[str], where: str) -> list[str | None]:
        """`mins`, then each zero-checked column's least zero date, in `where`'s rows."""
        mins = mins + [f"MIN(IF(MONTH({c}) = 0 OR DAYOFMONTH({c}) = 0, {c}, NULL))" for c in (
            ident(self.info.columns[i].name) for i, f in enumerate(self.zero) if f == "1")]
        if not mins:
            return []
        row = self._all(f"SELECT {', '.join(f'CAST({m} AS CHAR)' for m in mins)} FROM "
                        f"{self._from()} WHERE {where}")[0]
        return [None if v is None else v.decode() if isinstance(v, bytes) else str(v)
                for v in row]

    def bounds(self, axis: str) -> tuple[str | None, str | None, int]:
        return self._bounds

    def read_in_key_order(self) -> None:
        """Nothing to do: InnoDB reads a table in primary key order already."""

    def predicate(self, axis: str, r: Range) -> str:
        return range_predicate(ident(axis), r,
                               lambda value: _literal(value, self.info.axis_integer))

    def outside(self, guards: Sequence[db_range.Guard], where: str) -> list[str | None]:
        """Session.outside: the least value of each column outside its guard's range
        (zero dates are the zero checks': found by the same query, for `zero_dates`)."""
        if not guards:
            return []
        cols = self.info.columns
        values = self._first([f"MIN(IF({kept(cols[g.index], g)}, NULL, "
                              f"{ident(cols[g.index].name)}))" for g in guards], where)
        self._zeros[where] = self._zeros_in(values[len(guards):])
        return values[:len(guards)]

    # -- reading -----------------------------------------------------------------------
    def read(self, where: str, out: int) -> _Relay:
        """One reader (in the snapshot) writes the rows of `where` into `out` (owned),
        by a thread: the native reader's C call, or a relay of the client's output (the
        marker that ends them is found in 1 MiB chunks)."""
        try:
            reader = self._take()
        except BaseException:
            os.close(out)
            raise
        guards = self.range_checks.guards
        if isinstance(reader, NativeReader):  # it escapes: the plain columns
            line = ", ".join(c.plain or ident(c.name) for c in self.info.columns)
        else:  # the server escapes; the client puts the tabs
            line = ", ".join(range_guard(c, guards[i]) if i in guards else c.select
                             for i, c in enumerate(self.info.columns))
        return _Relay(self, reader, f"SELECT {line} FROM {self._from()} WHERE {where}", out,
                      checks_of(self.zero, guards, len(self.info.columns)))

    def stream(self, where: str) -> tuple[int, Reading]:
        return stream_read(self, where)

    def _done(self, reader: ClientReader | NativeReader, ok: bool) -> None:
        """A reader back to the pool after a range, or stopped if it failed (its
        output is then at an unknown point)."""
        if ok:
            self._readers.put(reader)
            return
        with self._guard:
            self._alive -= 1
        reader.stop(kill=True)

    def _take(self) -> ClientReader | NativeReader:
        while True:
            with self._guard:
                if self._alive <= 0:
                    raise SourceError(f"{self.url.display}: every snapshot reader failed; "
                                      "run the same command again (it loads only what is "
                                      "missing)")
            try:
                return self._readers.get(timeout=0.5)
            except queue.Empty:
                continue

    def close(self) -> None:
        while True:
            try:
                self._readers.get_nowait().stop()
            except queue.Empty:
                break
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 (a connection already gone)
            pass


class _Relay:
    """One range relayed by a thread from a snapshot reader into `out`
    (database.Reading): the reader goes back to the pool once the range ends."""

    def __init__(self, session: MysqlSession, reader: ClientReader | NativeReader, statement: str,
                 out: int, checks: str = "") -> None:
        self.session, self.reader = session, reader
        self.error: BaseException | None = None
        self.killed = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._relay, args=(statement, out, checks),
                                       name="chload_mysql_relay", daemon=True)
        self.thread.start()

    def _relay(self, statement: str, out: int, checks: str) -> None:
        ok = False
        try:
            self.reader.run(statement, out, checks)
            ok = True
        except BaseException as exc:  # noqa: BLE001 (given to finish(), in the load's thread)
            self.error = exc
        finally:
            os.close(out)
            with self.lock:
                self.killed = self.killed or not ok  # stop() kills no reader after this
            self.session._done(self.reader, not self.killed)

    def finish(self) -> None:
        self.thread.join()
        if isinstance(self.error, ChloadError):
            raise self.error
        if self.error is not None:  # e.g. the engine closed the pipe (EPIPE)
            raise SourceError(f"{self.session.url.display}: a range was not read whole "
                              f"({type(self.error).__name__})")

    def stop(self) -> None:
        with self.lock:
            if not self.killed and self.thread.is_alive():
                self.killed = True  # the relay fails, and the reader is not pooled again
                self.reader.abort()
        self.thread.join()


def _fixed_time(col: str) -> str:
    return f"DATE_FORMAT({col}, '%Y-%m-%d %H:%i:%s.%f')"


def _literal(value: str, integer: bool) -> str:
    if integer:
        return str(int(value))
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _string(value: str) -> str:
    """A string literal whatever the server's sql_mode (NO_BACKSLASH_ESCAPES or not)."""
    return f"CONVERT(X'{value.encode().hex()}' USING utf8mb4)"


def _password(url: DbUrl) -> str | None:
    """The URL's, else $MYSQL_PWD, else ~/.my.cnf's [client] password."""
    if url.password is not None:
        return url.password
    if "MYSQL_PWD" in os.environ:
        return os.environ["MYSQL_PWD"]
    parser = configparser.ConfigParser(allow_no_value=True, strict=False)
    try:
        parser.read(os.path.expanduser("~/.my.cnf"))
    except configparser.Error:
        return None
    value = parser.get("client", "password", fallback=None)
    return value.strip("'\"") if value else None


def _pymysql() -> Any:
    try:
        import pymysql
    except ImportError:
        raise UsageError("reading MySQL/MariaDB needs pymysql: pip install 'chload[mysql]'"
                         ) from None
    return pymysql


def _error(url: DbUrl, exc: object, password: str | None) -> ChloadError:
    """A pymysql or client error as one line naming the source (never the password)."""
    args = exc.args if isinstance(exc, Exception) else ()
    code = args[0] if args and isinstance(args[0], int) else 0
    text = str(args[1]) if code and len(args) > 1 else str(exc)
    text = (text.strip().splitlines() or [type(exc).__name__])[0]
    if password:
        text = text.replace(password, "***")
    if "(using password: NO)" in text:
        text += "; give it by $MYSQL_PWD, ~/.my.cnf ([client] password) or the URL"
    transient = code in _TRANSIENT_CODES or "Can't connect" in text or "Lost connection" in text
    return (TransientError if transient else SourceError)(f"{url.with_user}: {text}")


class MysqlSource(DatabaseSource):
    """`mysql://` and `mariadb://` sources (base.py says how they load): one snapshot
    reader per worker."""

    kind = "mysql"
    schemes: tuple[str, ...] = ("mysql", "mariadb")
    # --follow and its batches: change capture (sources/changes/mysql.py)
    options: tuple[str, ...] = ("query", "incremental_by", "follow", "cluster", "batch_rows",
                                "batch_seconds")

    def _session(self, url: DbUrl, context: SourceContext) -> MysqlSession:
        return MysqlSession(url, context.select, context.incremental_by, workers_of(context),
                            context.schema)


SOURCE = MysqlSource()
