"""--on-new-column's logic without a server: the type a column is added as, the run's
settings by mode, and the bounded wait for a cluster's replicas (scripted answers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chload.commit.ledger import Ledger
from chload.core import evolve
from chload.core.report import LoadSpec
from chload.errors import EngineError, SchemaError, UsageError
from chload.formats import FileFormat
from chload.sources.base import SourceFile
from chload.targets.cluster import columns as cluster_columns


def test_new_columns_are_nullable_of_the_bare_type() -> None:
    assert evolve.nullable("Int64") == "Nullable(Int64)"
    assert evolve.nullable("Nullable(Float64)") == "Nullable(Float64)"
    assert evolve.nullable("LowCardinality(String)") == "Nullable(String)"
    assert evolve.nullable("Array(Int64)") == "Array(Int64)"  # cannot be Nullable


def test_mode_is_checked_up_front() -> None:
    with pytest.raises(UsageError, match="--on-new-column drop: use fail, add or ignore"):
        LoadSpec(("a.csv",), "t", on_new_column="drop")


def _file(name: str, fmt: str) -> SourceFile:
    return SourceFile(uri=name, size=1, mtime_ns=1, format=FileFormat(fmt, "none"))


def test_ignore_drops_unknown_fields_unless_the_user_said() -> None:
    strict = (("input_format_skip_unknown_fields", "0"),)
    files = [_file("a.csv", "CSVWithNames")]
    assert evolve.job_settings("ignore", files, strict, ()) == (
        ("input_format_skip_unknown_fields", "1"),)
    assert evolve.job_settings("ignore", files, strict, strict) == strict
    assert evolve.job_settings("fail", files, strict, ()) == strict
    avro = evolve.job_settings("add", [_file("a.avro", "Avro")], strict, ())
    assert ("input_format_avro_allow_missing_fields", "1") in avro


class _Server:
    def __init__(self, answers: list[list[str]]) -> None:
        self.answers = answers

    def rows(self, sql: str) -> list[dict]:
        names = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [{"name": n} for n in names]


def _cluster(*servers: _Server) -> SimpleNamespace:
    shards = [SimpleNamespace(name=f"shard {i + 1} (h{i}:9000)", target=s)
              for i, s in enumerate(servers)]
    return SimpleNamespace(local="`default`.`t_local`", shards=shards, replicas=[],
                           table_display="default.t")


def test_cluster_waits_until_every_shard_shows_the_column() -> None:
    late = _Server([["a"], ["a"], ["a", "c"]])
    waits: list[float] = []
    cluster_columns.await_columns(_cluster(_Server([["a", "c"]]), late),  # type: ignore[arg-type]
                                  ["c"], timeout=60, sleep=waits.append)
    assert len(waits) == 2


def test_cluster_wait_is_bounded_with_one_line() -> None:
    never = _Server([["a"]])
    with pytest.raises(SchemaError) as err:
        cluster_columns.await_columns(_cluster(_Server([["a", "c"]]), never),  # type: ignore[arg-type]
                                      ["c"], timeout=0, sleep=lambda s: None)
    message = str(err.value)
    assert "\n" not in message and "shard 2 (h1:9000) does not show it" in message
    assert "nothing was loaded" in message


class _RacedLedgerSql:
    """A ledger made before runs.schema_changes, whose ADD COLUMN another loader runs
    first: 18.16 answers code 44 (not 15) for a column now there."""

    def __init__(self) -> None:
        self.altered: list[str] = []

    def rows(self, sql: str) -> list[dict]:
        return []  # no added column there yet

    def command(self, sql: str) -> None:
        if sql.startswith("ALTER"):
            self.altered.append(sql)
            raise EngineError("server: Cannot add column: column with this name already "
                              "exists", code=44)

    def text(self, sql: str, fmt: str) -> str:
        return ""


def test_a_ledger_column_another_loader_added_on_18_16_is_fine() -> None:
    sql = _RacedLedgerSql()
    Ledger(sql).ensure()  # type: ignore[arg-type]
    assert any("schema_changes" in a for a in sql.altered)
