"""A streamed unit's changes made the table's rows by the engine itself, no `psql`.

The stream spools each change as wal2json sent it (format 2: one JSON object a line,
each column's value printed by its type's output function in the replication session,
whose DateStyle and TimeZone replication.py sets to ISO and UTC). For a table whose
every column is of a type whose printed value the engine can turn into the very text
the snapshot's COPY prints (`eligible`: integers, numeric, floats, text, uuid, boolean,
bytea, date, timestamps), the engine reads the spool (JSONEachRow, numbers and booleans
kept as their text), applies the rules of sql.py's `changes_query` (a change's new
values found at their position or by name, an update that moved the key also deleting
the old key, a TRUNCATE or a column left out stopping the follow in one line), and
writes each column's text as COPY would print it (a timestamptz as its UTC wall-clock,
a boolean as 1/0, bytea as \\x hex) to a TSV that the same engine conversion as
psql's output (follow.py `typed_native`) turns into the Native spool: a value is the
same, copied or streamed, read by psql or by the engine. Any other type, a server
encoding other than UTF8, or CHLOAD_PG_CONVERT=psql: the unit goes through psql
(streamed.py).
"""

from __future__ import annotations

import os
import re

from chload.errors import ChloadError, SchemaError, SourceError, TransientError
from chload.schema import quote_str
from chload.sources.changes.postgres.follow import Follow, remove, typed_native
from chload.sources.changes.postgres.sql import STOP

CONVERT = "CHLOAD_PG_CONVERT"  # =psql: every unit converted through psql, as before
_PLAIN = {"smallint", "integer", "bigint", "numeric", "real", "double precision", "text",
          "character varying", "character", "name", "uuid", "date",
          "timestamp without time zone"}
_SPECIAL = {"timestamp with time zone", "boolean", "bytea"}
# a key's printed text is equal exactly where its values are (not numeric: 1.0 and 1.00)
_KEYS = _PLAIN - {"numeric", "real", "double precision"} | {"timestamp with time zone",
                                                            "boolean"}
_SPOOL = ("action String, lsn String, columns Array(Tuple(name String, value Nullable(String)"
          ")), identity Array(Tuple(name String, value Nullable(String)))")
_SETTINGS = ("input_format_json_read_numbers_as_strings = 1, "
             "input_format_json_read_bools_as_strings = 1, "
             "input_format_skip_unknown_fields = 1, input_format_allow_errors_num = 0, "
             "short_circuit_function_evaluation = 'disable'")  # (every STOP check made)


def base_type(pg_type: str) -> str:
    return re.sub(r"\(.*?\)", "", pg_type).strip()


def eligible(follow: Follow, encoding: str, session_set: bool) -> bool:
    """Whether the engine can make this table's rows from the spool (the module's
    docstring)."""
    if os.environ.get(CONVERT) == "psql" or not session_set or encoding.upper() != "UTF8":
        return False
    types = {c.name: base_type(c.pg_type) for c in follow.described.columns}
    return (all(t in _PLAIN | _SPECIAL for t in types.values())
            and all(types.get(k) in _KEYS for k in follow.key))


def convert(follow: Follow, spool: str, native: str) -> bool:
    """The spooled changes at `spool` as the table's rows, in the Native spool `native`;
    whether it holds any."""
    tsv = f"{native}.tsv"
    try:
        try:
            follow.target.infer_rows(rows_sql(follow, spool, tsv))
        except ChloadError as exc:
            line = _stopped(str(exc))
            if line:
                raise SchemaError(line) from None
            if isinstance(exc, TransientError):
                raise
            said = str(exc).strip().splitlines()
            raise SourceError(f"{follow.url.display}: the engine could not make the streamed "
                              f"changes' rows ({said[0] if said else type(exc).__name__}); "
                              f"nothing was applied: run again with {CONVERT}=psql to make "
                              "them through psql") from exc
        if not os.path.exists(tsv) or os.path.getsize(tsv) == 0:
            return False  # (the engine writes nothing for no rows)
        typed_native(follow, tsv, native)
    finally:
        remove(tsv)
    return os.path.exists(native) and os.path.getsize(native) > 0


