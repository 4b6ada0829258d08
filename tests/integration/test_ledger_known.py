"""The ledger's compact keys (Ledger.known), as the engine computes them: on the embedded
engine and on a real 18.16 server, the same keys Python computes, the same rules as
own_history (a table dropped, re-created or truncated is loaded again), in slices; read
from the ledger's summary only while it sums to the ledger (rebuilt when it does not, made
and filled for a ledger made before it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import target_spec

from chload.commit import known as known_module, ledger as ledger_module, tables as tables_module
from chload.commit.known import KnownUnits
from chload.commit.ledger import COMMITTING, FAILED, LOADED, FileEvent, own_history
from chload.commit.locks import dirty_name
from chload.commit.request import _start_sql
from chload.targets.base import Target
from chload.targets.registry import open_target

pytestmark = pytest.mark.integration


@pytest.fixture(params=["embedded", "server"])
def target(request: pytest.FixtureRequest, tmp_path: Path, table_name: str,
           ) -> Iterator[Target]:
    t = open_target(target_spec(request, request.param, tmp_path))
    for name in (table_name, f"{table_name}_2"):  # (as the user's SQL: not a fresh target)
        t.text(f"CREATE TABLE default.{name} (x UInt8) ENGINE = MergeTree ORDER BY x", "TSV")
        t.command(f"INSERT INTO default.{name} VALUES (1)")
    yield t
    for name in (table_name, f"{table_name}_2"):
        t.command(f"DROP TABLE IF EXISTS default.{name}")
    t.close()


def _event(table: str, uri: str, identity: str, state: str, uuid: str, seq: int) -> FileEvent:
    return FileEvent(table, uri, identity, 1, 1, state, rows=2, table_uuid=uuid, seq=seq)


def test_known_keys_are_the_ledgers_loaded_units_of_the_table_as_it_is(
        target: Target, table_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables_module, "KNOWN_SLICE", 3)  # 12 units: 4 slices
    table = f"default.{table_name}"
    state = target.ledger.table_state("default", table_name)
    events = [_event(table, f"/d/{i}.csv", f"{i}:1", LOADED, state.uuid, 100 + i)
              for i in range(12)]
    events += [_event(table, "/d/0.csv", "0:9", FAILED, state.uuid, 200),  # a failed reload
               _event(table, "/d/1.csv", "1:9", LOADED, state.uuid, 201),  # loaded again
               _event(table, "/d/new.csv", "5:5", COMMITTING, state.uuid, 202),
               _event(f"{table}_2", "/d/2.csv", "2:1", LOADED, state.uuid, 203)]
    target.ledger.record(events)

    known, why = target.ledger.known(table, state)
    own, _ = own_history(state, target.ledger.loaded(table))
    assert (len(known), why) == (12, "") and len(own) == 12
    assert list(known.uris) == sorted(known.uris) == list(KnownUnits.of_events(own).uris)
    for uri, event in own.items():
        i = known.find([uri])
        assert i >= 0 and known.same_identity(i, event.identity), uri
    assert known.same_identity(known.find(["/d/0.csv"]), "0:1")  # the failed reload: not
    assert known.same_identity(known.find(["/d/1.csv"]), "1:9")  # the latest load
    assert known.find(["/d/new.csv"]) == known.find(["/d/12.csv"]) == -1
    assert known.find(["/elsewhere", "/d/3.csv"]) == known.find(["/d/3.csv"])  # an alias
    assert known.events(["/d/1.csv", "/d/x.csv"])["/d/1.csv"].identity == "1:9"
    assert known.meet(0) and not known.meet(0)  # a second spelling of one unit


def test_known_keys_set_aside_loads_of_a_table_dropped_recreated_or_emptied(
        target: Target, table_name: str) -> None:
    table = f"default.{table_name}"
    state = target.ledger.table_state("default", table_name)
    assert target.ledger.known(table, state) == (KnownUnits(), "")  # nothing loaded yet
    target.ledger.record([_event(table, "/d/a.csv", "1:1", LOADED, "another-table", 1)])
    assert target.ledger.known(table, state)[1] == ledger_module.RECREATED
    target.ledger.record([_event(table, "/d/b.csv", "1:1", LOADED, state.uuid, 2)])
    known, why = target.ledger.known(table, state)
    assert (len(known), why) == (1, "")
    dropped = ledger_module.TableState(False)
    assert target.ledger.known(table, dropped) == (KnownUnits(), ledger_module.DROPPED)
    target.command(f"TRUNCATE TABLE {table}")
    emptied = target.ledger.table_state("default", table_name)
    assert target.ledger.known(table, emptied) == (KnownUnits(), ledger_module.TRUNCATED)


@pytest.mark.parametrize("kind", ["embedded", "server"])
def test_a_ledger_made_before_its_keys_gets_them_on_first_use(
        request: pytest.FixtureRequest, kind: str, tmp_path: Path, table_name: str) -> None:
    spec = target_spec(request, kind, tmp_path)
    table = f"default.{table_name}"
    older = open_target(spec)
    try:  # the ledger as chload made it before the keys: events written without them
        for column in tables_module.KEY_COLUMNS:
            older.command(f"ALTER TABLE chload.files DROP COLUMN {column}")
        older.text(f"CREATE TABLE {table} (x UInt8) ENGINE = MergeTree ORDER BY x", "TSV")
        older.command(f"INSERT INTO {table} VALUES (1)")
        state = older.ledger.table_state("default", table_name)
        older.ledger.record([_event(table, f"/old/{i}.csv", f"{i}:1", LOADED, state.uuid, i + 1)
                             for i in range(5)])
        assert not older.ledger.complete()
    finally:
        older.close()
    t = open_target(spec)  # first use: the keys are added
    try:
        assert t.ledger.complete()
        t.ledger.record([_event(table, "/new/a.csv", "9:9", LOADED, state.uuid, 10)])
        _knows_old_and_new(t, table, table_name)
    finally:
        t.command(f"DROP TABLE IF EXISTS {table}")
        t.close()


def _knows_old_and_new(t: Target, table: str, table_name: str) -> None:
    """The ledger knows the five /old files written before the upgrade and /new/a.csv."""
    known, why = t.ledger.known(table, t.ledger.table_state("default", table_name))
    assert (len(known), why) == (6, "")
    for uri, identity in [*((f"/old/{i}.csv", f"{i}:1") for i in range(5)),
                          ("/new/a.csv", "9:9")]:
        assert known.same_identity(known.find([uri]), identity), uri


def _first_look_says_committing(target: Target, table: str) -> bool:
    """Whether the committer's first look (request._start_sql) asks for a recovery."""
    return any(r["k"] == "committing"
               for r in target.rows(_start_sql(dirty_name(table), table)))


