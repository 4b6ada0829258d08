"""Hand-written engine SQL: what an engineer who knows ClickHouse writes instead of a
loader (the methods chload is measured against; run as their own processes).

    python engine_sql.py embedded DIR   GLOB FORMAT SCHEMA ORDER_BY [--tuned] [--audit]
    python engine_sql.py push     URL TABLE GLOB FORMAT SCHEMA [--tuned] [--audit]

`embedded`: chDB in DIR, `CREATE TABLE` then one `INSERT INTO t SELECT * FROM
file(glob)`. `push`: chDB reads the files and streams Native blocks to a server's HTTP
interface with `INSERT INTO FUNCTION url(...)` (the server's table exists already).

`--audit` adds the same two columns the Python audit loader adds, computed by the
engine from file() virtual columns: `_file AS _source_filename`, `_time AS _file_ts`.
`--tuned` adds the settings an expert would reach for (TUNED).
"""

from __future__ import annotations

import sys
import urllib.parse

# Expert settings for many files on 2 cores (tried on this machine against bigger
# blocks and more threads, which did no better).
TUNED = {
    "max_threads": 2,  # one reading stream per core, each on its own files...
    "input_format_parallel_parsing": 0,  # ...parsing its file itself: no hand-offs
    "max_insert_threads": 2,  # and writing parts in parallel
}

AUDIT_SELECT = ", _file AS _source_filename, toDateTime(_time) AS _file_ts"


def settings_clause(tuned: bool) -> str:
    return " SETTINGS " + ", ".join(f"{k} = {v}" for k, v in TUNED.items()) if tuned else ""


def embedded(directory: str, glob: str, fmt: str, schema: str, order_by: str,
             tuned: bool, audit: bool) -> None:
    import chdb.session

    session = chdb.session.Session(directory)
    extra = ", _source_filename LowCardinality(String), _file_ts DateTime" if audit else ""
    session.query(f"CREATE TABLE t ({schema}{extra}) ENGINE = MergeTree ORDER BY {order_by}")
    session.query(f"INSERT INTO t SELECT *{AUDIT_SELECT if audit else ''} "
                  f"FROM file('{glob}', '{fmt}', '{schema}'){settings_clause(tuned)}")
    print(session.query("SELECT count() FROM t", "TSV").bytes().decode().strip())  # rows
    session.close()


def push(url: str, table: str, glob: str, fmt: str, schema: str, tuned: bool,
         audit: bool) -> None:
    import chdb

    query = urllib.parse.quote(f"INSERT INTO {table} FORMAT Native", safe="")
    structure = schema + (", _source_filename String, _file_ts DateTime" if audit else "")
    chdb.query(f"INSERT INTO FUNCTION url('{url}/?query={query}', 'Native', '{structure}') "
               f"SELECT *{AUDIT_SELECT if audit else ''} "
               f"FROM file('{glob}', '{fmt}', '{schema}'){settings_clause(tuned)}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = {"tuned": "--tuned" in sys.argv, "audit": "--audit" in sys.argv}
    if args[0] == "embedded":
        embedded(*args[1:6], **flags)
    else:
        push(*args[1:6], **flags)