def rows_sql(follow: Follow, spool: str, tsv: str) -> str:
    """The engine's INSERT of the rows as COPY's text (sql.py `changes_query`, the same
    rules over the same JSON)."""
    columns = follow.described.columns
    display = follow.url.display
    names = [c.name for c in columns]

    def new(i: int, name: str) -> str:  # at its position, else by name, else identity's
        n = quote_str(name)
        return (f"if(columns[{i + 1}].name = {n}, columns[{i + 1}].value, if(has(columns.name"
                f", {n}), columns[indexOf(columns.name, {n})].value, "
                f"identity[indexOf(identity.name, {n})].value))")

    def old(name: str) -> str:
        return f"identity[indexOf(identity.name, {quote_str(name)})].value"

    def present(name: str) -> str:
        n = quote_str(name)
        return f"(has(columns.name, {n}) OR has(identity.name, {n}))"

    def moved(name: str) -> str:  # as jsonb's IS DISTINCT FROM: absent, null, a value
        n = quote_str(name)
        was, now = f"has(identity.name, {n})", present(name)
        return (f"({was} != {now} OR ({was} AND NOT (isNull({old(name)}) AND isNull("
                f"{new(names.index(name), name)}) OR ifNull({old(name)} = "
                f"{new(names.index(name), name)}, 0))))")

    def shown(pg_type: str, value: str) -> str:  # as the snapshot's COPY prints it
        kind = base_type(pg_type)
        if kind == "timestamp with time zone":  # (the session's zone: UTC, +00)
            return f"replaceRegexpOne({value}, '\\\\+00( BC)?$', '\\\\1')"
        if kind == "boolean":
            return f"multiIf({value} = 'true', '1', {value} = 'false', '0', {value})"
        if kind == "bytea":  # (wal2json prints it as bare hex)
            return f"concat('\\\\x', {value})"
        return value

    truncated = _throw("a = 'T'",
                       f"{display} was truncated at the source; the follow stopped: "
                       "truncate the ClickHouse table too, then drop the follow "
                       "(chload sources --drop) and load again")
    every = " AND ".join(present(n) for n in names)
    toast = _throw(f"a = 'U' AND length(columns) != {len(names)} AND NOT ({every})",
                   f"{display}: an update left a column out (an unchanged TOASTed value, or "
                   "a column added since the change); run ALTER TABLE ... REPLICA IDENTITY "
                   "FULL at the source, drop the follow (chload sources --drop) and follow "
                   "again")
    keys = " OR ".join(moved(k) for k in follow.key)
    texts = ", ".join(f"{shown(c.pg_type, f'if(d = 0, {new(i, c.name)}, {old(c.name)})')}"
                      for i, c in enumerate(columns))
    out = ", ".join(f"c{i} Nullable(String)" for i in range(len(columns)))
    version = ("reinterpretAsUInt64(reverse(unhex(leftPad(splitByChar('/', lsn)[1], 8, '0') "
               "|| leftPad(splitByChar('/', lsn)[2], 8, '0'))))")
    return (f"INSERT INTO FUNCTION file({quote_str(tsv)}, 'TSV', "
            f"{quote_str(out + ', v UInt64, d UInt8')}) "
            f"SELECT {texts}, v, d FROM (SELECT action AS a, {version} AS v, columns, "
            f"identity FROM file({quote_str(spool)}, 'JSONEachRow', {quote_str(_SPOOL)})) "
            f"ARRAY JOIN [0, 1] AS d WHERE if(d = 0, a = 'I' OR (a = 'U' AND (length(columns) "
            f"= {len(names)} OR ({every}) OR {toast})), a = 'D' OR (a = 'U' AND ({keys})) OR "
            f"{truncated}) SETTINGS {_SETTINGS}")


def _throw(condition: str, why: str) -> str:
    """False, or the query failed with `why` (a STOP line) where `condition` holds: the
    last term of an OR, so evaluated on every row the others leave out (the engine may
    skip an AND's terms after one that is false, in an order of its own), over a row's
    values (a constant would fail the query as it is planned)."""
    return f"throwIf({condition}, {quote_str(STOP + ' ' + why + '|')}) != 0"


def _stopped(error: str) -> str | None:
    at = error.find(STOP)
    if at < 0:
        return None
    return error[at + len(STOP):].split("|")[0].strip()
