"""`validate()`: every row of every source parsed against the table's schema, nothing
written (api.validate and chload.validate are this function).

Apart from api.py (over 500 lines with it), and named `validation` because
`chload.validate` is the function: a submodule of that name would replace it in the
package's namespace when first imported (chload/__init__.py says the same of errors).
It borrows api.py's spec, listing and target helpers when called (api.py imports this
module, not the other way round at import time).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chload import formats
from chload.commit.rejects import ErrorBudget
from chload.core import options
from chload.core import plan as planner
from chload.errors import ChloadError, UsageError
from chload.schema import Column, settings_sql
from chload.sources import registry
from chload.sources.base import SourceFile
from chload.sources.run import RunSources
from chload.targets.base import Target
from chload.targets.registry import TargetSpec, open_target

if TYPE_CHECKING:
    from chload.api import LoadSpec, Sources, TargetName


@dataclass(slots=True)
class FileCheck:
    """What validation found in one file."""

    uri: str
    rows: int = 0  # rows that parse
    errors: int = 0  # rows that do not
    first_errors: list[dict] = field(default_factory=list)  # line, error, raw
    failure: str = ""  # the file could not be read at all
    within_budget: bool = True  # a load with the same error budget would load this file


_VALIDATE_OPTIONS = ("target", "format", "compression", "schema", "max_errors",
                     "max_error_ratio", "s3_endpoint")


def validate(sources: Sources | LoadSpec, table: str | None = None, *,
             target: TargetName = None, format: str | None = None,
             compression: str | None = None, schema: str | None = None,
             max_errors: int | None = None, max_error_ratio: float | None = None,
             s3_endpoint: str | None = None, **unknown: object) -> list[FileCheck]:
    """Parse every row of every source against the table's (or the inferred) schema.

    Takes what load() takes: sources and table= with options, or the LoadSpec a load
    would be given (its options that only shape a load, such as order_by, workers or
    settings, change nothing here).

    Writes nothing to the table or the ledger: bad rows are counted by the engine into
    a temporary errors file, outside the target. With an error budget, each file says
    whether a load with that budget would take it, and inference is the load's. Before
    the first load into an embedded target (no directory yet) the data is checked in a
    scratch engine, removed after: nothing is left behind.
    """
    from chload.api import (
        LoadSpec,
        _default_database,
        _engine_credentials,
        _list_sources,
        _source_context,
        _spec,
    )

    options.no_unknown("validate", unknown, _VALIDATE_OPTIONS)
    given = dict(target=target, format=format, compression=compression, schema=schema,
                 max_errors=max_errors, max_error_ratio=max_error_ratio,
                 s3_endpoint=s3_endpoint)
    if isinstance(sources, LoadSpec):
        if table is not None or any(v is not None for v in given.values()):
            raise UsageError("validate(): given a LoadSpec, put the table and options in it")
        spec = sources
    else:
        spec = _spec("validate", sources, table, given)
    with _validating(spec.target) as t:
        name = planner.parse_table(spec.table, _default_database(t))
        existing = t.table_columns(name.sql)
        context = _source_context(spec, t)
        run_sources = RunSources(context, registry)
        try:
            listed = _list_sources(spec, run_sources)
            with _engine_credentials(context):
                return _check_files(t, spec, name, existing, run_sources, listed)
        finally:
            run_sources.close()


def _check_files(t: Target, spec: LoadSpec, name: planner.TableName,
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
        described=described, dates_told="date_time_input_format" in dict(spec.settings))
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


@contextlib.contextmanager
def _validating(target: str | None) -> Iterator[Target]:
    """The target to validate against: the named one if it exists; an embedded one not
    made yet (before the first load) is a scratch directory, removed after (no table
    there: the data's own columns are checked)."""
    import shutil
    import tempfile

    from chload.api import _opened, _target_spec

    spec = _target_spec(target, create=False)
    if spec.url is not None or os.path.isdir(spec.where):
        with _opened(target) as t:
            yield t
        return
    scratch = tempfile.mkdtemp(prefix="chload-validate-")
    try:
        t = open_target(TargetSpec(scratch))
        try:
            yield t
        finally:
            t.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check(t: Target, f: SourceFile, columns: Sequence[Column],
           budget: ErrorBudget, extra: Sequence[tuple[str, str]] = (),
           table: Sequence[Column] = ()) -> FileCheck:
    """Read `f` as `columns`, each value also cast as a load inserts it into the `table`'s
    columns (fit.cast_expr: a number read wider than its column must fit it), so that
    what a load would refuse is a failure here too."""
    import tempfile

    from chload.commit import rejects
    from chload.core import fit
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

