"""Database sources without a database: URLs (the password kept out), and the rule that
makes reruns exactly once: the ranges still to load are the complement of the committed
ones."""

from __future__ import annotations

import pytest

from chload.errors import UsageError
from chload.sources.databases.plan import missing_ranges, parse_range, plan_units, split_range
from chload.sources.databases.session import Range, range_predicate
from chload.sources.databases.table import TableInfo, parse_url, redact


def test_url_parts_and_no_password_in_display() -> None:
    url = parse_url("postgresql://loader:s3cret@db:5433/shop/sales.orders", None)
    assert (url.host, url.port, url.database, url.schema, url.table) == (
        "db", 5433, "shop", "sales", "orders")
    assert url.password == "s3cret"
    assert "s3cret" not in url.display + url.with_user + repr(url)
    my = parse_url("mariadb://loader@db/shop/orders", None)
    assert (my.kind, my.port, my.schema, my.display) == ("mysql", 3306, "shop",
                                                         "mysql://db:3306/shop/orders")
    assert redact("mysql://u:pw@h:1/d/t") == "mysql://u@h:1/d/t"


def test_url_needs_a_table_or_a_query_not_both() -> None:
    with pytest.raises(UsageError, match="not both") as caught:
        parse_url("postgresql://u:pw@h/shop", None)
    assert "pw" not in str(caught.value)
    with pytest.raises(UsageError):
        parse_url("postgresql://u@h/shop/t", "SELECT 1")
    assert parse_url("postgresql://u@h/shop", "SELECT 1").table == ""


def test_the_complement_of_committed_ranges() -> None:
    assert missing_ranges([], "100", int) == [Range(None, "100")]
    done = [Range(None, "10"), Range("20", "30")]
    assert missing_ranges(done, "100", int) == [Range("10", "20"), Range("30", "100")]
    assert missing_ranges([Range(None, "100")], "100", int) == []
    assert missing_ranges([Range(None, "100")], "150", int) == [Range("100", "150")]
    assert missing_ranges([Range("5", "50"), Range(None, "10")], "40", int) == []
    times = [Range(None, "2024-01-01 00:00:00.000000")]
    assert missing_ranges(times, "2024-02-01 00:00:00.000000", str) == [
        Range("2024-01-01 00:00:00.000000", "2024-02-01 00:00:00.000000")]


def test_split_keeps_the_open_lower_end_and_covers_the_range() -> None:
    pieces = split_range(Range(None, "100"), 0, 25)
    assert pieces[0].lo is None and pieces[-1].hi == "100"
    assert all(a.hi == b.lo for a, b in zip(pieces, pieces[1:], strict=False))
    assert split_range(Range("100", "110"), 0, 25) == [Range("100", "110")]


def test_uri_ranges_read_back() -> None:
    prefix = "postgresql://db:5432/shop/public.orders"
    assert parse_range(f"{prefix}#id(,100]", prefix) == ("id", Range(None, "100"))
    assert parse_range(f"{prefix}#id(100,200]", prefix) == ("id", Range("100", "200"))
    assert parse_range(f"{prefix}#all", prefix) is None
    assert parse_range("postgresql://db:5432/shop/public.other#id(,1]", prefix) is None


def test_debian_psql_wrapper_is_skipped_for_the_newest_client(tmp_path, monkeypatch) -> None:
    """pg_wrapper (a Perl start per psql) is replaced by the newest installed psql, as the
    wrapper itself picks with -h; any other psql is run as found."""
    from chload.sources.databases import postgres_psql as postgres

    lib = tmp_path / "lib"
    for version in ("9.6", "13", "15", "notes"):
        (lib / version / "bin").mkdir(parents=True)
        (lib / version / "bin" / "psql").write_text("#!/bin/sh\n")
        (lib / version / "bin" / "psql").chmod(0o755)
    wrapper = tmp_path / "pg_wrapper"
    wrapper.write_text("#!/usr/bin/perl\n")
    (tmp_path / "psql").symlink_to(wrapper)
    monkeypatch.setattr(postgres, "_PG_LIB", str(lib))
    assert postgres._unwrapped(str(tmp_path / "psql")) == str(lib / "15" / "bin" / "psql")

    env = postgres.client_env(parse_url("postgresql://u@h/db/t", None),
                              str(lib / "15" / "bin" / "psql"))
    assert env["PGSYSCONFDIR"]  # what the wrapper would have set
    plain = tmp_path / "plain-psql"
    plain.write_text("#!/bin/sh\n")
    assert postgres._unwrapped(str(plain)) == str(plain)
    monkeypatch.setattr(postgres, "_PG_LIB", str(tmp_path / "none"))
    assert postgres._unwrapped(str(tmp_path / "psql")) == str(tmp_path / "psql")


class Ranges:
    """A session for plan_units: an integer key 1..100 in the snapshot."""

    url = type("U", (), {"display": "postgresql://h:1/d/s.t", "table": "t"})()
    info = TableInfo([], ["id"], "id")
    snapshot = "snap"

    def __init__(self, in_snapshot: bool = True) -> None:
        self.bounds_in_snapshot = in_snapshot

    def bounds(self, axis: str) -> tuple[str | None, str | None, int]:
        return "1", "100", 100

    def predicate(self, axis: str, r: Range) -> str:
        return range_predicate(axis, r, str)


def test_the_last_range_is_read_without_the_snapshots_max() -> None:
    """`id <= max` costs the database a test per row and excludes nothing in the
    snapshot: the range ending at the max is read without it (its uri keeps it)."""
    units = plan_units(Ranges(), "postgres", [], 2, False, False)  # type: ignore[arg-type]
    assert [u.uri.split("#")[1] for u in units] == ["id(,50]", "id(50,100]"]
    assert [u.location for u in units] == ["id <= 50", "id > 50"]
    one = plan_units(Ranges(), "postgres", [], 1, False, False)  # type: ignore[arg-type]
    assert [u.location for u in one] == ["id IS NOT NULL"]  # NULL is in no range
    kept = plan_units(Ranges(in_snapshot=False), "postgres", [], 1, False,  # type: ignore[arg-type]
                      False)
    assert [u.location for u in kept] == ["id <= 100"]
    done = [("postgresql://h:1/d/s.t#id(,60]", "upto 80; snapshot old")]
    rerun = plan_units(Ranges(), "postgres", done, 1, False, False)  # type: ignore[arg-type]
    assert [u.location for u in rerun] == ["id > 60 AND id <= 80"]  # a copy's own upper
