"""A poll of `--follow` costs what is new: the keys of the units a table holds are kept
from poll to poll (core/follow.py `Known`), asked of the ledger whole once and then only
since the previous ask, and asked whole again when the table is not as it was. A scripted
ledger counts what each poll asks and how many keys it answers."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence

from chload.commit.known import KnownUnits, key
from chload.commit.ledger import FileEvent, TableState
from chload.core import follow
from chload.core.run import LOADED_ELSEWHERE, FileResult

TABLE = "default.t"
STATE = TableState(True, "u-1", 10)


def _pairs(units: Mapping[str, str]) -> array:
    pairs = sorted((key(uri), key(identity)) for uri, identity in units.items())
    return array("Q", [k for pair in pairs for k in pair])


class ScriptedLedger:
    """The ledger as it holds `units` (uri -> identity; `since`: those loaded after the
    time given, by whom); each question logged with what it answered."""

    def __init__(self) -> None:
        self.units: dict[str, str] = {}
        self.recent: list[tuple[int, str, str, str]] = []  # (seq, run, uri, identity)
        self.asked: list[tuple[str, int]] = []  # (question, keys answered)
        self.since: list[tuple[int, int]] = []  # loaded_since's (since_ns, own_since_ns)
        self.cluster = False

    def load(self, seq: int, run: str, uri: str, identity: str = "i1") -> None:
        self.units[uri] = identity
        self.recent.append((seq, run, uri, identity))

    def known(self, target_table: str, table: TableState) -> tuple[KnownUnits, str]:
        self.asked.append(("whole", len(self.units)))
        if not self.units:
            return KnownUnits(), ""  # (as the ledger's: no events to ask)
        pairs = _pairs(self.units)
        known = KnownUnits(pairs[0::2], pairs[1::2])
        known.events = self.events
        return known, ""

    def loaded_since(self, target_table: str, table: TableState, since_ns: int,
                     own_run: str, own_since_ns: int) -> array | None:
        if self.cluster:
            return None
        self.since.append((since_ns, own_since_ns))
        latest = {uri: (seq, run, identity) for seq, run, uri, identity in sorted(self.recent)}
        new = {uri: identity for uri, (seq, run, identity) in latest.items()
               if seq > since_ns and (seq > own_since_ns or run != own_run)}
        self.asked.append(("since", len(new)))
        return _pairs(new)

    def last_loaded(self, target_table: str, table: TableState, prefix: str) -> str:
        self.asked.append(("last", 1))
        return max((u for u in self.units if u.startswith(prefix)), default="")

    def loaded_of(self, target_table: str, uris: Sequence[str]) -> dict[str, FileEvent]:
        return self.events(uris)

    def events(self, uris: Sequence[str]) -> dict[str, FileEvent]:
        self.asked.append(("events", len(uris)))
        return {u: FileEvent(TABLE, u, self.units[u], 1, 1, "loaded") for u in uris
                if u in self.units}


def _known(ledger: ScriptedLedger) -> follow.Known:
    return follow.Known(ledger, TABLE, "run-1")  # type: ignore[arg-type]


def _holds(known: KnownUnits, uri: str, identity: str) -> bool:
    i = known.find([uri])
    return i >= 0 and known.same_identity(i, identity)


def test_a_poll_after_many_known_units_asks_only_for_the_new_ones() -> None:
    ledger = ScriptedLedger()
    for n in range(1000):
        ledger.load(n, "before", f"s3://b/p/{n:05d}.csv")
    kept = _known(ledger)
    first, _ = kept(STATE)
    assert ledger.asked == [("whole", 1000)] and len(first) == 1000
    asked_ns = kept.asked_ns
    ledger.load(asked_ns + 1, "run-1", "s3://b/p/new.csv")  # this run's poll loaded it
    ledger.load(asked_ns + 2, "other", "s3://b/p/00007.csv", "i2")  # another run: again
    second, why = kept(STATE)
    assert why == "" and ledger.asked[1:] == [("since", 2)]
    assert ledger.since == [(asked_ns - follow.LATE_NS, asked_ns)]
    assert len(second) == 1001 and list(second.uris) == sorted(second.uris)
    assert _holds(second, "s3://b/p/new.csv", "i1")
    assert _holds(second, "s3://b/p/00007.csv", "i2")  # the identity moved on
    assert _holds(second, "s3://b/p/00999.csv", "i1")
    third, _ = kept(STATE)  # nothing new: this run's own loads are not asked again
    assert ledger.asked[2:] == [("since", 1)]  # (another run's: its late window)
    assert len(third) == 1001


def test_a_table_not_as_it_was_is_asked_whole_again() -> None:
    ledger = ScriptedLedger()
    ledger.load(1, "before", "s3://b/a.csv")
    kept = _known(ledger)
    kept(TableState(False))  # not made yet
    kept(TableState(True, "u-1", 5))  # made since: every load into it came after
    assert [q for q, _ in ledger.asked] == ["whole", "since"]
    for state in (TableState(True, "u-2", 5),  # re-created
                  TableState(True, "u-2", 0),  # emptied
                  TableState(False)):  # dropped
        kept(state)
    assert [q for q, _ in ledger.asked][2:] == ["whole", "whole", "whole"]


def test_many_keys_since_or_a_ledger_that_cannot_say_are_asked_whole() -> None:
    ledger = ScriptedLedger()
    kept = _known(ledger)
    kept(STATE)
    for n in range(follow.MERGED_MOST + 1):
        ledger.load(kept.asked_ns + 1 + n, "other", f"s3://b/{n}.csv")
    known, _ = kept(STATE)
    assert [q for q, _ in ledger.asked] == ["whole", "since", "whole"]
    assert len(known) == follow.MERGED_MOST + 1
    ledger.cluster = True  # (a cluster's shards each keep their own)
    kept(STATE)
    assert [q for q, _ in ledger.asked][3:] == ["whole"]


def test_the_last_key_is_asked_once_and_moved_on_by_the_runs_loads() -> None:
    ledger = ScriptedLedger()
    ledger.load(1, "before", "s3://b/p/0001.csv")
    kept = _known(ledger)
    kept(STATE)
    assert kept.last_loaded("s3://b/p/") == "s3://b/p/0001.csv"
    kept.learn([FileResult("s3://b/p/0003.csv", "loaded"),
                FileResult("s3://b/p/0009.csv", "failed"),
                FileResult("s3://b/q/0005.csv", "loaded")])
    assert kept.last_loaded("s3://b/p/") == "s3://b/p/0003.csv"
    assert [q for q, _ in ledger.asked].count("last") == 1
    kept(TableState(True, "u-9", 1))  # asked whole: the last key too
    kept.last_loaded("s3://b/p/")
    assert [q for q, _ in ledger.asked].count("last") == 2


def test_a_unit_the_committer_found_taken_is_learned_by_its_uri() -> None:
    """Another run's unit committed while a poll ran (after its ask): the committer
    attached nothing (loaded elsewhere), and the keys learn it by its uri."""
    ledger = ScriptedLedger()
    kept = _known(ledger)
    kept(STATE)
    ledger.units["s3://b/late.csv"] = "i1"  # (its event written with an old time)
    kept.learn([FileResult("s3://b/late.csv", "skipped", note=LOADED_ELSEWHERE),
                FileResult("s3://b/mine.csv", "loaded")])
    assert ledger.asked[-1] == ("events", 1)
    assert _holds(kept(STATE)[0], "s3://b/late.csv", "i1")


def test_a_unit_merged_after_an_empty_first_ask_has_its_event_asked_of_the_ledger() -> None:
    """A file loaded by the run's first poll into a new table and changed since is found
    changed (its earlier load asked of the ledger), not taken for a new file."""
    ledger = ScriptedLedger()
    kept = _known(ledger)
    kept(TableState(False))
    ledger.load(kept.asked_ns + 1, "run-1", "/in/a.csv")
    known, _ = kept(STATE)
    assert known.find(["/in/a.csv"]) >= 0 and not known.same_identity(0, "i2")
    assert known.events(["/in/a.csv"])["/in/a.csv"].identity == "i1"
