"""The public API's shape, without an engine: `load()`'s keyword parameters are
LoadSpec's fields (and `validate()`'s some of them), each documented, none open-ended;
the report's typed parts have their producers' keys; an option that no source of a load
reads is refused before anything opens."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import MISSING, asdict, fields
from typing import Any

import pytest

import chload
from chload import api
from chload.core import load as steps
from chload.core.report import (
    Concurrency,
    Costs,
    LoadReport,
    LoadSpec,
    Saturation,
    ServerSaturation,
    StreamChange,
)
from chload.core.run import FileResult
from chload.errors import UsageError
from chload.runtime.adaptive import Change, Controller
from chload.runtime.monitor import CallStats, Monitor, unit_costs
from chload.targets.cluster.shard_load import Counters, saturation as server_saturation

NOWHERE = "http://127.0.0.1:9/"  # refused at once: nothing here may get that far
PUBLIC: list[Callable[..., Any]] = [api.load, api.validate, api.files, api.sql, api.history,
                                    api.errors, api.run_files, chload.errors]


def _options(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(function).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_load_takes_each_loadspec_field_as_a_keyword_with_its_default() -> None:
    spec_fields = {f.name: f.default for f in fields(LoadSpec) if f.name != "sources"}
    options = _options(api.load)
    assert set(options) - {"listener", "metrics_port"} == set(spec_fields)
    for name, default in spec_fields.items():
        assert options[name].default == (None if default is MISSING else default), name
    assert set(_options(api.validate)) < set(spec_fields)
    assert {"table", "target"} <= set(_options(api.validate))


@pytest.mark.parametrize("function", PUBLIC, ids=lambda f: f.__name__)
def test_every_option_is_named_typed_and_documented(function: Callable[..., Any]) -> None:
    signature = inspect.signature(function)
    kinds = {p.kind for p in signature.parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds
    assert inspect.Parameter.VAR_POSITIONAL not in kinds
    assert all(p.annotation is not inspect.Parameter.empty
               for p in signature.parameters.values())
    doc = inspect.getdoc(api.errors if function is chload.errors else function) or ""
    for name in signature.parameters:
        assert f":param {name}:" in doc, f"{function.__name__}({name}=) is not documented"


def test_a_typo_is_a_type_error_and_a_loadspec_takes_no_options_beside_it() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'tagret'"):
        chload.load("a.csv", table="t", tagret=NOWHERE)  # type: ignore[call-arg]
    spec = LoadSpec(sources=("a.csv",), table="t", target=NOWHERE)
    with pytest.raises(UsageError, match=r"^load\(\): given a LoadSpec, put workers= in it"):
        chload.load(spec, workers=2)
    with pytest.raises(UsageError, match=r"^validate\(\): given a LoadSpec, put table= in"):
        chload.validate(spec, table="u")
    with pytest.raises(UsageError, match=r"^load\(\) needs table="):
        chload.load("a.csv", target=NOWHERE)


@pytest.mark.parametrize("source, options, said", [
    ("http://127.0.0.1:9/a.csv", {"follow": True}, "--follow: only for a kafka://, postgresql://, mysql://,"),
    ("kafka://127.0.0.1:9/topic", {"follow": True, "poll": 1},
     "--poll: only for --follow of local, s3://, az://, gs:// or hdfs:// files"),
    ("a.csv", {"batch_rows": 10}, "--batch-rows: only for a kafka:// or followed mysql://"),
    ("a.csv", {"batch_seconds": 1}, "--batch-seconds: only for a kafka:// or followed mysql://"),
    ("a.csv", {"kafka_options": {"security.protocol": "SSL"}}, "--kafka-option: only for"),
    ("kafka://127.0.0.1:9/topic", {"query": "SELECT 1"}, "--query: only for a postgresql"),
    ("a.csv", {"incremental_by": "id"}, "--incremental-by: only for a postgresql:// or"),
    ("a.csv", {"cluster": "c", "follow": True}, "--cluster: only for --follow of a postgresql"),
])
def test_an_option_no_source_reads_is_refused_before_anything_opens(
        source: str, options: dict[str, Any], said: str) -> None:
    with pytest.raises(UsageError) as caught:
        chload.load(source, table="t", target=NOWHERE, **options)
    assert str(caught.value).startswith(said)
    assert str(caught.value).endswith("no source of this load reads it")


def test_the_options_a_source_reads_are_taken() -> None:
    assert {"follow", "batch_rows", "batch_seconds", "kafka_options"} <= set(
        api.registry.source_for("kafka://h:9092/t").options)
    assert set(steps.SOURCE_OPTIONS) == {"query", "incremental_by", "follow", "batch_rows",
                                        "batch_seconds", "kafka_options", "after_last_key",
                                        "poll", "cluster"}
    assert api.registry.source_for("s3://bucket/k").options == ("after_last_key", "follow",
                                                                "poll")
    spec = LoadSpec(sources=("kafka://h:9092/t",), table="t", follow=True, batch_rows=5,
                    kafka_options={"a": "1"})  # type: ignore[arg-type]
    steps.refuse_unread(spec, api.registry.source_for("kafka://h:9092/t").options)
    steps.refuse_unread(LoadSpec(sources=("a.csv",), table="t"), ())  # defaults: all unread


def _keys(typed: Any) -> set[str]:
    return set(typed.__required_keys__ | typed.__optional_keys__)


def test_the_report_parts_have_their_producers_keys(tmp_path: object) -> None:
    assert set(Monitor(str(tmp_path)).start().stop().to_dict()) == _keys(Saturation)
    assert set(Controller(2).summary()) == _keys(Concurrency)
    assert set(Change(1.0, 2, 3, "why").to_dict()) == _keys(StreamChange)
    assert set(unit_costs(CallStats(), None, [1, 1], None, 0)) <= _keys(Costs)
    assert set(server_saturation(Counters(0.0), Counters(1.0), 4)) == _keys(ServerSaturation)


def test_to_dict_keeps_the_json_of_a_report_without_parts() -> None:
    data = LoadReport("default.t", "x", "r").to_dict()
    assert (data["saturation"], data["concurrency"], data["costs"], data["shards"]) == (
        {}, {}, {}, [])
    assert list(data)[:3] == ["table", "target", "run_id"] and "rows_per_second" in data


def test_to_dict_gives_each_file_result_as_asdict_would() -> None:
    report = LoadReport("default.t", "x", "r", notes=["n"])
    report.files = [FileResult("/d/a.csv", "loaded", 10, 144, 0.5, note="kept"),
                    FileResult("/d/b.csv", "failed", error="bad", changed=True, rejected=2)]
    data = report.to_dict()
    assert data["files"] == [asdict(r) for r in report.files]
    assert list(data) == [*(f.name for f in fields(LoadReport)), "rows_per_second"]
    data["files"][0]["rows"] = 0
    assert report.files[0].rows == 10  # a copy, not the results themselves


def test_the_returned_types_are_exported() -> None:
    for name in chload.__all__:
        assert getattr(chload, name) is not None, name
    assert {"LoadReport", "FileResult", "FileEvent", "FileCheck", "Event", "Saturation",
            "Concurrency", "Costs", "ShardLoad"} <= set(chload.__all__)


@pytest.mark.parametrize("sources, options, said", [
    ("a.csv", {"poll": 5}, "--poll 5: only with --follow"),
    ("-", {"follow": True}, "--follow -: standard input is read once"),
    ("a.csv", {"follow": True, "poll": 0}, "poll=0: must be a positive number of seconds"),
])
def test_follow_of_files_refuses_what_cannot_follow(sources: str, options: dict[str, Any],
                                                    said: str) -> None:
    with pytest.raises(UsageError) as caught:
        chload.load(sources, table="t", target=NOWHERE, **options)
    assert said in str(caught.value)
