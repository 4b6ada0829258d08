"""The readers of what loads did, for the API (chload.api re-exports them): `files()`,
`sql()`, `history()`, `errors()`, `run_files()`, each on an existing target opened for the
call and closed after; and how `--target` and the environment name a target."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from chload import options
from chload.commit.ledger import FileEvent
from chload.core import load as steps, plan as planner
from chload.core.report import Pairs, TargetName
from chload.targets.base import Target
from chload.targets.registry import TargetSpec, open_target


def target_spec(target: str | None, create: bool = True) -> TargetSpec:
    """--target (else $CHLOAD_TARGET, else the default) and the server password
    ($CLICKHOUSE_PASSWORD, where the URL has none), read here once for the whole run."""
    return TargetSpec.resolve(target, os.environ, create)


def files(table: str, *, target: TargetName = None,
          shards: Pairs = ()) -> list[FileEvent]:
    """The ledger: each file's latest state for a table.

    :param table: ``name`` or ``db.name``.
    :param target: as `load`'s; the target must exist.
    :param shards: a Distributed table's replicas and URLs, as `load`'s; its ledger has
        each file's state on each shard, `target_table` naming the shard.
    """
    name = options.text("table", table)
    planner.parse_table(name)
    with opened(target) as t:
        table_name = planner.parse_table(name, steps.default_database(t))
        with t.for_table(table_name.sql, options.settings("shards", shards), "auto",
                         os.environ) as c:
            return c.ledger.latest(table_name.display)


def sql(query: str, *, target: TargetName = None, format: str = "TSV") -> str:
    """Run SQL against the target and return the engine's answer as text.

    :param query: any SQL statement.
    :param target: as `load`'s; the target must exist.
    :param format: any ClickHouse output format: TSV, JSON, CSV, PrettyCompact ...
    """
    query, format = options.text("query", query), options.text("format", format)
    with opened(target) as t:
        return t.text(query, format)


def history(table: str | None = None, *, target: TargetName = None,
            limit: int = 50) -> Sequence[dict[str, Any]]:
    """One entry per run of `load`, newest first, as the ledger records it.

    :param table: only the runs into this table; None: every table's.
    :param target: as `load`'s; the target must exist.
    :param limit: runs at most.
    """
    table, limit = options.optional_text("table", table), options.whole("limit", limit)
    if table:
        planner.parse_table(table)
    with opened(target) as t:
        name = planner.parse_table(table, steps.default_database(t)).display if table else None
        return t.ledger.runs(name, limit)


def errors(table: str, *, target: TargetName = None,
           limit: int = 10_000) -> list[dict[str, Any]]:
    """Rejected rows of a table's current loads: file, line, error, raw.

    :param table: ``name`` or ``db.name``.
    :param target: as `load`'s; the target must exist.
    :param limit: rows at most.
    """
    from chload.commit import rejects

    name, limit = options.text("table", table), options.whole("limit", limit)
    planner.parse_table(name)
    with opened(target) as t:
        return rejects.listing(t, planner.parse_table(name, steps.default_database(t)).display,
                               limit)


def run_files(run_id: str, *, target: TargetName = None) -> list[FileEvent]:
    """Per-file detail of one run: the final event of each file it touched.

    :param run_id: a run's id, as `history` and LoadReport.run_id give it.
    :param target: as `load`'s; the target must exist.
    """
    run_id = options.text("run_id", run_id)
    with opened(target) as t:
        return t.ledger.of_run(run_id)


@contextlib.contextmanager
def opened(target: object) -> Iterator[Target]:
    """An existing target, for commands that only read; closed after."""
    t = open_target(target_spec(options.optional_path("target", target), create=False))
    try:
        yield t
    finally:
        t.close()
