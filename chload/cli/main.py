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

from chload.cli import flags
from chload.errors import ChloadError, UsageError

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
    for name, (about, add_flags) in flags.COMMANDS.items():
        if command not in flags.COMMANDS or name == command:
            sub = commands.add_parser(name, **about)
            add_flags(sub)
            sub.set_defaults(func=_HANDLERS[name])
    return parser


def _sources(args: argparse.Namespace) -> int:
    from chload.api import follows

    found = follows(target=args.target, max_retained=int(args.max_retained * 1024**3),
                    drop=args.drop, shards=_shards(args.shard))
    if args.json:
        print(json.dumps(found))
        return 0
    for f in found:
        if "source" not in f:  # a Distributed table whose shards could not be asked
            print(f"{f['table']}  {f['error']}")
            continue
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
            shard_by=args.shard_by, cluster=args.cluster,
            after_last_key=args.after_last_key, poll=args.poll,
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


# The function each command (flags.COMMANDS) runs.
_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "load": _load, "files": _files, "sql": _sql, "history": _history, "errors": _errors,
    "sources": _sources, "run": _run, "validate": _validate,
}
