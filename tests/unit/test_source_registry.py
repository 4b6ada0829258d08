"""Sources behind one protocol, found by scheme; the load's configuration made once.

A new kind of source is one module (exposing `SOURCE`) and one line in
`sources.SCHEMES`: listing, reading, releasing, identity, presence and the audit
column all ask it, so nothing outside chload.sources knows kinds by name. The CLI's
load and validate share their flags, each passed to the API's keyword of its name.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable, Sequence
from dataclasses import FrozenInstanceError, replace

import pytest

from chload.api import LoadSpec
from chload.cli import main as cli
from chload.commit.known import KnownUnits
from chload.core import plan as planner
from chload.core.load import list_sources
from chload.errors import SourceError, UsageError
from chload.formats import FileFormat
from chload.schema import Column
from chload.sources import identity, registry
from chload.sources.base import InPlace, SourceContext, SourceFile
from chload.sources.registry import (
    KINDS,
    SCHEMES,
    release as release_files,
    source_for,
    table_function,
    table_function_many,
)
from chload.sources.run import RunSources
from chload.targets.base import LoadJob
from chload.targets.embedded.target import _select_sql
from chload.targets.vanished import VanishedFile, check_present, explain_gone

CSV = FileFormat("CSV", "none")


class FakeSource(InPlace):
    """A kind of source the package has never heard of: `fake://unit/a,b,c`."""

    kind = "fake"
    schemes = ("fake",)

    def __init__(self) -> None:
        self.released: list[str] = []
        self.gone: set[str] = set()
        self.contexts: list[SourceContext] = []

    def list(self, pattern: str, context: SourceContext) -> list[SourceFile]:
        self.contexts.append(context)
        root, _, names = pattern.rpartition("/")
        return [SourceFile(f"{root}/{n}", 0, 1, CSV, kind="fake", local_path=f"/spool/{n}")
                for n in names.split(",")]  # (a spool listing made: released at close)

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        return f"fake('{file.uri}', '{fmt}')"

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        return f"fake({len(files)} files)", "_fake_uri"

    def release(self, files: Iterable[SourceFile]) -> None:
        self.released += [f.uri for f in files]

    def current(self, file: SourceFile) -> SourceFile:
        return SourceFile(file.uri, 7, 2, file.format, kind="fake")

    def still_there(self, file: SourceFile) -> bool | None:
        return file.uri not in self.gone

    def reads_at_uri(self, file: SourceFile) -> bool:
        return True

    def known_empty(self, file: SourceFile) -> bool:
        return file.uri.endswith("/empty")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSource:
    """One module and one registry line: all a new scheme takes."""
    source = FakeSource()
    module = types.ModuleType("chload.sources.fake")
    module.SOURCE = source  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "chload.sources.fake", module)
    monkeypatch.setitem(SCHEMES, "fake", "fake")
    monkeypatch.setitem(KINDS, "fake", "chload.sources.fake")
    return source


def test_a_new_scheme_is_one_module_and_one_registry_line(fake: FakeSource) -> None:
    context = SourceContext(format="CSV")
    spec = LoadSpec(sources=("fake://unit/a,b", "fake://unit/b,empty"), table="t")
    run = RunSources(context, registry)
    files = list_sources(spec, run)
    assert [f.uri for f in files] == ["fake://unit/a", "fake://unit/b", "fake://unit/empty"]
    assert fake.contexts == [context, context]
    assert fake.released == ["fake://unit/b"]  # the second spelling of b, released at once
    assert run.columns(files) is None and not run.loads_alone(files[0])
    assert source_for("fake://x/y") is fake and source_for(files[0]) is fake
    assert table_function(files[0], "CSV", None) == "fake('fake://unit/a', 'CSV')"
    assert table_function_many(files, "CSV", None) == ("fake(3 files)", "_fake_uri")
    assert planner.samples(files) == files[:2]  # the source says which are empty
    assert identity.current(files[0]).identity == "7:2"
    run.close()  # the run is over: what listing made is released
    assert fake.released[1:] == [f.uri for f in files]
    release_files(files)
    assert fake.released[4:] == [f.uri for f in files]


def test_presence_and_the_audit_path_are_the_sources_answers(fake: FakeSource) -> None:
    a, b = (SourceFile(f"fake://unit/{n}", 0, 1, CSV, kind="fake") for n in "ab")
    fake.gone.add(b.uri)
    with pytest.raises(VanishedFile, match="fake://unit/b: vanished"):
        check_present([a, b], {}, lambda f: pytest.fail("asked the source, not a read"))
    assert isinstance(explain_gone(b, SourceError("x")), VanishedFile)
    job = LoadJob(file=a, table="`d`.`t`", table_display="d.t", columns=[Column("x", "Int8")],
                  read_columns=[Column("x", "Int8")], audit=True, settings=(), run_id="r")
    assert _select_sql(job, a, table_function).startswith("SELECT `x`, _path, now() FROM")


def test_schemes_name_their_kind_and_unknown_ones_say_what_is_read() -> None:
    for scheme, kind in SCHEMES.items():
        source = source_for(f"{scheme}://host/x")
        assert source.kind == kind and scheme in source.schemes
    assert source_for("data/*.csv").kind == source_for("-").kind == "local"
    with pytest.raises(UsageError, match=r"^h/x: ftp:// is not a source chload reads"):
        source_for("ftp://user:pw@h/x")


def test_listing_s3_or_hdfs_needs_what_the_caller_resolved() -> None:
    with pytest.raises(UsageError, match="SourceContext.s3"):
        source_for("s3://bucket/k").list("s3://bucket/k", SourceContext())
    with pytest.raises(UsageError, match="SourceContext.query"):
        source_for("hdfs://nn:8020/x").list("hdfs://nn:8020/x", SourceContext())


def test_a_plan_is_built_whole() -> None:
    plan = planner.decide([SourceFile("/d/a.csv", 1, 1, CSV)], KnownUnits(), force=False)
    with pytest.raises(FrozenInstanceError):
        plan.to_load = []  # type: ignore[misc]


def test_load_and_validate_share_flags_and_their_mapping_to_a_loadspec(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chload import api

    calls: dict[str, dict] = {}
    monkeypatch.setattr(api, "load", lambda sources, **kw: calls.setdefault(
        "load", {"sources": sources, **kw}) and api.LoadReport("t", "x", "r"))
    monkeypatch.setattr(api, "validate", lambda sources, **kw: calls.setdefault(
        "validate", {"sources": sources, **kw}) and [])
    shared = ["a.csv", "-t", "db.t", "--format", "CSV", "--compression", "gzip", "--schema",
              "x Int8", "--max-errors", "3", "--max-error-ratio", "0.5", "--s3-endpoint",
              "http://127.0.0.1:9000", "--target", "somewhere"]
    assert cli._load_with(cli._parser().parse_args(
        ["load", *shared, "--audit", "--setting", "a=1", "--quiet"])) == 0
    assert cli._validate(cli._parser().parse_args(["validate", *shared, "--json"])) == 0
    check = LoadSpec(**calls["validate"])
    assert check == LoadSpec(
        sources=("a.csv",), table="db.t", target="somewhere", format="CSV",
        compression="gzip", schema="x Int8", max_errors=3, max_error_ratio=0.5,
        s3_endpoint="http://127.0.0.1:9000")
    assert calls["load"].pop("listener") is None  # --quiet: no progress bar
    assert calls["load"].pop("metrics_port") is None
    assert LoadSpec(**calls["load"]) == replace(check, audit=True, settings=(("a", "1"),))
