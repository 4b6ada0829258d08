"""A PostgreSQL session begun while the target opens (db_early): claimed by a run with
the same options, closed otherwise, its error raised where the run lists."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from chload.api import LoadSpec
from chload.dispatch import begin_early
from chload.errors import SourceError
from chload.sources.base import SourceContext
from chload.sources.databases import early as db_early
from chload.sources.databases.postgres import PostgresSource

URL = "postgresql://loader@db:5432/shop/public.orders"
MY_URL = "mysql://loader@db:3306/shop/orders"


class _Session:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[_Session]:
    sessions: list[_Session] = []

    def session(self: PostgresSource, url: object, context: SourceContext) -> _Session:
        if context.select == "fail":
            raise SourceError("db:5432: refused")
        sessions.append(_Session())
        return sessions[-1]

    monkeypatch.setattr(PostgresSource, "_session", session)
    return sessions


class _Begun:
    """`db_early.begin` as a run calls it: through dispatch.begin_early, which finds the
    source (one PostgreSQL URL only)."""

    @staticmethod
    def begin(patterns: Sequence[str], select: str | None, incremental_by: str | None,
              workers: int | None) -> Callable[[], None]:
        return begin_early(LoadSpec(sources=tuple(patterns), table="t", query=select,
                                     incremental_by=incremental_by, workers=workers))


def _key(select: str | None = None, workers: int | None = 1) -> object:
    return db_early.key(SourceContext(select=select, workers=workers, pipes=True))


def test_the_run_with_the_same_options_takes_the_session(made: list[_Session]) -> None:
    cleanup = _Begun.begin([URL], None, None, 1)
    assert db_early.claim(URL, _key()) is made[0]
    cleanup()
    assert not made[0].closed  # the run's now: it closes it


def test_other_options_or_no_claim_close_it(made: list[_Session]) -> None:
    _Begun.begin([URL], None, None, 1)
    assert db_early.claim(URL, _key(workers=2)) is None and made[0].closed
    _Begun.begin([URL], None, None, 1)()  # the target did not open: nobody claimed it
    assert made[1].closed


def test_its_error_is_raised_by_the_claim(made: list[_Session]) -> None:
    _Begun.begin([URL.rsplit("/", 1)[0]], "fail", None, 1)
    with pytest.raises(SourceError, match="refused"):
        db_early.claim(URL.rsplit("/", 1)[0], _key("fail"))


def test_only_a_single_database_source_begins_early(made: list[_Session]) -> None:
    _Begun.begin(["data/*.csv"], None, None, 1)()
    _Begun.begin([URL, URL], None, None, 1)()
    _Begun.begin([MY_URL], None, None, 1)()  # MySQL: where the run lists (db_early)
    assert made == []


def test_two_runs_of_one_process_never_take_or_close_each_others(made: list[_Session]) -> None:
    first = _Begun.begin([URL], None, None, 1)
    second = _Begun.begin([URL], None, None, 1)  # one is in flight: this run makes its own
    assert len(made) == 1
    assert db_early.claim(URL, _key()) is made[0]  # the first run lists and takes it
    third = _Begun.begin([URL], None, None, 1)  # a third run, while the first goes on
    first()  # the first ends: the third's session is not its to close
    second()
    assert len(made) == 2 and not made[1].closed
    third()  # unclaimed: closed by its own run
    assert made[1].closed and not made[0].closed
