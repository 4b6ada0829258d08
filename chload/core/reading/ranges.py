"""Which dates and times each target engine's column types hold, and the checks a
database source runs so that a value outside them is refused, never changed.

An engine parsing such a value changes it without a word (18.16 stores a 1960 `Date`
as 0000-00-00; chDB clamps a 1960 `DateTime` to 1970-01-01). So a database source's own
query checks each column whose source type can hold what its target type cannot
(`guards`): without an error budget the range fails with one line naming the column,
the value, the type's range and the `--schema` to pass (`message`); with one, the value
is written as text no date parser takes (`SHOWN`), and the row goes to chload.rejects.
`ENGINES` holds the ranges of chDB and ClickHouse 18.16, found by each engine's text
parse; another server gets the narrowest of what older servers are documented to hold.
docs/sources-databases.md says more.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from chload.errors import SchemaError
from chload.schema import bare_type

CHDB = "chdb"
MARKER = "chload-out-of-range"  # begins what a PostgreSQL check makes its parser refuse
SHOWN = "out of range: "  # begins what a check writes for the engine to reject (a budget)
_END = " 23:59:59.999999"
_DAY = " 00:00:00"

# engine -> ClickHouse type family -> (first, last) value its text parse keeps as it is
# (inclusive; wall-clock text, compared as text or by the source's own date types)
ENGINES: dict[str, dict[str, tuple[str, str]]] = {
    # chDB 26.9: DateTime and Date clamp outside (1960 -> 1970-01-01); DateTime64 reads
    # year 0000 as the current year and refuses years after 9999 and BC
    CHDB: {"DateTime": ("1970-01-01 00:00:00", "2106-02-07 06:28:15"),
           "Date": ("1970-01-01" + _DAY, "2149-06-06" + _END),
           "DateTime64": ("0001-01-01" + _DAY, "9999-12-31" + _END),
           "Date32": ("0000-01-01" + _DAY, "9999-12-31" + _END)},
    # 18.16: its date table covers 1970 to 2105; outside, a DateTime keeps only the time
    # of day (1960-05-06 07:08:09 -> 1970-01-01 07:08:09) and a Date is 0000-00-00
    "18.16": {"DateTime": ("1970-01-01 00:00:00", "2105-12-31 23:59:59"),
              "Date": ("1970-01-01" + _DAY, "2105-12-31" + _END)},
}
# any other server: the narrowest known (DateTime64 and Date32 held 1900 to 2299 before)
_OTHER = {**ENGINES["18.16"], "DateTime64": ("1900-01-01" + _DAY, "2299-12-31" + _END),
          "Date32": ("1900-01-01" + _DAY, "2299-12-31" + _END)}
_WIDEST = ("0000-01-01" + _DAY, "9999-12-31" + _END)  # what a parse of 4-digit years reads


@dataclass(frozen=True, slots=True)
class Guard:
    """The check of one column: values outside [lo, hi] are not passed on as dates."""

    index: int  # the column's position in the range's SELECT
    name: str
    type: str  # the target's type that bounds it, as the table has it
    lo: str
    hi: str
    where: str  # the target, for the message ("ClickHouse 18.16.1", "chDB")
    wider: str  # a type of that target that holds more (suggested), or String
    rejects: bool  # a budget: write the value as text the engine rejects, don't fail


def bounds(typ: str, engine: str) -> tuple[str, str] | None:
    """(first, last) of `typ` on `engine`; None for a type no date range bounds."""
    family, scale = _family(typ)
    if family not in ("DateTime", "Date", "DateTime64", "Date32"):
        return None
    known = ENGINES.get(engine) or ENGINES.get(".".join(engine.split(".")[:2])) or _OTHER
    found = known.get(family)
    if found is None:  # a type this server does not have: CREATE refused it already
        return _WIDEST
    if family == "DateTime64" and scale > 7:  # Int64 of 10^-scale s: 1677-2262 at 9
        return _datetime64(scale, found)
    return found


def guards(columns: Sequence[tuple[str, str]], read: Sequence[str], stored: dict[str, str],
           engine: str, rejects: bool) -> dict[int, Guard]:
    """The checks a range's SELECT needs, by position. `columns`: (name, what the source
    column can hold: 'any' for a date or time of any year, infinities too (PostgreSQL),
    '4digit' for years 0000 to 9999 (MariaDB), '' for a column of another type); `read`:
    the type each is read as; `stored`: the table's own types by name. The range is
    the narrowest of the read type's (parsed by chDB) and the table's type's on the
    target."""
    found: dict[int, Guard] = {}
    for i, ((name, kind), read_type) in enumerate(zip(columns, read, strict=True)):
        table_type = stored.get(name, read_type)
        spans = [s for s in (bounds(read_type, CHDB), bounds(table_type, engine)) if s]
        if not kind or not spans:
            continue
        lo, hi = max(s[0] for s in spans), min(s[1] for s in spans)
        if kind == "4digit" and lo <= _WIDEST[0] and hi >= _WIDEST[1]:
            continue  # holds every value the source can
        shown = "chDB" if engine == CHDB else f"ClickHouse {engine or 'server'}"
        found[i] = Guard(i, name, bare_type(table_type), lo, hi, shown,
                         wider(table_type, engine), rejects)
    return found


def message(display: str, guard: Guard, value: str, hint: str) -> SchemaError:
    """The one line for a value outside its column's range (the range fails)."""
    lo, hi = (_shown(v, guard.type) for v in (guard.lo, guard.hi))
    return SchemaError(
        f"{display}: column {guard.name} holds {value!r}, which {guard.type} cannot hold "
        f"on {guard.where} (it holds {lo} to {hi}); pass --schema with {guard.name} as "
        f"{guard.wider} to load it, e.g. --schema {hint} (a table that exists keeps its own "
        f"type for {guard.name}: ALTER or drop it first), or --max-errors N to load the "
        "other rows and keep such rows in chload.rejects")


