"""--mode replace-partitions in the committer's statements (commit/attach.py): which
partition a commit replaces, attaches or drops, within a run and across runs, and how a
logged replace is settled after a crash. Against a scripted fake; the real engines, with
real kills, are in tests/integration/test_modes.py."""

from __future__ import annotations

import re

from chload.commit.attach import Attacher
from chload.commit.ledger import FileEvent
from chload.commit.locks import Holder

TABLE = "`db`.`t`"


class FakeSql:
    """Statements run, and each table's highest block per partition (block_tops)."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.tops: dict[str, dict[str, int]] = {TABLE: {}}

    def command(self, sql: str, query_id: str = "") -> None:
        self.statements.append(re.sub(r" FROM chload\.\w+", "", sql.replace(TABLE, "t")))

    def rows(self, sql: str) -> list[dict]:
        assert sql.startswith("SELECT database, table, partition_id"), sql
        out = []
        for name, parts in self.tops.items():
            database, _, table = name.replace("`", "").partition(".")
            if f"table = '{table}'" in sql:
                out += [{"database": database, "table": table, "partition_id": p, "top": top}
                        for p, top in parts.items()]
        return out


class FakeLedger:
    def __init__(self) -> None:
        self.events: list[FileEvent] = []

    def record(self, events: list[FileEvent], mark_of: object = None) -> None:
        self.events += events


def _commit(attacher: Attacher, sql: FakeSql, stage: str, partitions: list[str]) -> str:
    sql.tops[f"chload.{stage}"] = dict.fromkeys(partitions, 1)
    sql.statements.clear()
    event = FileEvent("db.t", f"/{stage}.csv", "i", 1, 1, "")
    attacher.attach_new(TABLE, stage, None, [event])
    return event.replaced


def _attacher() -> tuple[Attacher, FakeSql]:
    sql = FakeSql()
    return Attacher(sql, FakeLedger(), Holder.this_process(), True,  # type: ignore[arg-type]
                    lambda s: None), sql


def test_the_first_commit_of_a_run_replaces_a_partition_and_later_ones_add_to_it() -> None:
    attacher, sql = _attacher()
    attacher.use_mode(TABLE, True, "run1")
    assert _commit(attacher, sql, "a", ["p1", "p2"]) == "p1,p2"
    assert sql.statements == ["ALTER TABLE t REPLACE PARTITION ID 'p1'",
                              "ALTER TABLE t REPLACE PARTITION ID 'p2'"]
    assert _commit(attacher, sql, "b", ["p2", "p3"]) == "p3"
    assert sql.statements == ["ALTER TABLE t ATTACH PARTITION ID 'p2'",
                              "ALTER TABLE t REPLACE PARTITION ID 'p3'"]
    attacher.use_mode(TABLE, True, "run1")  # the same run: p2 stays replaced
    assert _commit(attacher, sql, "c", ["p2"]) == ""
    attacher.use_mode(TABLE, True, "run2")  # a new run replaces again
    assert _commit(attacher, sql, "d", ["p2"]) == "p2"
    assert sql.statements == ["ALTER TABLE t REPLACE PARTITION ID 'p2'"]


def test_append_attaches_every_partition() -> None:
    attacher, sql = _attacher()
    attacher.use_mode(TABLE, True, "run1")
    attacher.use_mode(TABLE, False, "run2")
    assert _commit(attacher, sql, "a", ["p1"]) == ""
    assert sql.statements == ["ALTER TABLE t ATTACH PARTITION ID 'p1'"]


def test_a_partition_another_shard_holds_is_dropped_where_the_stage_has_none() -> None:
    attacher, sql = _attacher()
    attacher.use_mode(TABLE, True, "run1")
    attacher.covers["a"] = ["p1", "p9"]
    assert _commit(attacher, sql, "a", ["p1"]) == "p1,p9"
    assert sql.statements == ["ALTER TABLE t REPLACE PARTITION ID 'p1'",
                              "ALTER TABLE t DROP PARTITION ID 'p9'"]


def test_settling_replaces_only_the_partitions_not_done_by_the_mark() -> None:
    attacher, sql = _attacher()
    sql.tops[TABLE] = {"p1": 12, "p5": 4}  # p1 replaced after the mark (10), p5 not
    sql.tops["chload.s"] = {"p1": 1, "p5": 1}
    event = FileEvent("db.t", "/a.csv", "i", 1, 1, "committing", stage="s", mark=10,
                      replaced="p1,p5,p7")
    attacher.settle(TABLE, event)
    assert sql.statements == ["ALTER TABLE t REPLACE PARTITION ID 'p5'",
                              "ALTER TABLE t DROP PARTITION ID 'p7'"]


def test_a_mode_is_checked_when_the_load_is_asked() -> None:
    import pytest

    from chload.api import LoadSpec
    from chload.errors import UsageError

    with pytest.raises(UsageError, match="--mode merge: use append, replace-partitions, "
                                         "replace-table"):
        LoadSpec(("a.csv",), "t", mode="merge")
    with pytest.raises(UsageError, match="--mode replace-table with --follow"):
        LoadSpec(("dir/",), "t", mode="replace-table", follow=True)
    with pytest.raises(UsageError, match="Kafka topic"):
        LoadSpec(("kafka://127.0.0.1:9092/topic",), "t", mode="replace-partitions")
    assert LoadSpec(("a.csv",), "t", mode="replace-partitions").mode == "replace-partitions"


def test_an_engine_that_moves_takes_the_stage_partition_and_still_replaces_by_copy() -> None:
    sql = FakeSql()
    attacher = Attacher(sql, FakeLedger(), Holder.this_process(), True,  # type: ignore[arg-type]
                        lambda s: None, moves=True)
    assert _commit(attacher, sql, "a", ["p1", "p2"]) == ""
    assert sql.statements == ["ALTER TABLE chload.a MOVE PARTITION ID 'p1' TO TABLE t",
                              "ALTER TABLE chload.a MOVE PARTITION ID 'p2' TO TABLE t"]
    attacher.use_mode(TABLE, True, "run1")
    assert _commit(attacher, sql, "b", ["p1"]) == "p1"
    assert sql.statements == ["ALTER TABLE t REPLACE PARTITION ID 'p1'"]


def test_a_moved_partition_is_settled_as_attached_and_one_not_moved_is_moved() -> None:
    sql = FakeSql()
    attacher = Attacher(sql, FakeLedger(), Holder.this_process(), True,  # type: ignore[arg-type]
                        lambda s: None, moves=True)
    event = FileEvent("db.t", "/a.csv", "i", 1, 1, "", stage="a", mark=5)
    sql.tops[TABLE] = {"p1": 6}  # p1 moved before the crash: above the mark, the stage
    sql.tops["chload.a"] = {"p2": 1}  # without it; p2 still in the stage
    attacher.settle(TABLE, event)
    assert sql.statements == ["ALTER TABLE chload.a MOVE PARTITION ID 'p2' TO TABLE t"]
