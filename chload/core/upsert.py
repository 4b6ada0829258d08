"""--upsert-key / --version: a table that keeps the latest row of each key.

ClickHouse has no UPDATE on insert; a ReplacingMergeTree ordered by the key keeps, of
the rows sharing a key, the one of the greatest version (without a version column, the
one inserted last) once its parts merge. Until a background merge runs, every version is
there: `SELECT ... FINAL` (or `argMax(col, version) ... GROUP BY key`) reads the latest,
and `OPTIMIZE TABLE ... FINAL` forces the merge. A load's rows are inserted as ever (the
committer's exactly-once is unchanged); what makes it an upsert is the table's engine
and order, so chload creates the table so, and refuses one that is not so (appending
into a plain MergeTree would keep every version while the user believes otherwise).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from chload.errors import UsageError
from chload.schema import Column, quote_ident, split_top_level

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The ORDER BY of an engine clause as system.tables.engine_full shows it.
_ORDER = re.compile(r"\bORDER BY (.+?)(?: PRIMARY KEY | SAMPLE BY | TTL | SETTINGS |$)")


@dataclass(frozen=True, slots=True)
class Upsert:
    """The key columns (the table's ORDER BY) and the version column, if any."""

    key: tuple[str, ...]
    version: str | None

    @property
    def order_by(self) -> str:
        names = ", ".join(quote_ident(k) for k in self.key)
        return names if len(self.key) == 1 else f"({names})"

    @property
    def engine(self) -> str:
        return f"ReplacingMergeTree({quote_ident(self.version) if self.version else ''})"

    @property
    def wanted(self) -> str:
        return f"ENGINE = {self.engine} ORDER BY {self.order_by}"

    def check_data(self, table: str, columns: Sequence[Column]) -> None:
        """A key or version column the data lacks: one UsageError naming it."""
        have = {c.name for c in columns}
        for name, flag in [(k, "--upsert-key") for k in self.key] + (
                [(self.version, "--version")] if self.version else []):
            if name not in have:
                raise UsageError(
                    f"table {table}: {flag} column {name} is not in the data (its columns: "
                    f"{', '.join(sorted(have))}); name a column it has; nothing was loaded")

    def check_table(self, table: str, engines: Sequence[tuple[str, str]]) -> None:
        """Each (where, engine_full) of an existing table (a cluster: each shard's local
        one) a ReplacingMergeTree of this key and version: else one UsageError saying
        what it is and what to do."""
        for where, engine_full in engines:
            found = _describe(engine_full)
            if found != (self.key, self.version) and not (
                    self.version is None and found[0] == self.key):
                raise UsageError(
                    f"table {table}: --upsert-key needs {where} to be {self.wanted}, but it "
                    f"is {engine_full.split(' SETTINGS ')[0] or 'of no engine'}; load into "
                    "a new table, or recreate this one so; nothing was loaded")


def of(upsert_key: str | None, version: str | None, order_by: str | None) -> Upsert | None:
    """The spec's --upsert-key and --version checked (bare column names, comma separated
    for a key of several); None without --upsert-key."""
    if upsert_key is None:
        if version is not None:
            raise UsageError(f"--version {version}: only with --upsert-key (the key whose "
                             "latest version is kept); add --upsert-key COLUMNS")
        return None
    if order_by is not None:
        raise UsageError(f"--order-by {order_by} with --upsert-key: the key is the table's "
                         "order; drop --order-by")
    key = tuple(_bare(k) for k in upsert_key.split(","))
    if not key or not all(_NAME.match(k) for k in key):
        raise UsageError(f"--upsert-key {upsert_key}: name columns, comma separated "
                         "(e.g. id or tenant,id)")
    if version is not None and not _NAME.match(_bare(version)):
        raise UsageError(f"--version {version}: name one column (e.g. updated_at)")
    return Upsert(key, _bare(version) if version is not None else None)


def _bare(name: str) -> str:
    return name.strip().strip("`").strip('"')


def _describe(engine_full: str) -> tuple[tuple[str, ...], str | None] | tuple[None, None]:
    """(key columns, version column) of a [Replicated]ReplacingMergeTree clause; (None,
    None) for any other engine."""
    match = re.match(r"^(Replicated)?ReplacingMergeTree(?:\s*\((.*?)\))?\s", engine_full + " ")
    order = _ORDER.search(engine_full)
    if not match or not order:
        return None, None
    args = [a.strip() for a in split_top_level(match.group(2) or "") if a.strip()]
    args = args[2:] if match.group(1) else args
    text = order.group(1).strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    key = tuple(_bare(k) for k in split_top_level(text))
    return key, (_bare(args[0]) if args else None)