def message_many(display: str, found: Sequence[tuple[Guard, str]], hint: str) -> SchemaError:
    """The one line for values of several columns outside their ranges (the run stops
    before any range is read: DatabaseSource.stored)."""
    if len(found) == 1:
        return message(display, found[0][0], found[0][1], hint)
    held = "; ".join(held_text(g, v) for g, v in found)
    wider = ", ".join(f"{g.name} as {g.wider}" for g, _ in found)
    return SchemaError(
        f"{display}: {held}; pass --schema with {wider} to load them, e.g. --schema {hint} "
        "(a table that exists keeps its own types for them: ALTER or drop it first), or "
        "--max-errors N to load the other rows and keep such rows in chload.rejects")


def held_text(guard: Guard, value: str) -> str:
    """'column t holds '1960-...', which DateTime cannot hold on ... (it holds ...)'."""
    return (f"column {guard.name} holds {value!r}, which {guard.type} cannot hold on "
            f"{guard.where} (it holds {_shown(guard.lo, guard.type)} to "
            f"{_shown(guard.hi, guard.type)})")


def _family(typ: str) -> tuple[str, int]:
    typ = bare_type(typ)
    family = typ.split("(", 1)[0].strip()
    digits = re.match(r"DateTime64\((\d+)", typ)
    return family, int(digits.group(1)) if digits else 0


def _datetime64(scale: int, span: tuple[str, str]) -> tuple[str, str]:
    """DateTime64(7..9)'s range within `span`: an Int64 of 10^-scale seconds from 1970
    (1677-09-21 00:12:44 to 2262-04-11 23:47:16 at 9); the engine refuses outside."""
    from datetime import UTC, datetime, timedelta

    ticks = (2**63 - 1) // 10**scale
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    days = (epoch - datetime(1, 1, 1, tzinfo=UTC)).total_seconds()
    lo = span[0] if ticks >= days else (
        epoch - timedelta(seconds=ticks)).strftime("%Y-%m-%d %H:%M:%S")
    hi = (epoch + timedelta(seconds=ticks)).strftime("%Y-%m-%d %H:%M:%S")
    return max(lo, span[0]), min(hi, span[1])


def wider(typ: str, engine: str) -> str:
    """What to suggest: on chDB the 64-bit type of the family, else String."""
    family, _ = _family(typ)
    if engine == CHDB and family == "DateTime":
        return "DateTime64(0, 'UTC')"
    if engine == CHDB and family == "Date":
        return "Date32"
    return "String"


def _shown(value: str, typ: str) -> str:
    """A bound as the type shows it: a Date's day only; no fraction beyond the type's."""
    family, scale = _family(typ)
    if family in ("Date", "Date32"):
        return value[:10]
    if family == "DateTime" or scale == 0:
        return value[:19]
    return (value[:19] + "." + value[20:].ljust(scale, "0"))[:20 + scale]
