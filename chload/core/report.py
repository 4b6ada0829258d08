"""What a load is asked (`LoadSpec`) and what it answers (`LoadReport` and its parts).

A caller's options end in one frozen LoadSpec, checked once when it is made. The report's
parts (saturation, concurrency, costs, shards) keep the shape of the JSON that
`chload load --json` prints and the ledger records, so they are TypedDicts: mypy checks
their keys and the JSON stays the same. The measuring modules (runtime/, the targets)
hand them over as plain dicts; api.py types them on arrival with the `*_of` functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, TypedDict, cast

from chload import options
from chload.commit.rejects import ErrorBudget
from chload.core import evolve, plan as planner, upsert as upserts
from chload.core.run import FileResult
from chload.errors import UsageError

Sources = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
TargetName = str | os.PathLike[str] | None
SettingValue = str | int | float | bool
Settings = Mapping[str, SettingValue] | Iterable[tuple[str, SettingValue]]
Pairs = Mapping[str, str] | Iterable[tuple[str, str]]  # e.g. shards: replica -> URL
OnError = Literal["continue", "abort"]
OnNewColumn = Literal["fail", "add", "ignore"]
ShardBy = Literal["auto", "file"]
Mode = Literal["append", "replace-partitions", "replace-table"]
MODES = ("append", "replace-partitions", "replace-table")
# What each --mode does, as `chload validate` and `chload run --check` say it
MODE_EFFECT = {
    "append": "units add their rows to the table; a unit loaded before is skipped",
    "replace-partitions": "each unit's partitions replace the table's (REPLACE PARTITION "
                          "under the commit lock; the first unit of the run holding a "
                          "partition replaces it, later ones add to it); a changed file "
                          "is loaded again; the table needs a PARTITION BY",
    "replace-table": "every unit listed loads into a new table, swapped in for the table "
                     "once all committed (the table as it was until then; kept if any "
                     "unit fails); the table's earlier units are superseded in the ledger",
}


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Everything a load needs, validated once; flags, env and code all end here.
    `chload.load` documents each field (its keyword parameters are these fields)."""

    sources: tuple[str, ...]
    table: str
    target: str | None = None
    format: str | None = None
    compression: str | None = None
    schema: str | None = None
    order_by: str | None = None
    partition_by: str | None = None
    audit: bool = False
    settings: tuple[tuple[str, str], ...] = ()
    workers: int | None = None  # None: sized by the target (and adapted into a server)
    force: bool = False
    on_error: str = "continue"
    s3_endpoint: str | None = None
    max_errors: int | None = None
    max_error_ratio: float | None = None
    kafka_options: tuple[tuple[str, str], ...] = ()
    follow: bool = False
    batch_rows: int | None = None
    batch_seconds: float | None = None
    query: str | None = None
    incremental_by: str | None = None
    shards: tuple[tuple[str, str], ...] = ()
    shard_by: str = "auto"
    cluster: str | None = None  # --cluster: a followed table made on this cluster
    after_last_key: bool = False
    poll: float | None = None  # --follow of files: seconds between listings (None: 30)
    on_new_column: str = "fail"
    upsert_key: str | None = None  # --upsert-key: a ReplacingMergeTree ordered by these
    version: str | None = None  # --version: its version column
    mode: str = "append"  # --mode: append, replace-partitions or replace-table (docs/modes.md)

    def __post_init__(self) -> None:
        for name, convert in _SPEC_TYPES.items():  # a Path, a dict of settings, ...
            object.__setattr__(self, name, convert(name, getattr(self, name)))
        if not self.sources:
            raise UsageError("nothing to load: name at least one file, directory, glob or -")
        if self.on_error not in ("continue", "abort"):
            raise UsageError(f"--on-error {self.on_error}: use continue or abort")
        evolve.check_mode(self.on_new_column)
        self._check_mode()
        planner.validate_options(self.compression, self.workers)
        planner.parse_table(self.table)
        upserts.of(self.upsert_key, self.version, self.order_by)
        if self.max_errors is not None and self.max_errors < 0:
            raise UsageError(f"--max-errors {self.max_errors}: must be 0 or more")
        if self.max_error_ratio is not None and not 0 <= self.max_error_ratio <= 1:
            raise UsageError(f"--max-error-ratio {self.max_error_ratio}: must be in [0, 1]")
        if self.batch_rows is not None and self.batch_rows < 1:
            raise UsageError(f"--batch-rows {self.batch_rows}: must be 1 or more")
        if self.poll is not None and not self.follow:
            raise UsageError(f"--poll {self.poll:g}: only with --follow (how often a load "
                             "that follows lists its sources again); add --follow")
        if self.cluster is not None and not self.follow:
            raise UsageError(f"--cluster {self.cluster}: only with --follow (a followed "
                             "table is made on the cluster when missing); a run that "
                             "catches up leaves it out")
        if self.follow and "-" in self.sources:
            raise UsageError("--follow -: standard input is read once; follow a directory, "
                             "a glob or a prefix")

    def _check_mode(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"--mode {self.mode}: use {', '.join(MODES)}")
        if self.mode == "append":
            return
        clash = [flag for flag, given in (("--follow", self.follow), ("--upsert-key",
                 self.upsert_key is not None), ("--incremental-by",
                 self.incremental_by is not None)) if given]
        if clash:
            raise UsageError(f"--mode {self.mode} with {clash[0]}: a replace needs every "
                             "unit of a run listed at its start; load with --mode append")
        if any(s.lower().startswith("kafka://") for s in self.sources):
            raise UsageError(f"--mode {self.mode}: a Kafka topic's messages are appended "
                             "(each exactly once); load it with --mode append")

    @property
    def upsert(self) -> upserts.Upsert | None:
        return upserts.of(self.upsert_key, self.version, self.order_by)

    @property
    def budget(self) -> ErrorBudget:
        return ErrorBudget(self.max_errors, self.max_error_ratio)


