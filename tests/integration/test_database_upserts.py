"""Upserts (--upsert-key, --version): a PostgreSQL table loaded --incremental-by
updated_at into a ReplacingMergeTree chload creates, rows updated and inserted at the
source between runs, and `SELECT ... FINAL` equals the source; a table of another engine
or order, or a key the data lacks, refused in one line. The real `chload` against
PostgreSQL 15, into embedded chDB and an 18.16 server."""

from __future__ import annotations

import pytest
import services
from conftest import run_chload
from test_databases import Source

pytestmark = pytest.mark.integration

UPSERT = ("--incremental-by", "updated_at", "--upsert-key", "id", "--version", "updated_at")
CREATE = """CREATE TABLE {t} (id bigint PRIMARY KEY, v int NOT NULL,
    updated_at timestamp(0) NOT NULL);
INSERT INTO {t} SELECT g, g % 7, timestamp '2024-01-01' FROM generate_series(1, 500) g"""
CHANGE = """UPDATE {t} SET v = v + 100, updated_at = timestamp '2024-01-02' WHERE id % 50 = 0;
INSERT INTO {t} SELECT g, 3, timestamp '2024-01-02' FROM generate_series(501, 520) g"""
ROWS = "SELECT id, v, updated_at FROM {t} {final} ORDER BY id"


@pytest.fixture
def pg(postgres: services.Service) -> Source:
    return Source("postgresql", postgres)


@pytest.fixture(params=["embedded", "server"])
def into(request: pytest.FixtureRequest, target_dir: str) -> tuple[str, dict[str, str]]:
    """(--target, its environment): embedded chDB or the 18.16 server."""
    if request.param == "embedded":
        return target_dir, {}
    server = request.getfixturevalue("clickhouse")
    return (f"http://loader@127.0.0.1:{server.ports['http']}/default",
            {"CLICKHOUSE_PASSWORD": server.credentials["password"]})


def _load(pg: Source, table: str, into: tuple[str, dict[str, str]], *args: str
          ) -> tuple[int, str, str]:
    done = run_chload("load", pg.url(table), "--table", table, "--target", into[0], *args,
                      env={**pg.env, **into[1]}, timeout=180)
    return done.returncode, done.stdout, done.stderr


def _ch(into: tuple[str, dict[str, str]], sql: str) -> str:
    done = run_chload("sql", sql, "--target", into[0], "--format", "TSV", env=into[1],
                      timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_updated_and_new_rows_upserted_final_equals_the_source(
        pg: Source, into: tuple[str, dict[str, str]], table_name: str) -> None:
    pg.sql(CREATE.format(t=table_name))
    code, out, err = _load(pg, table_name, into, *UPSERT)
    assert code == 0, err
    engine = _ch(into, f"SELECT engine_full FROM system.tables WHERE name = '{table_name}'")
    assert engine.startswith("ReplacingMergeTree(updated_at) ORDER BY id"), engine
    pg.sql(CHANGE.format(t=table_name))
    code, out, err = _load(pg, table_name, into, *UPSERT)
    assert code == 0, err
    assert "30 rows" in out, out  # (10 updated, 20 new: the rows past the last loaded)
    source = pg.sql(ROWS.format(t=table_name, final=""))
    assert _ch(into, ROWS.format(t=table_name, final="FINAL")) == source.strip()
    assert _ch(into, f"SELECT count() FROM {table_name}") in ("520", "530")


def test_an_existing_merge_tree_is_refused_in_one_line(
        pg: Source, target_dir: str, table_name: str) -> None:
    pg.sql(CREATE.format(t=table_name))
    into = (target_dir, {})
    code, _, err = _load(pg, table_name, into, "--incremental-by", "updated_at")
    assert code == 0, err
    code, _, err = _load(pg, table_name, into, *UPSERT)
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert f"chload: table default.{table_name}: --upsert-key needs default.{table_name} to " \
        "be ENGINE = ReplacingMergeTree(`updated_at`) ORDER BY `id`, but it is MergeTree" \
        in err, err
    assert _ch(into, f"SELECT count() FROM {table_name}") == "500"


@pytest.mark.parametrize("flags, named", [(("--upsert-key", "ident"), "--upsert-key column "
                                           "ident"),
                                          (("--upsert-key", "id", "--version", "changed"),
                                           "--version column changed")])
def test_a_key_or_version_the_data_lacks_is_named(
        pg: Source, target_dir: str, table_name: str, flags: tuple[str, ...],
        named: str) -> None:
    pg.sql(CREATE.format(t=table_name))
    code, _, err = _load(pg, table_name, (target_dir, {}), *flags)
    assert code == 2, err
    assert err.count("\n") == 1 and named in err and "is not in the data" in err, err
