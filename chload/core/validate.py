"""Validation: every row of every listed file parsed as a load would read it, each
value cast as a load would insert it, nothing written (`chload validate`, api.validate).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chload import formats
from chload.commit.rejects import ErrorBudget
from chload.core import plan as planner
from chload.errors import ChloadError
from chload.schema import Column, settings_sql
from chload.sources.base import SourceFile
from chload.sources.run import RunSources
from chload.targets.base import Target

if TYPE_CHECKING:
    from chload.api import LoadSpec


@dataclass(slots=True)
class FileCheck:
    """What validation found in one file."""

    uri: str
    rows: int = 0  # rows that parse
    errors: int = 0  # rows that do not
    first_errors: list[dict] = field(default_factory=list)  # line, error, raw
    failure: str = ""  # the file could not be read at all
    within_budget: bool = True  # a load with the same error budget would load this file


def check_files(t: Target, spec: LoadSpec, name: planner.TableName,
                 existing: list[Column] | None, sources: RunSources,
                 listed: list[SourceFile]) -> list[FileCheck]:
    """validate()'s checks of the listed files, as a load would read them (each fetched
    first, as the runner does: Source.fetch)."""
    untold = [FileCheck(f.uri, failure=formats.untold(f.uri), within_budget=False)
              for f in listed if not f.format.name]
    listed = [f for f in listed if f.format.name]
    described = sources.columns(listed)
    files = planner.resolve_format(t, listed, planner.known_names(existing, spec.schema),
                                   forced=spec.format is not None or described is not None,
                                   delimiter=dict(spec.settings).get("format_csv_delimiter"))
    columns, read_columns, _ = planner.prepare_table(
        t, name, files, existing=existing, schema=spec.schema, order_by=None,
        partition_by=None, audit=False, create=False, budget=spec.budget,
        described=described, dates_told="date_time_input_format" in dict(spec.settings),
        sources=sources)
    checked = planner.check_headers(t, name, files, existing or columns, read_columns,
                                    audit=False,
                                    named=planner.reads_by_name(spec.schema, spec.settings),
                                    settings=spec.settings)
    refused = {f.uri: why for f, why in checked.refused}
    settings = (*checked.settings, *spec.settings, *planner.csv_settings(files, spec.settings))
    return untold + [FileCheck(f.uri, failure=refused[f.uri], within_budget=False)
                     if f.uri in refused
                     else _fetch_and_check(t, sources, f, read_columns, spec.budget, settings,
                                           existing or columns)
                     for f in files]


def _fetch_and_check(t: Target, sources: RunSources, f: SourceFile,
                     columns: Sequence[Column], budget: ErrorBudget,
                     extra: Sequence[tuple[str, str]],
                     table: Sequence[Column] = ()) -> FileCheck:
    try:
        with sources.fetched((f,), columns) as (ready,):
            return _check(t, ready, columns, budget, extra, table)
    except ChloadError as exc:
        return FileCheck(f.uri, failure=str(exc), within_budget=False)


def _check(t: Target, f: SourceFile, columns: Sequence[Column],
           budget: ErrorBudget, extra: Sequence[tuple[str, str]] = (),
           table: Sequence[Column] = ()) -> FileCheck:
    """Read `f` as `columns`, each value also cast as a load inserts it into the `table`'s
    columns (fit.cast_expr: a number read wider than its column must fit it), so that
    what a load would refuse is a failure here too."""
    import tempfile

    from chload.commit import rejects
    from chload.core.reading import fit
    from chload.schema import quote_ident

    check = FileCheck(f.uri)
    with tempfile.TemporaryDirectory(prefix="chload-validate-") as tmp:
        errors_file = os.path.join(tmp, "errors.csv")
        settings = settings_sql([*ErrorBudget(None, 1.0).engine_settings(errors_file), *extra])
        try:
            read = {c.name: c.type for c in columns}
            casts = [fit.cast_expr(quote_ident(c.name), read[c.name], c.type)
                     for c in table if c.name in read]
            values = ", ".join(["*", *(c for c in casts if c)])
            rows = t.infer_rows(f"SELECT count() AS n FROM {t.reader(f, f.format.name, columns)}"
                                f" WHERE NOT ignore({values}) SETTINGS {settings}")
        except ChloadError as exc:
            check.failure = fit.in_table_types(str(exc), getattr(exc, "column", None),
                                               columns, table)
            return check
        check.rows = int(rows[0]["n"])
        # the errors file is on this machine: read by the engine that wrote it
        check.errors = rejects.count_errors(t.infer_rows, errors_file, f.format.delimiter)
        check.first_errors = rejects.first(t.infer_rows, errors_file, f.format)
    check.within_budget = (budget.allows(check.errors, check.rows + check.errors)
                           if budget.allows_errors else not check.errors)
    return check