# What each LoadSpec field may be given as, and the one type it holds (options.py).
_SPEC_TYPES = {
    "sources": options.sources, "table": options.text, "target": options.optional_path,
    "format": options.optional_text, "compression": options.optional_text,
    "schema": options.optional_text, "order_by": options.optional_text,
    "partition_by": options.optional_text, "audit": options.flag,
    "settings": options.settings, "workers": options.workers, "force": options.flag,
    "on_error": options.text, "s3_endpoint": options.optional_text,
    "max_errors": options.optional_whole, "max_error_ratio": options.optional_ratio,
    "kafka_options": options.settings, "follow": options.flag,
    "batch_rows": options.optional_whole, "batch_seconds": options.optional_seconds,
    "query": options.optional_text, "incremental_by": options.optional_text,
    "shards": options.settings, "shard_by": options.text, "cluster": options.optional_text,
    "after_last_key": options.flag,
    "poll": options.optional_seconds,
    "on_new_column": options.text, "upsert_key": options.optional_text,
    "version": options.optional_text, "mode": options.text,
}


class Saturation(TypedDict):
    """CPU, disk and network over the load, from /proc (runtime/monitor.py); a figure
    /proc could not tell is None."""

    cpu_util_pct: float | None  # machine CPU busy, % of all cores
    process_cpu_s: float | None  # this process's user + system seconds
    cores: int
    disk: str | None  # the block device holding the target directory
    disk_util_pct: float | None
    disk_await_ms: float | None
    net_rx_mb: float | None
    net_tx_mb: float | None
    bottleneck: str  # cpu, disk, waiting (on the source or target), or unknown


# One change of the streams' limit (runtime/adaptive.py Change): seconds into the load,
# from, to, and why. `from` is a keyword, hence this spelling.
StreamChange = TypedDict("StreamChange", {"at_s": float, "from": int, "to": int,
                                          "reason": str})


class Concurrency(TypedDict):
    """The streams a load ran with (runtime/adaptive.py Controller.summary)."""

    mode: Literal["fixed", "auto"]  # fixed: --workers N; auto: adapted while loading
    start: int
    final: int
    lowest: int
    highest: int
    maximum: int
    bound: str  # what held the number of streams where it ended
    changes: list[StreamChange]


class Costs(TypedDict, total=False):
    """A load's fixed and per-unit costs (runtime/monitor.py unit_costs). Which keys a
    target measures varies: a cluster's only first_byte_s and data_s; the embedded
    target's also its engine sessions."""

    first_byte_s: float | None  # from the process's start to the first data request
    data_s: float | None  # from then to the end of the last one
    setup_requests: int  # requests before the first data request
    units: int  # committed units (stages: a file or a batch)
    files: int
    commit_requests_per_unit: float | None
    commit_seconds_per_unit: float | None
    data_requests: int
    setup_seconds: float
    data_seconds: float
    sessions: int
    session_open_seconds: float


class ServerSaturation(TypedDict, total=False):
    """What a shard's server did during the load (targets/cluster/shard_load.py); empty
    when its counters could not be read."""

    seconds: float
    cores: int
    cpu_s: float | None
    cpu_util_pct: float | None
    cpu_wait_pct: float | None  # share of its threads' run time spent waiting for a CPU
    disk_write_s: float | None
    merges_s: float | None
    merges_running: int | None
    background_tasks: int | None
    memory_mb: float | None
    bottleneck: str


