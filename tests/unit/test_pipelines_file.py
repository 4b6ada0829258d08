"""Reading a pipelines file (chload/pipelines/file.py): options from chload.load's
signature, [defaults] under each load, ${VAR} from the environment, and a wrong key or
value as one line naming the file and its line; `chload run --check` as a user runs it."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import chload
from chload.errors import UsageError
from chload.pipelines import file

ROOT = Path(__file__).resolve().parents[2]

TEXT = """\
[defaults]
target = "/tmp/nowhere-target"
max_errors = 2

[loads.trips]
source = "${DATA}/*.csv"
table = "trips"
workers = 2

[loads."events"]
sources = ["kafka://127.0.0.1:9/topic"]
table = "events"
kafka_options = { "sasl.password" = "${KAFKA_PASSWORD}" }
"""


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "chload.toml"
    path.write_text(text)
    return str(path)


def test_every_keyword_of_load_is_an_option_but_the_listener() -> None:
    keywords = {name for name, p in inspect.signature(chload.load).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(file.OPTIONS) == keywords - {"listener"}
    # each is a LoadSpec field, but the port (run.py holds it for the run): an option
    # of load() outside the spec would need its own way into a load here
    spec = set(chload.LoadSpec.__dataclass_fields__)
    assert set(file.OPTIONS) - spec == {"metrics_port"}


def test_loads_take_defaults_and_the_environment(tmp_path: Path) -> None:
    env = {"DATA": "/srv/in", "KAFKA_PASSWORD": "kp-secret"}
    trips, events = file.read(_write(tmp_path, TEXT), env).loads
    assert (trips.name, trips.line, trips.spec.sources) == ("trips", 5, ("/srv/in/*.csv",))
    assert (trips.spec.workers, trips.spec.max_errors, trips.spec.target) == (
        2, 2, "/tmp/nowhere-target")
    assert events.spec.kafka_options == (("sasl.password", "kp-secret"),)
    assert not events.follows
    assert file.read(_write(tmp_path, TEXT), env, follow=True).loads[1].follows
    assert not file.read(_write(tmp_path, TEXT), env, follow=True).loads[0].follows
    shown = file.described(events)
    assert "kp-secret" not in shown and shown.startswith("events: kafka kafka://")


@pytest.mark.parametrize(("change", "message"), [
    (("workers = 2", "wrokers = 2"), ":8: unknown option 'wrokers' in [loads.trips]; did "
                                     "you mean workers?"),
    (("max_errors = 2", "max_erors = 2"), ":3: unknown option 'max_erors' in [defaults]; "
                                          "did you mean max_errors?"),
    (("workers = 2", "workers = \"x\""), ":8: [loads.trips]: workers='x': must be an int"),
    (("max_errors = 2", "max_errors = -2"), ":3: [loads.trips]: --max-errors -2: must be 0 "
                                            "or more"),
    (('table = "events"', ""), ":10: [loads.events] needs table = \"...\""),
    (("[loads.trips]", "[loads.trips"), ": not TOML: "),
])
def test_a_wrong_key_or_value_is_one_line_with_its_line(
        tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = _write(tmp_path, TEXT.replace(*change))
    with pytest.raises(UsageError) as caught:
        file.read(path, {"DATA": "/srv", "KAFKA_PASSWORD": "x"})
    assert str(caught.value).startswith(path + message)
    assert "\n" not in str(caught.value)


def test_an_unset_variable_names_itself_and_its_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        file.read(_write(tmp_path, TEXT), {"DATA": "/srv"})
    assert str(caught.value) == (f"{tmp_path}/chload.toml:13: [loads.events] kafka_options: "
                                 "${KAFKA_PASSWORD} is not set in the environment; set it, "
                                 "or write the value")


def test_run_check_names_a_misspelled_option(tmp_path: Path) -> None:
    path = _write(tmp_path, TEXT.replace("workers = 2", "worker = 2"))
    done = subprocess.run([sys.executable, "-m", "chload", "run", "--check", path],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={"DATA": "/srv", "KAFKA_PASSWORD": "kp-secret", "PATH": ""})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"chload: {path}:8: unknown option 'worker' in [loads.trips]; did "
                           "you mean workers? (the options are chload.load's, "
                           "docs/pipelines.md)\n")


@pytest.mark.parametrize(("targets", "tables", "refused"), [
    (("/tmp/t1", "/tmp/t1"), ("a", "b"), ""),
    (("http://127.0.0.1:9/", "http://127.0.0.1:8/"), ("a", "a"), ""),
    (("/tmp/t1", "/tmp/t2"), ("a", "b"), "loads files and events run at once (a load follows) "
                                         "into /tmp/t1 and /tmp/t2: a process holds one "
                                         "ClickHouse engine"),
    (("/tmp/t1", "http://127.0.0.1:9/"), ("a", "b"), "loads files and events run at once"),
    (("/tmp/t1", "/tmp/t1"), ("a", "a"), "loads files and events both load a of /tmp/t1 at "
                                         "once"),
])
def test_loads_at_once_share_one_engine_or_are_refused(
        tmp_path: Path, targets: tuple[str, str], tables: tuple[str, str], refused: str) -> None:
    from chload.pipelines import run

    text = (f'[loads.files]\nsource = "/srv/*.csv"\ntable = "{tables[0]}"\n'
            f'target = "{targets[0]}"\n'
            f'[loads.events]\nsource = "kafka://127.0.0.1:9/t"\ntable = "{tables[1]}"\n'
            f'target = "{targets[1]}"\nfollow = true\n')
    pipelines = file.read(_write(tmp_path, text), {})
    if not refused:
        assert run.together(pipelines)
        return
    with pytest.raises(UsageError) as caught:
        run.together(pipelines)
    assert str(caught.value).startswith(f"{tmp_path}/chload.toml: {refused}")