def _summed(target: Target, table: str) -> bool:
    rows = {r["s"]: r for r in target.rows(known_module.summary_check("chload", f"'{table}'"))}
    return all(str(rows["files"][k]) == str(rows["units"][k]) for k in ("n", "loaded", "h"))


def test_the_summary_left_short_or_doubled_is_not_trusted_and_is_rebuilt(
        target: Target, table_name: str) -> None:
    table = f"default.{table_name}"
    state = target.ledger.table_state("default", table_name)
    target.ledger.record([_event(table, f"/s/{i}.csv", f"{i}:1", LOADED, state.uuid, i + 1)
                          for i in range(4)])
    assert _summed(target, table) and not _first_look_says_committing(target, table)
    # an event the view left out (a process killed between the ledger's part and the
    # summary's): the first look asks for a recovery, the planner's read rebuilds
    target.command(f"DROP TABLE chload.{known_module.FEED}")
    target.ledger.record([_event(table, "/s/late.csv", "7:7", LOADED, state.uuid, 50)])
    for statement in known_module.summary_statements("chload"):
        target.command(statement)
    assert not _summed(target, table) and _first_look_says_committing(target, table)
    known, why = target.ledger.known(table, state)
    assert (len(known), why) == (5, "")
    assert known.same_identity(known.find(["/s/late.csv"]), "7:7")
    assert _summed(target, table) and not _first_look_says_committing(target, table)
    # an event twice in the summary (a rebuild racing a write): not trusted either
    target.command(f"INSERT INTO chload.{known_module.SUMMARY} SELECT * FROM chload."
                   f"{known_module.SUMMARY} WHERE target_table = '{table}' LIMIT 1")
    assert not _summed(target, table) and _first_look_says_committing(target, table)
    known, _ = target.ledger.known(table, state)
    assert len(known) == 5 and _summed(target, table)


def test_a_file_committing_in_the_summary_asks_for_a_recovery(target: Target,
                                                               table_name: str) -> None:
    table = f"default.{table_name}"
    state = target.ledger.table_state("default", table_name)
    target.ledger.record([_event(table, "/c/a.csv", "1:1", COMMITTING, state.uuid, 1),
                          _event(table, "/c/a.csv", "1:1", LOADED, state.uuid, 2),
                          _event(table, "/c/b.csv", "1:1", LOADED, state.uuid, 3)])
    assert not _first_look_says_committing(target, table)
    target.ledger.record([_event(table, "/c/b.csv", "2:2", COMMITTING, state.uuid, 4)])
    assert _first_look_says_committing(target, table)


@pytest.mark.parametrize("kind", ["embedded", "server"])
def test_a_ledger_made_before_its_summary_gets_it_with_its_events_on_first_use(
        request: pytest.FixtureRequest, kind: str, tmp_path: Path, table_name: str) -> None:
    spec = target_spec(request, kind, tmp_path)
    table = f"default.{table_name}"
    older = open_target(spec)
    try:  # the ledger as chload made it before its summary
        older.command(f"DROP TABLE chload.{known_module.FEED}")
        older.command(f"DROP TABLE chload.{known_module.SUMMARY}")
        older.text(f"CREATE TABLE {table} (x UInt8) ENGINE = MergeTree ORDER BY x", "TSV")
        older.command(f"INSERT INTO {table} VALUES (1)")
        state = older.ledger.table_state("default", table_name)
        older.ledger.record([_event(table, f"/old/{i}.csv", f"{i}:1", LOADED, state.uuid, i + 1)
                             for i in range(5)]
                            + [_event(table, "/old/0.csv", "0:1", COMMITTING, state.uuid, 0)])
        assert not older.ledger.complete()
    finally:
        older.close()
    t = open_target(spec)  # first use: the summary, filled
    try:
        assert t.ledger.complete() and _summed(t, table)
        assert not _first_look_says_committing(t, table)
        t.ledger.record([_event(table, "/new/a.csv", "9:9", LOADED, state.uuid, 10)])
        assert _summed(t, table)
        _knows_old_and_new(t, table, table_name)
    finally:
        t.command(f"DROP TABLE IF EXISTS {table}")
        t.close()
