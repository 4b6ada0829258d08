"""The SQL that turns a slot's changes into the rows of the followed table, in PostgreSQL.

The slot's plugin is wal2json (format 2: one JSON object per change, its columns as
name/type/value). One `COPY (...) TO STDOUT` reads the changes of a unit with
`pg_logical_slot_peek_changes` (nothing consumed: the slot moves only after the commit,
`pg_replication_slot_advance`), makes each change's values the column's own type again
(`(value)::type`: the type's input function, so a value is what the column held), and
prints them with the same expressions the snapshot's COPY uses (databases/postgres.py
`DbColumn.select`): a row copied and a row changed are the same text, and the engine
converts both the same way. No row passes through Python.

A change becomes one row: an insert or update its new values at `_version` = the
change's LSN, a delete its key at `_is_deleted` = 1; an update that changed the key
also deletes the old key. A TRUNCATE, or an update whose row lacks a column (an unchanged
TOASTed value, which wal2json leaves out unless REPLICA IDENTITY FULL gives it), fails
the COPY with a line starting STOP (`stopped`), and the follow stops, nothing consumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

STOP = "chload-stop:"
PLUGIN = "wal2json"


@dataclass(frozen=True, slots=True)
class SourceColumn:
    name: str
    pg_type: str  # format_type(): integer, numeric(12,2), integer[], ...
    select: str  # how the snapshot's COPY prints it (over "name")


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def text(value: str) -> str:
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def options(schema: str, table: str) -> str:
    """wal2json's options: format 2, this table only (its name's special characters
    escaped by a backslash, as wal2json reads them), each change's LSN."""
    def bare(name: str) -> str:
        return "".join("\\" + ch if ch in " ',.*\\" else ch for ch in name)
    pairs = [("format-version", "2"), ("include-lsn", "1"), ("include-transaction", "0"),
             ("add-tables", f"{bare(schema)}.{bare(table)}")]
    return ", ".join(f"{text(k)}, {text(v)}" for k, v in pairs)


def _value(column: SourceColumn, row: str) -> str:
    """The column's value in the change's JSON object `row`, in its own type."""
    got = f"({row} ->> {text(column.name)})"
    base = column.pg_type.split("(")[0].strip()
    if base == "bytea":  # wal2json prints bytea as bare hex
        return f"decode({got}, 'hex')"
    return f"{got}::{column.pg_type}"


def _object(field: str) -> str:
    """A change's name/value list (`columns` or `identity`) as one JSON object."""
    return (f"(SELECT jsonb_object_agg(x ->> 'name', x -> 'value') FROM "
            f"jsonb_array_elements(j -> '{field}') x)")


def _stop(why: str) -> str:
    """An expression that fails the COPY with `why` (an int's input error quotes it),
    evaluated per row (over the action `a`: a constant would fail at planning)."""
    return f"({text(STOP + ' ' + why)} || left(a, 0))::int"


def changes_query(slot: str, upto: str, relation: tuple[str, str], display: str,
                  columns: Sequence[SourceColumn], key: Sequence[str]) -> str:
    """The COPY of the changes of `slot` committed before `upto` (an LSN), as the
    followed table's rows: the snapshot's columns, `_version`, `_is_deleted`."""
    names = [c.name for c in columns]
    new, old = _object("columns"), _object("identity")
    key_new = "jsonb_build_object(" + ", ".join(f"{text(k)}, o -> {text(k)}" for k in key) + ")"
    key_old = "jsonb_build_object(" + ", ".join(f"{text(k)}, i -> {text(k)}" for k in key) + ")"
    every = "ARRAY[" + ", ".join(text(n) for n in names) + "]::text[]"
    truncated = _stop(f"{display} was truncated at the source; the follow stopped: "
                      "truncate the ClickHouse table too, then drop the follow "
                      "(chload sources --drop) and load again")
    toast = _stop(f"{display}: an update left a column out (an unchanged TOASTed value); "
                  "run ALTER TABLE ... REPLICA IDENTITY FULL at the source, then follow again")
    changes = (
        f"SELECT (c.lsn - '0/0'::pg_lsn)::numeric(20, 0) AS v, c.data::jsonb AS j "
        f"FROM pg_logical_slot_peek_changes({text(slot)}, {text(upto)}::pg_lsn, NULL, "
        f"{options(*relation)}) c")
    shaped = (
        f"SELECT v, j ->> 'action' AS a, coalesce({old}, '{{}}'::jsonb) AS i, "
        f"coalesce({old}, '{{}}'::jsonb) || coalesce({new}, '{{}}'::jsonb) AS o "
        f"FROM ({changes}) c WHERE j ->> 'action' IN ('I', 'U', 'D', 'T')")
    # one decoding: the CTE is read three times, materialized once
    rows = (
        f"SELECT v, 0 AS d, o FROM s WHERE a IN ('I', 'U') AND "
        f"(a = 'I' OR o ?& {every} OR {toast} IS NULL) "
        f"UNION ALL SELECT v, 1, i FROM s WHERE a = 'D' OR (a = 'U' AND "
        f"{key_old} IS DISTINCT FROM {key_new}) "
        f"UNION ALL SELECT v, 1, '{{}}'::jsonb FROM s WHERE a = 'T' AND "
        f"{truncated} IS NULL")
    typed = ", ".join(f"{_value(c, 'r.o')} AS {ident(c.name)}" for c in columns)
    selects = ", ".join(c.select for c in columns)
    return (f"COPY (WITH s AS MATERIALIZED ({shaped}) SELECT {selects}, _version, "
            f"_is_deleted FROM (SELECT {typed}, r.v AS _version, r.d AS _is_deleted FROM "
            f"({rows}) r) AS chload_changes) TO STDOUT")


def stopped(error: str) -> str | None:
    """The line a STOP expression raised, if the error is one."""
    at = error.find(STOP)
    if at < 0:
        return None
    return error[at + len(STOP):].split('"')[0].strip()
