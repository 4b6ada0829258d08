"""The Python API's edges without an engine: what a script may pass (pathlib.Path,
settings dicts), what a wrong type or an unknown option answers (UsageError naming it),
`chload.errors()` staying a function, engine messages that keep their cause, and the
runner's answer for a file another load committed meanwhile."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import chload
from chload.api import LoadSpec
from chload.core.run import Event, run
from chload.errors import UsageError, from_engine_message, one_line
from chload.formats import FileFormat
from chload.sources.base import SourceFile
from chload.targets.base import Loaded, LoadJob

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = "http://127.0.0.1:9/"  # refused at once: nothing here may get that far


def test_errors_is_the_function_after_any_other_call(tmp_path: Path) -> None:
    script = (
        "import chload, chload.errors, chload.api\n"
        "from chload.errors import UsageError\n"
        f"missing = {str(tmp_path / 'none')!r}\n"
        "try:\n    chload.files('t', target=missing)\nexcept UsageError:\n    pass\n"
        "try:\n    chload.errors('t', target=missing)\n"
        "except UsageError as exc:\n    print('usage:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, env=os.environ, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: target ")
    assert callable(chload.errors)


def test_spec_takes_paths_and_settings_of_any_plain_type() -> None:
    spec = LoadSpec(sources=Path("a.csv"), table="t", target=Path("data"),  # type: ignore[arg-type]
                    settings={"max_threads": 2, "log_queries": True,  # type: ignore[arg-type]
                              "max_block_size": "1000"})
    assert spec.sources == ("a.csv",) and spec.target == "data"
    assert spec.settings == (("max_threads", "2"), ("log_queries", "1"),
                             ("max_block_size", "1000"))
    many = LoadSpec(sources=[Path("a.csv"), "b/*.csv"], table="t",  # type: ignore[arg-type]
                    settings=[("max_threads", 4)], max_error_ratio=0)  # type: ignore[arg-type]
    assert many.sources == ("a.csv", "b/*.csv") and many.settings == (("max_threads", "4"),)
    assert many.max_error_ratio == 0.0
    assert many == LoadSpec(sources=("a.csv", "b/*.csv"), table="t",
                            settings=(("max_threads", "4"),), max_error_ratio=0.0)


@pytest.mark.parametrize("options, said", [
    ({"workers": "x"}, "workers='x': must be an int"),
    ({"workers": True}, "workers=True: must be an int"),
    ({"table": 5}, "table=5: must be a str"),
    ({"target": 5}, "target=5: must be a str or pathlib.Path"),
    ({"audit": "yes"}, "audit='yes': must be True or False"),
    ({"max_errors": "3"}, "max_errors='3': must be an int"),
    ({"max_error_ratio": "0.1"}, "max_error_ratio='0.1': must be a number"),
    ({"settings": ["max_threads=2"]}, "settings=['max_threads=2']: must be a dict"),
    ({"settings": {"max_threads": None}}, "settings['max_threads']=None"),
    ({"format": 1}, "format=1: must be a str"),
])
def test_load_answers_wrong_types_with_a_usage_error(options: dict, said: str) -> None:
    args: dict = {"table": "t", "target": NOWHERE, **options}
    with pytest.raises(UsageError) as caught:
        chload.load("a.csv", **args)
    assert said in str(caught.value)


def test_load_answers_wrong_sources_with_a_usage_error() -> None:
    with pytest.raises(UsageError, match="sources=5: must be a file, directory, glob"):
        chload.load(5, table="t", target=NOWHERE)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="sources=.*must be a str or pathlib.Path"):
        chload.load(["a.csv", 7], table="t", target=NOWHERE)  # type: ignore[list-item]


@pytest.mark.parametrize("call, said", [
    (lambda: chload.files(5, target=NOWHERE), "table=5: must be a str"),  # type: ignore[arg-type]
    (lambda: chload.files("t", target=3), "target=3"),  # type: ignore[arg-type]
    (lambda: chload.history(limit="x", target=NOWHERE), "limit='x': must be an int"),
    (lambda: chload.errors("t", target=NOWHERE, limit=None),  # type: ignore[arg-type]
     "limit=None"),
    (lambda: chload.sql(5, target=NOWHERE), "query=5: must be a str"),  # type: ignore[arg-type]
    (lambda: chload.sql("SELECT 1", target=NOWHERE, format=None),  # type: ignore[arg-type]
     "format=None: must be a str"),
    (lambda: chload.run_files(None, target=NOWHERE), "run_id=None"),  # type: ignore[arg-type]
    (lambda: chload.validate("a.csv", table="t", target=NOWHERE,
                             max_errors="2"),  # type: ignore[arg-type]
     "max_errors='2': must be an int"),
])
def test_reading_functions_answer_wrong_types_with_a_usage_error(
        call: Callable[[], object], said: str) -> None:
    with pytest.raises(UsageError) as caught:
        call()
    assert said in str(caught.value)


INFERENCE_FAILED = (
    "Code: 636. DB::Exception: The table structure cannot be extracted from a CSV format "
    "file. Error:\nCode: 354. DB::Exception: inflate failed: data error: While reading "
    "from: /d/bad.csv.gz. (ZLIB_INFLATE_FAILED) (version 26.9.2.1).\nYou can specify the "
    "structure manually: (in file/uri /d/bad.csv.gz). (CANNOT_EXTRACT_TABLE_STRUCTURE)")


def test_a_nested_engine_error_keeps_its_cause() -> None:
    assert one_line(INFERENCE_FAILED) == ("The table structure cannot be extracted from a "
                                          "CSV format file: inflate failed: data error "
                                          "(ZLIB_INFLATE_FAILED)")
    assert "pass --compression none" in str(from_engine_message(INFERENCE_FAILED, "bad.csv.gz"))
    empty = ("Code: 636. DB::Exception: The table structure cannot be extracted from a CSV "
             "format file. Error:\nThe table structure cannot be extracted from a CSV format "
             "file: the file is empty.\nYou can specify the structure manually: (in file/uri "
             "/d/e.csv). (CANNOT_EXTRACT_TABLE_STRUCTURE)")
    assert one_line(empty) == ("The table structure cannot be extracted from a CSV format "
                               "file: the file is empty")
    doubled = ("Code: 27. DB::Exception: Code: 27. DB::Exception: Cannot parse input: "
               "expected 'eof' before: 'abc'. (CANNOT_PARSE_INPUT_ASSERTION_FAILED) (version "
               "26.9.2.1). (CANNOT_PARSE_INPUT_ASSERTION_FAILED)")
    assert one_line(doubled) == "Cannot parse input: expected 'eof' before: 'abc'"


class CommittedElsewhere:
    """A target whose commit finds the file committed by another run meanwhile."""

    def load_file(self, job: LoadJob, progress: Callable[[int, int], None]) -> Loaded:
        progress(5, 100)  # staged and counted, then not attached
        return Loaded(0, 100, elsewhere=True)


def test_a_file_committed_by_another_run_meanwhile_is_skipped() -> None:
    f = SourceFile("/d/a.csv", 100, 1, FileFormat("CSV", "none"))
    job = LoadJob(file=f, table="`default`.`t`", table_display="default.t", columns=[],
                  read_columns=[], audit=False, settings=(), run_id="run")
    events: list[Event] = []
    [result] = run(CommittedElsewhere(), [job], 1, events.append)  # type: ignore[arg-type]
    assert (result.status, result.rows, result.note) == (
        "skipped", 0, "loaded by another run meanwhile")
    assert [e.kind for e in events] == ["start", "progress", "progress", "skip"]
    assert sum(e.rows for e in events if e.kind == "progress") == 0  # taken back
