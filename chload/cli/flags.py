"""The `chload` command's flags: each command's, and what its parser is made with
(COMMANDS). main.py picks the function each command runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from chload.formats import COMPRESSION_NAMES


def files_flags(p: argparse.ArgumentParser) -> None:
    common(p)
    p.add_argument("--table", "-t", required=True)
    p.add_argument("--json", action="store_true", help="print JSON (a list of objects)")
    p.add_argument("--shard", action="append", default=[], metavar="HOST:TCP_PORT=URL",
                   help="a Distributed table's replica and its HTTP URL (as for load)")


def sql_flags(p: argparse.ArgumentParser) -> None:
    common(p)
    p.add_argument("query")
    p.add_argument("--format", default="PrettyCompact",
                   help="any ClickHouse output format: TSV, JSON, Pretty, CSV ...")


def history_flags(p: argparse.ArgumentParser) -> None:
    common(p)
    p.add_argument("--table", "-t")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--run", metavar="RUN_ID", help="per-file detail of one run")
    p.add_argument("--json", action="store_true")


def sources_flags(p: argparse.ArgumentParser) -> None:
    common(p)
    p.add_argument("--max-retained", type=float, default=10.0, metavar="GB",
                   help="warn when a slot retains more WAL than this (default 10 GB)")
    p.add_argument("--drop", metavar="TABLE",
                   help="stop following TABLE: drop its slot at the source (PostgreSQL)")
    p.add_argument("--shard", action="append", default=[], metavar="HOST:TCP_PORT=URL",
                   help="a Distributed table's replica and its HTTP URL (as for load): "
                   "follows into a cluster are read from its shards")
    p.add_argument("--json", action="store_true")


def errors_flags(p: argparse.ArgumentParser) -> None:
    common(p)
    p.add_argument("--table", "-t", required=True)
    p.add_argument("--limit", type=int, default=10_000)
    p.add_argument("--json", action="store_true", help="print JSON (a list of objects)")


def validate_flags(p: argparse.ArgumentParser) -> None:
    common(p)
    spec_flags(p)
    p.add_argument("--mode", default="append",
                   choices=["append", "replace-partitions", "replace-table"],
                   help="say what a load with this --mode would do")


def workers(value: str) -> int | None:
    """--workers N, or auto (None)."""
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: a number, or auto") from None


def common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="directory of the embedded ClickHouse (default "
                   "./chload-data, or $CHLOAD_TARGET) or http(s)://[user@]host:port[/db]")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def load_flags(p: argparse.ArgumentParser) -> None:
    common(p)
    spec_flags(p)
    p.add_argument("--order-by", help="ORDER BY of a table chload creates")
    p.add_argument("--partition-by", help="PARTITION BY of a table chload creates")
    p.add_argument("--upsert-key", metavar="COLS", help="keep the latest row of each key: "
                   "create the table as ReplacingMergeTree ORDER BY COLS (comma separated)")
    p.add_argument("--version", metavar="COL", help="--upsert-key: the column whose "
                   "greatest value wins (default: the row loaded last)")
    p.add_argument("--audit", action="store_true", help="add _source_file and _loaded_at")
    p.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                   help="a ClickHouse setting for the inserts (repeatable)")
    p.add_argument("--workers", type=workers, metavar="N|auto",
                   help="files loaded in parallel; into a server, data requests at a time "
                        "(default auto: estimated, and into a server adapted while loading)")
    p.add_argument("--force", action="store_true", help="load files already loaded")
    p.add_argument("--on-error", default="continue", choices=["continue", "abort"],
                   help="after a failed file: go on with the others (default) or stop")
    p.add_argument("--on-new-column", default="fail", choices=["fail", "add", "ignore"],
                   help="a file naming a column the table lacks: fail it (default), add the "
                   "column (Nullable; every shard of a cluster) and load, or load the other "
                   "columns")
    p.add_argument("--mode", default="append",
                   choices=["append", "replace-partitions", "replace-table"],
                   help="append (default); replace-partitions: each unit's partitions "
                   "replace the table's (a re-exported day replaces that day; the table "
                   "needs PARTITION BY); replace-table: load a new table and swap it in "
                   "at the end (docs/modes.md)")
    p.add_argument("--kafka-option", action="append", default=[], metavar="NAME=VALUE",
                   help="a librdkafka setting for kafka:// sources, e.g. security.protocol="
                   "SASL_SSL (repeatable; ${VAR} takes the value from the environment)")
    p.add_argument("--follow", action="store_true", help="keep loading what comes until "
                   "SIGINT/SIGTERM: new Kafka messages, or new files (directories, globs, "
                   "s3://, az://, gs://, hdfs://) listed every --poll seconds (default: load, "
                   "then exit)")
    p.add_argument("--poll", type=float, metavar="S", help="--follow of files: seconds "
                   "between listings (default 30)")
    p.add_argument("--batch-rows", type=int, metavar="N",
                   help="kafka://: messages per commit at most (default 500000)")
    p.add_argument("--batch-seconds", type=float, metavar="S",
                   help="kafka:// --follow: commit at least this often (default 5)")
    p.add_argument("--query", help="a postgresql:// or mysql:// source: load the rows of "
                   "this SELECT (the URL names the database)")
    p.add_argument("--incremental-by", metavar="COLUMN", help="a database source: load the "
                   "rows whose COLUMN (one that only grows) is above what was loaded")
    p.add_argument("--after-last-key", action="store_true",
                   help="s3://, gs://, az://: list each prefix only after the greatest key "
                   "already loaded (keys that grow in order: dates, sequence numbers); "
                   "default: list all")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress, no summary")
    p.add_argument("--metrics-port", type=int, metavar="N", help="serve the load's metrics "
                   "for Prometheus on http://127.0.0.1:N/metrics while it runs")
    p.add_argument("--shard", action="append", default=[], metavar="HOST:TCP_PORT=URL",
                   help="a Distributed table's replica (as system.clusters names it) and "
                   "its HTTP URL (repeatable; default: its host, the target's port)")
    p.add_argument("--shard-by", default="auto", choices=["auto", "file"],
                   help="a Distributed table: rows by its sharding key (auto) or whole "
                   "files by weight")
    p.add_argument("--cluster", metavar="NAME",
                   help="--follow of a database table: make a missing table on this "
                   "cluster (<table>_local on every shard, a Distributed table here)")


def spec_flags(p: argparse.ArgumentParser) -> None:
    """The flags `load` and `validate` share: what to read, into which table, with which
    error budget (a validate says what a load with the same flags would do)."""
    p.add_argument("sources", nargs="+", metavar="SOURCE")
    p.add_argument("--table", "-t", required=True, help="table name, or db.table")
    p.add_argument("--format", "-f", help="ClickHouse input format (default: from the name)")
    p.add_argument("--compression", help=f"{', '.join(COMPRESSION_NAMES)} (default: from name)")
    p.add_argument("--schema", help="'a UInt32, b String': how to read the data")
    p.add_argument("--max-errors", type=int, metavar="N",
                   help="bad rows a file may have (default 0); a load keeps them in "
                   "chload.rejects")
    p.add_argument("--max-error-ratio", type=float, metavar="R",
                   help="bad rows / all rows a file may have, e.g. 0.01")
    p.add_argument("--s3-endpoint", metavar="URL", help="S3-compatible endpoint, e.g. "
                   "http://127.0.0.1:9000 (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")


def run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a pipelines file (TOML), e.g. chload.toml")
    p.add_argument("--check", action="store_true",
                   help="check the file and say what each load would do; load nothing")
    p.add_argument("--follow", action="store_true", help="every load whose source can "
                   "follow (Kafka) does, until SIGINT/SIGTERM; the loads run at once")
    p.add_argument("--metrics-port", type=int, metavar="N",
                   help="serve metrics on http://127.0.0.1:N/metrics for loads that name "
                   "no metrics_port")
    p.add_argument("--json", action="store_true", help="print a JSON list: each load's "
                   "name and report (or error)")
    p.add_argument("--quiet", "-q", action="store_true", help="no summaries")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")


# Each command: what its parser is made with, and the function adding its flags.
COMMANDS: dict[str, tuple[dict[str, Any], Callable[[argparse.ArgumentParser], None]]] = {
    "load": ({"help": "load files into a table, exactly once per file",
              "description": "Load files, directories, globs or - (stdin) into a table. "
                             "Files already loaded are skipped."}, load_flags),
    "files": ({"help": "the ledger: each file's state for a table"}, files_flags),
    "sql": ({"help": "run SQL against the target"}, sql_flags),
    "history": ({"help": "one line per load run"}, history_flags),
    "errors": ({"help": "rejected rows of a table: file, line, error, raw"}, errors_flags),
    "sources": ({"help": "followed tables: position, lag, WAL retained; --drop one"},
                sources_flags),
    "run": ({"help": "run the loads a pipelines file (TOML) declares",
             "description": "Run the loads of a pipelines file: one after another, or all "
                            "at once when one follows (docs/pipelines.md)."}, run_flags),
    "validate": ({"help": "parse sources against a table's schema; writes nothing",
                  "description": "Parse every row of the sources as `load` with the same "
                                 "flags would; writes nothing."}, validate_flags),
}