class ShardLoad(TypedDict):
    """One shard of a Distributed table's load (a cluster target's shard_report)."""

    shard: int
    weight: int
    replica: str  # as system.clusters names it
    url: str
    rows: int
    bytes: int
    seconds: float  # committing
    server: ServerSaturation


def saturation_of(figures: Mapping[str, Any]) -> Saturation | None:
    """The monitor's figures (runtime.monitor.Saturation.to_dict), typed; None if none."""
    return cast(Saturation, dict(figures)) if figures else None


def concurrency_of(summary: Mapping[str, Any]) -> Concurrency | None:
    """The controller's summary (runtime.adaptive.Controller.summary), typed."""
    return cast(Concurrency, dict(summary)) if summary else None


def costs_of(costs: Mapping[str, Any]) -> Costs | None:
    """A target's cost_report, typed; None where the target measures none."""
    return cast(Costs, dict(costs)) if costs else None


def shards_of(shards: Iterable[Mapping[str, Any]]) -> list[ShardLoad]:
    """A target's shard_report, typed ([] for a table that is not Distributed)."""
    return [cast(ShardLoad, dict(s)) for s in shards]


@dataclass(slots=True)
class LoadReport:
    """What a load did. `ok` is False when any file failed, or the run's last writes
    (`errors`). `to_dict()` is what `chload load --json` prints (a part that is None
    there is {})."""

    table: str
    target: str
    run_id: str
    files_total: int = 0
    files_loaded: int = 0
    files_skipped: int = 0
    files_failed: int = 0
    files_changed: int = 0  # loaded before under another identity: failed, or --force
    table_reset: str = ""  # why the ledger's earlier loads into the table were set aside
    rows_loaded: int = 0
    rows_rejected: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    created_table: bool = False
    recovered: int = 0
    saturation: Saturation | None = None  # None: nothing was loaded
    concurrency: Concurrency | None = None
    costs: Costs | None = None  # None: the target measures none, or nothing was loaded
    shards: list[ShardLoad] = field(default_factory=list)  # a Distributed table's
    notes: list[str] = field(default_factory=list)  # worth knowing, not errors (slow paths)
    # columns this run added (--on-new-column add): table, column, type, unit
    schema_changes: list[dict[str, str]] = field(default_factory=list)
    unit: str = "file"  # what the summary calls a unit: a database's range, a Kafka batch
    listing_calls: int = 0  # requests made to list the sources (S3: ListObjectsV2 pages)
    # what failed after units were committed, beside any one file (the ledger's last
    # writes to a server gone): what was committed stands (core/finish.py)
    errors: list[str] = field(default_factory=list)
    files: list[FileResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.files_failed == 0 and not self.errors

    @property
    def rows_per_second(self) -> float:
        return self.rows_loaded / self.seconds if self.seconds else 0.0

    def add_units(self, results: Sequence[FileResult], listed: int | None = None,
                  skipped: int | None = None) -> None:
        """Results of units a part of the run ran (a round, a poll, a copy), counted into
        this report and kept in `files`: all, or (`listed`) every failure and the rest
        while `files` holds fewer than `listed`. `skipped`: the count of skipped units
        to add instead of those among `results` (a follow's later polls skip again
        what its first one counted)."""
        if listed is None:
            self.files.extend(results)
        else:
            room = max(0, listed - len(self.files))
            self.files += [r for r in results if r.status == "failed"]
            self.files += [r for r in results if r.status != "failed"][:room]
        loaded = [r for r in results if r.status == "loaded"]
        failed = sum(r.status == "failed" for r in results)
        if skipped is None:
            skipped = sum(r.status == "skipped" for r in results)
        self.files_loaded += len(loaded)
        self.files_failed += failed
        self.files_skipped += skipped
        self.files_total += len(loaded) + failed + skipped
        self.files_changed += sum(r.changed for r in results)
        self.rows_loaded += sum(r.rows for r in loaded)
        self.rows_rejected += sum(r.rejected for r in loaded)
        self.bytes_read += sum(r.bytes for r in results)

    def to_dict(self) -> dict[str, Any]:
        # the files by hand: asdict deep-copies each field of each of a first load's
        # 100,000 results, a cost the run pays after its last commit
        data = asdict(replace(self, files=[]))
        data["files"] = [_result_dict(r) for r in self.files]
        for part in ("saturation", "concurrency", "costs"):
            data[part] = data[part] or {}
        data["rows_per_second"] = round(self.rows_per_second, 1)
        data["seconds"] = round(self.seconds, 3)
        return data


_RESULT_FIELDS = tuple(f.name for f in fields(FileResult))


def _result_dict(result: FileResult) -> dict[str, Any]:
    """`asdict(result)`: its fields are all plain values, nothing to copy deep."""
    return {name: getattr(result, name) for name in _RESULT_FIELDS}
