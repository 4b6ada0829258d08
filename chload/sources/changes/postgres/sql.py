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


def option_pairs(schema: str, table: str, transactions: bool = False) -> list[tuple[str, str]]:
    """wal2json's options: format 2, this table only (its name's special characters
    escaped by a backslash, as wal2json reads them), each change's LSN, no type names
    (less to parse); `transactions`: each transaction's begin and commit rows too."""
    def bare(name: str) -> str:
        return "".join("\\" + ch if ch in " ',.*\\" else ch for ch in name)
    return [("format-version", "2"), ("include-lsn", "1"),
            ("include-transaction", "1" if transactions else "0"), ("include-types", "0"),
            ("add-tables", f"{bare(schema)}.{bare(table)}")]


def options(schema: str, table: str, transactions: bool = False) -> str:
    """`option_pairs` as the arguments of pg_logical_slot_peek_changes."""
    return ", ".join(f"{text(k)}, {text(v)}" for k, v in option_pairs(schema, table,
                                                                        transactions))


def _cast(column: SourceColumn, raw: str) -> str:
    """A value (a jsonb scalar) as the column's own type."""
    got = f"({raw} #>> '{{}}')"
    base = column.pg_type.split("(")[0].strip()
    if base == "bytea":  # wal2json prints bytea as bare hex
        return f"decode({got}, 'hex')"
    return f"{got}::{column.pg_type}"


def _found(field: str, name: str) -> str:
    """The value of column `name` in a change's `columns` or `identity` list, searched
    by name (jsonb_path, in C); NULL if absent."""
    return (f"jsonb_path_query_first(j, '$.{field}[*] ? (@.name == $n).value', "
            f"jsonb_build_object('n', {text(name)}))")


def _new(position: int, name: str) -> str:
    """A column's new value: at its position in `columns` when the name there is its
    (every change of a table whose columns have not changed: no search), else searched
    by name in `columns`, then `identity` (REPLICA IDENTITY FULL: an unchanged TOASTed
    value is there)."""
    at = f"cols -> {position}"
    return (f"CASE WHEN {at} ->> 'name' = {text(name)} THEN {at} -> 'value' ELSE "
            f"coalesce({_found('columns', name)}, {_found('identity', name)}) END")


def _old(position: int, name: str) -> str:
    """A key column's old value: at its position in `identity` when the name there is
    its, else searched by name."""
    at = f"j -> 'identity' -> {position}"
    return (f"CASE WHEN {at} ->> 'name' = {text(name)} THEN {at} -> 'value' ELSE "
            f"{_found('identity', name)} END")


def _stop(why: str) -> str:
    """An expression that fails the COPY with `why` (an int's input error quotes it),
    evaluated per row (over the action `a`: a constant would fail at planning)."""
    return f"({text(STOP + ' ' + why)} || left(a, 0))::int"


def _peeked(slot: str, upto: str, relation: tuple[str, str], skip: str | None) -> str:
    """The slot's changes before `upto` as rows (lsn, data); with `skip` (an LSN past the
    slot's confirmed position: a unit read but not yet committed), those of transactions
    whose commit record starts before it are left out, as the slot leaves them out once
    confirmed there (each commit row, in commit order, says where its record starts)."""
    peek = f"pg_logical_slot_peek_changes({text(slot)}, {text(upto)}::pg_lsn, NULL, "
    if skip is None:
        return f"SELECT lsn, data FROM {peek}{options(*relation)})"
    begin, commit = """'{"action":"B"'""", """'{"action":"C"'"""
    return (f"SELECT lsn, data FROM (SELECT p.lsn, p.data, p.o, left(p.data, 13) AS t, max("
            f"CASE WHEN left(p.data, 13) = {commit} AND (p.data::jsonb ->> 'lsn')::pg_lsn < "
            f"{text(skip)}::pg_lsn THEN p.o END) OVER () AS skipped FROM {peek}"
            f"{options(*relation, True)}) WITH ORDINALITY p(lsn, xid, data, o)) p "
            f"WHERE p.o > coalesce(p.skipped, 0) AND p.t NOT IN ({begin}, {commit})")


def changes_query(slot: str, upto: str, relation: tuple[str, str], display: str,
                  columns: Sequence[SourceColumn], key: Sequence[str],
                  skip: str | None = None, spooled: str | None = None) -> str:
    """The COPY of the changes of `slot` committed before `upto` (an LSN), as the
    followed table's rows: the snapshot's columns, `_version`, `_is_deleted`. Each
    change is decoded once and gives one row (`d` 0: its new values) or two (`d` 1: the
    old key deleted, where an update changed it). `skip`: see `_peeked`. `spooled`: a
    table of the changes' JSON (column `data`) to read instead of the slot."""
    index = {c.name: i for i, c in enumerate(columns)}
    truncated = _stop(f"{display} was truncated at the source; the follow stopped: "
                      "truncate the ClickHouse table too, then drop the follow "
                      "(chload sources --drop) and load again")
    toast = _stop(f"{display}: an update left a column out (an unchanged TOASTed value, or a "
                  "column added since the change); run ALTER TABLE ... REPLICA IDENTITY FULL "
                  "at the source, drop the follow (chload sources --drop) and follow again")
    every = " AND ".join(f"({_new(i, c.name)}) IS NOT NULL" for i, c in enumerate(columns))
    ranked = sorted(key, key=lambda k: index[k])  # identity lists the key in table order
    moved = " OR ".join(f"({_old(ranked.index(k), k)}) IS DISTINCT FROM ({_new(index[k], k)})"
                        for k in key)
    # OFFSET 0: a fence, so each change's text is parsed once (inlined, `j` was parsed
    # again at every use)
    if spooled is None:
        each = (f"SELECT (c.lsn - '0/0'::pg_lsn)::numeric(20, 0) AS v, c.data::jsonb AS j "
                f"FROM ({_peeked(slot, upto, relation, skip)}) c OFFSET 0")
    else:  # the changes a replication connection streamed (each carries its LSN)
        each = (f"SELECT ((j ->> 'lsn')::pg_lsn - '0/0'::pg_lsn)::numeric(20, 0) AS v, j "
                f"FROM (SELECT data::jsonb AS j FROM {spooled} OFFSET 0) c")
    changes = (f"SELECT v, j, j ->> 'action' AS a, j -> 'columns' AS cols FROM ({each}) c "
               "OFFSET 0")
    keep = (f"CASE WHEN d = 0 THEN a = 'I' OR (a = 'U' AND (jsonb_array_length(cols) = "
            f"{len(columns)} OR ({every}) OR {toast} IS NULL)) "
            f"ELSE a = 'D' OR (a = 'U' AND ({moved})) OR (a = 'T' AND {truncated} IS NULL) END")
    typed = ", ".join(
        f"CASE WHEN d = 0 THEN {_cast(c, _new(i, c.name))} ELSE "
        f"{_cast(c, _found('identity', c.name))} END AS {ident(c.name)}"
        for i, c in enumerate(columns))
    selects = ", ".join(c.select for c in columns)
    return (f"COPY (SELECT {selects}, _version, _is_deleted FROM (SELECT {typed}, v AS "
            f"_version, d AS _is_deleted FROM ({changes}) c CROSS JOIN (VALUES (0), (1)) k(d) "
            f"WHERE {keep}) AS "
            "chload_changes) TO STDOUT")


def stopped(error: str) -> str | None:
    """The line a STOP expression raised, if the error is one."""
    at = error.find(STOP)
    if at < 0:
        return None
    return error[at + len(STOP):].split('"')[0].strip()
