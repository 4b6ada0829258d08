"""chload.records: what chload relies on from dataclasses, kept by its own version."""

from __future__ import annotations

import subprocess
import sys

import pytest

from chload.records import FrozenInstanceError, asdict, dataclass, field, fields, replace


@dataclass(frozen=True)
class Login:
    user: str
    password: str = field(default="", repr=False)
    tags: list[str] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        if not self.user:
            raise ValueError("user is empty")


@dataclass
class Report:
    name: str
    logins: list[Login] = field(default_factory=list)
    rows: int = 0


def test_init_defaults_and_factories() -> None:
    a, b = Login("ann"), Login("bob")
    assert (a.user, a.password, a.tags) == ("ann", "", [])
    assert a.tags is not b.tags  # a fresh list each
    assert Report("r", rows=3).rows == 3 and Report.rows == 0  # default on the class too
    with pytest.raises(TypeError, match="missing required argument: 'name'"):
        Report()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'row'"):
        Report("r", row=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="multiple values"):
        Report("r", name="s")  # type: ignore[misc]
    with pytest.raises(ValueError, match="user is empty"):
        Login("")


def test_repr_never_shows_a_secret() -> None:
    assert repr(Login("ann", "s3cret")) == "Login(user='ann', tags=[])"


def test_equality_hash_and_frozen() -> None:
    assert Login("ann", tags=["x"]) == Login("ann")  # tags: compare=False
    assert Login("ann") != Login("ann", "pw") and Login("ann") != ("ann", "")
    assert len({Login("ann"), Login("ann")}) == 1
    with pytest.raises(FrozenInstanceError):
        Login("ann").user = "bob"  # type: ignore[misc]
    with pytest.raises(TypeError):
        hash(Report("r"))  # mutable records are not hashable
    report = Report("r")
    report.rows = 5
    assert report == Report("r", rows=5)


def test_replace_asdict_fields() -> None:
    login = Login("ann", "pw")
    assert replace(login, user="bob") == Login("bob", "pw")
    with pytest.raises(ValueError):
        replace(login, user="")  # __post_init__ runs again
    with pytest.raises(TypeError, match="no field 'nope'"):
        replace(login, nope=1)
    report = Report("r", [login], 2)
    assert asdict(report) == {"name": "r", "rows": 2,
                              "logins": [{"user": "ann", "password": "pw", "tags": []}]}
    assert [f.name for f in fields(Report)] == ["name", "logins", "rows"]


def test_importing_chload_compiles_no_dataclass() -> None:
    """The reason this module exists: no `dataclasses` (nor inspect) at start."""
    code = ("import sys; before = set(sys.modules); "
            "import chload.cli, chload.api, chload.targets.server; "
            "print(sorted(m for m in ('dataclasses', 'inspect', 'hashlib') "
            "if m in sys.modules and m not in before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
