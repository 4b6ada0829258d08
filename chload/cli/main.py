"""The `chload` command: flags -> one typed call of chload.api -> rendering (render.py).

A thin layer: it parses, calls one library function and draws what comes back. rich is
imported only when a terminal will see it, and the engine only when a command needs
it, so `chload --help` is instant and pipelines pay nothing for the progress bar.

Exit codes: 0 all good; 1 some file failed, or an error after this run committed rows
(the report says what was); 2 bad usage or an error before anything was committed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from chload.errors import ChloadError, UsageError
from chload.formats import COMPRESSION_NAMES

if TYPE_CHECKING:
    from chload.api import Event, Listener


def run() -> None:
    """The `chload` command (and `python -m chload`): main(), then exit.

    When main() returns, everything is done: output written, ledger flushed, connections
    closed, temporary files removed, and every engine (chDB) session closed. Python's
    teardown after that (freeing every object and module, and chDB's library its own)
    only costs time, a visible share of a short load; so the process ends without it.
    (A session still open, e.g. a library caller's, keeps the normal exit.)
    """
    code = main()
    engine = sys.modules.get("chload.runtime.engine")
    if "chdb" not in sys.modules or (engine is not None and engine.idle()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (BrokenPipeError, ValueError):  # a reader gone, a stream closed
                pass
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser(argv[0] if argv else None).parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # bytes a String holds, written as they are
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="surrogateescape")
    try:
        return int(args.func(args))
    except ChloadError as exc:
        if getattr(args, "debug", False):  # the traceback, and the same exit code
            import traceback

            traceback.print_exc()
        print(f"chload: {exc}", file=sys.stderr)
        if getattr(args, "json", False):  # a script reading stdout gets an answer too
            print(json.dumps({"error": str(exc), "kind": type(exc).__name__}))
        return 2
    except BrokenPipeError:  # `chload files | head`: the reader has gone; so do we
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("chload: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: of `command` alone when it names one, else of every
    command (`chload --help`, a typo). Each parser looks up argparse's translations on
    disk (gettext): the other commands' parsers would slow every start."""
    parser = argparse.ArgumentParser(
        prog="chload", description="Get data into ClickHouse fast and exactly once.")
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for name, (about, flags) in _COMMANDS.items():
        if command not in _COMMANDS or name == command:
            flags(commands.add_parser(name, **about))
    return parser


def _files_flags(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--table", "-t", required=True)
    p.add_argument("--json", action="store_true", help="print JSON (a list of objects)")
    p.add_argument("--shard", action="append", default=[], metavar="HOST:TCP_PORT=URL",
                   help="a Distributed table's replica and its HTTP URL (as for load)")
    p.set_defaults(func=_files)


def _sql_flags(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("query")
    p.add_argument("--format", default="PrettyCompact",
                   help="any ClickHouse output format: TSV, JSON, Pretty, CSV ...")
    p.set_defaults(func=_sql)


def _history_flags(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--table", "-t")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--run", metavar="RUN_ID", help="per-file detail of one run")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_history)


def _sources_flags(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--max-retained", type=float, default=10.0, metavar="GB",
                   help="warn when a slot retains more WAL than this (default 10 GB)")
    p.add_argument("--drop", metavar="TABLE",
                   help="stop following TABLE: drop its slot at the source (PostgreSQL)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_sources)


def _sources(args: argparse.Namespace) -> int:
    from chload.api import follows

    found = follows(target=args.target, max_retained=int(args.max_retained * 1024**3),
                    drop=args.drop)
    if args.json:
        print(json.dumps(found))
        return 0
    for f in found:
        if "dropped" in f and f.get("kind") == "mysql":
            print(f"{f['table']}: follow of {f['source']} dropped (no slot at the source: "
                  "nothing to drop there; drop the table, or load into a new --table)")
            continue
        if "dropped" in f:
            print(f"{f['table']}: follow of {f['source']} dropped"
                  + (f" (slot {f['slot']} dropped)" if f["dropped"] else " (no slot left)"))
            continue
        if f.get("kind") == "mysql":
            said = f.get("error") or (f"server at {f['server_binlog']}  lag {f['lag_bytes']:,}"
                                      f" B, {f['lag_seconds']:g} s")
            print(f"{f['table']}  {f['source']}  binlog {f.get('binlog', '?')}  {said}")
        else:
            said = f.get("error") or (
                f"lag {f['lag_bytes']:,} B, {f['lag_seconds']:g} s; WAL retained "
                f"{f['retained_bytes']:,} B")
            print(f"{f['table']}  {f['source']}  slot {f['slot']}  position {f['position']}  "
                  f"{said}")
        if f.get("warning"):
            print(f"warning: {f['warning']}", file=sys.stderr)
    if not found:
        print("no followed tables")
    return 0


def _errors_flags(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--table", "-t", required=True)
    p.add_argument("--limit", type=int, default=10_000)
    p.add_argument("--json", action="store_true", help="print JSON (a list of objects)")
    p.set_defaults(func=_errors)


def _validate_flags(p: argparse.ArgumentParser) -> None:
    _common(p)
    _spec_flags(p)
    p.add_argument("--mode", default="append",
                   choices=["append", "replace-partitions", "replace-table"],
                   help="say what a load with this --mode would do")
    p.set_defaults(func=_validate)


def _workers(value: str) -> int | None:
    """--workers N, or auto (None)."""
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: a number, or auto") from None


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="directory of the embedded ClickHouse (default "
                   "./chload-data, or $CHLOAD_TARGET) or http(s)://[user@]host:port[/db]")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def _load_flags(p: argparse.ArgumentParser) -> None:
    _common(p)
    _spec_flags(p)
    p.add_argument("--order-by", help="ORDER BY of a table chload creates")
    p.add_argument("--partition-by", help="PARTITION BY of a table chload creates")
    p.add_argument("--upsert-key", metavar="COLS", help="keep the latest row of each key: "
                   "create the table as ReplacingMergeTree ORDER BY COLS (comma separated)")
    p.add_argument("--version", metavar="COL", help="--upsert-key: the column whose "
                   "greatest value wins (default: the row loaded last)")
    p.add_argument("--audit", action="store_true", help="add _source_file and _loaded_at")
    p.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                   help="a ClickHouse setting for the inserts (repeatable)")
    p.add_argument("--workers", type=_workers, metavar="N|auto",
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
    p.set_defaults(func=_load)


def _spec_flags(p: argparse.ArgumentParser) -> None:
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


def _run_flags(p: argparse.ArgumentParser) -> None:
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
    p.set_defaults(func=_run)


# Each command: what its parser is made with, and the function adding its flags.
_COMMANDS: dict[str, tuple[dict[str, Any], Callable[[argparse.ArgumentParser], None]]] = {
    "load": ({"help": "load files into a table, exactly once per file",
              "description": "Load files, directories, globs or - (stdin) into a table. "
                             "Files already loaded are skipped."}, _load_flags),
    "files": ({"help": "the ledger: each file's state for a table"}, _files_flags),
    "sql": ({"help": "run SQL against the target"}, _sql_flags),
    "history": ({"help": "one line per load run"}, _history_flags),
    "errors": ({"help": "rejected rows of a table: file, line, error, raw"}, _errors_flags),
    "sources": ({"help": "followed tables: position, lag, WAL retained; --drop one"},
                _sources_flags),
    "run": ({"help": "run the loads a pipelines file (TOML) declares",
             "description": "Run the loads of a pipelines file: one after another, or all "
                            "at once when one follows (docs/pipelines.md)."}, _run_flags),
    "validate": ({"help": "parse sources against a table's schema; writes nothing",
                  "description": "Parse every row of the sources as `load` with the same "
                                 "flags would; writes nothing."}, _validate_flags),
}


def _shards(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in values:
        name, sep, url = item.partition("=")
        if not sep:
            raise UsageError(f"--shard {item}: write it as HOST:TCP_PORT=http(s)://HOST:PORT")
        out.append((name.strip(), url.strip()))
    return tuple(out)


def _settings(values: Sequence[str], flag: str = "--setting") -> tuple[tuple[str, str], ...]:
    out = []
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"{flag} {name.strip() or item}: write it as name=value, e.g. "
                             + ("max_threads=4" if flag == "--setting"
                                else "security.protocol=SASL_SSL"))
        out.append((name.strip(), value.strip()))
    return tuple(out)


def _load(args: argparse.Namespace) -> int:
    target = args.target or os.environ.get("CHLOAD_TARGET", "")
    if "://" not in target:
        from chload.runtime.engine import prefetch

        prefetch()  # an embedded target: chDB imports while chload.api does
        return _load_with(args)
    from chload.targets.server import early as server_early

    server_early.begin(target, args.table, os.environ)  # asked while chload.api imports
    try:
        return _load_with(args)
    finally:
        server_early.discard()


def _load_with(args: argparse.Namespace) -> int:
    from chload.api import load

    show = not args.quiet and not args.json and sys.stdout.isatty()
    with _progress(show) as listener:
        report = load(
            args.sources, table=args.table, target=args.target, format=args.format,
            compression=args.compression, schema=args.schema, order_by=args.order_by,
            partition_by=args.partition_by, audit=args.audit,
            settings=_settings(args.setting), workers=args.workers, force=args.force,
            on_error=args.on_error, s3_endpoint=args.s3_endpoint,
            max_errors=args.max_errors, max_error_ratio=args.max_error_ratio,
            kafka_options=_settings(args.kafka_option, "--kafka-option"),
            follow=args.follow, batch_rows=args.batch_rows,
            batch_seconds=args.batch_seconds, query=args.query,
            incremental_by=args.incremental_by, shards=_shards(args.shard),
            shard_by=args.shard_by, after_last_key=args.after_last_key, poll=args.poll,
            on_new_column=args.on_new_column, upsert_key=args.upsert_key,
            version=args.version, mode=args.mode, listener=_polls(args, listener),
            metrics_port=args.metrics_port)
    if args.json:
        data = report.to_dict()
        if len(data["files"]) > 1000:
            data["files"] = data["files"][:1000]
        print(json.dumps(data))
    if args.json or args.quiet:
        if not report.ok:  # named on stderr whatever stdout holds (docs/cli.md)
            from chload.cli.render import print_failures

            print_failures(report)
    else:
        from chload.cli.render import print_summary

        print_summary(report)
    return 0 if report.ok else 1


def _polls(args: argparse.Namespace, inner: Listener | None) -> Listener | None:
    """With --follow: each poll of files said as it ends, one line (render.poll_line),
    or with --json one JSON object a line on stdout, before the report's; other events
    to `inner` (the progress bar)."""
    if not args.follow or (args.quiet and not args.json):
        return inner

    def on_event(event: Event) -> None:
        if event.poll is None:
            if inner is not None:
                inner(event)
        elif args.json:
            from dataclasses import asdict

            print(json.dumps({"event": "poll", **asdict(event.poll)}), flush=True)
        else:
            from chload.cli.render import poll_line

            print(poll_line(event.poll), flush=True)
    return on_event


@contextlib.contextmanager
def _progress(show: bool) -> Iterator[Listener | None]:
    """The progress bar's listener while a load runs, if a terminal will see it."""
    if not show:
        yield None
        return
    from chload.cli.render import ProgressView

    with ProgressView() as view:
        yield view.on_event


def _files(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from chload.api import files

    events = files(args.table, target=args.target, shards=_shards(args.shard))
    if args.json:
        print(json.dumps([_file_row(asdict(e)) for e in events]))
    else:
        from chload.cli.render import print_files

        print_files(args.table, events)
    return 0


def _file_row(row: dict[str, Any]) -> dict[str, Any]:
    row["table"] = row.pop("target_table")
    row.pop("stage", None)
    row.pop("mark", None)
    return row


def _sql(args: argparse.Namespace) -> int:
    from chload.api import sql

    sys.stdout.write(sql(args.query, target=args.target, format=args.format))
    return 0


def _history(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from chload.api import history, run_files

    if args.run:
        events = run_files(args.run, target=args.target)
        if args.json:
            print(json.dumps([_file_row(asdict(e)) for e in events]))
        else:
            from chload.cli.render import print_files

            print_files(f"run {args.run}", events)
        return 0
    runs = history(args.table, target=args.target, limit=args.limit)
    if args.json:
        print(json.dumps(list(runs)))
    else:
        from chload.cli.render import print_history

        print_history(runs)
    return 0


def _errors(args: argparse.Namespace) -> int:
    from chload.api import errors

    rows = errors(args.table, target=args.target, limit=args.limit)
    if args.json:
        print(json.dumps(rows))
    else:
        from chload.cli.render import print_rejects

        print_rejects(args.table, rows)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from chload.api import validate

    checks = validate(args.sources, table=args.table, target=args.target, format=args.format,
                      compression=args.compression, schema=args.schema,
                      max_errors=args.max_errors, max_error_ratio=args.max_error_ratio,
                      s3_endpoint=args.s3_endpoint)
    if args.json:
        print(json.dumps([asdict(c) for c in checks]))
    else:
        from chload.api import MODE_EFFECT
        from chload.cli.render import print_checks

        print_checks(checks)
        if args.mode != "append":
            print(f"--mode {args.mode} into {args.table}: {MODE_EFFECT[args.mode]}")
    return 0 if all(c.within_budget and not c.failure for c in checks) else 1


def _run(args: argparse.Namespace) -> int:
    """chload run FILE: the file checked (--check: and described), then its loads."""
    from chload.pipelines import file, run

    pipelines = file.read(args.file, os.environ, follow=args.follow,
                          metrics_port=args.metrics_port)
    at_once = run.together(pipelines)
    if args.check:
        n = len(pipelines.loads)
        print(f"{args.file}: {n} load{'s' if n > 1 else ''}, "
              f"{'at once (one follows)' if at_once else 'one after another'}; nothing loaded")
        for load in pipelines.loads:
            print(f"  {file.described(load)}")
        return 0
    outcomes = run.run(pipelines, lambda outcome: _ran(args, outcome))
    if args.json:
        print(json.dumps([{"load": o.name, "report": o.report.to_dict() if o.report else None,
                           "error": o.error} for o in outcomes]))
    return 0 if all(o.ok for o in outcomes) else 1


def _ran(args: argparse.Namespace, outcome: Any) -> None:
    """A load of a pipelines file has ended: its summary (its error on stderr)."""
    if outcome.error:
        print(f"chload: load {outcome.name}: {outcome.error}", file=sys.stderr)
    elif args.json or args.quiet:
        if not outcome.report.ok:
            from chload.cli.render import print_failures

            print_failures(outcome.report)
    else:
        from chload.cli.render import print_summary

        print(f"{outcome.name}:", end=" ")
        print_summary(outcome.report)
    sys.stdout.flush()


def _version() -> str:
    from chload import __version__

    return f"chload {__version__}"

