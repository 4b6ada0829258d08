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


def test_into_a_cluster_each_shards_local_table_must_be_an_upsert_table(
        pg: Source, weighted_cluster: services.ClickHouseCluster, table_name: str) -> None:
    """A shard whose local table is a MergeTree stops the load in one line naming it;
    once every local table is a ReplacingMergeTree, FINAL through the Distributed table
    equals the source after an update."""
    pg.sql(CREATE.format(t=table_name))
    servers, local = weighted_cluster.servers, f"default.{table_name}_local"
    schema = "id Int64, v Int32, updated_at DateTime"
    for i, server in enumerate(servers):
        engine = "MergeTree" if i == len(servers) - 1 else "ReplacingMergeTree(updated_at)"
        services.clickhouse_query(server, f"CREATE TABLE {local} ({schema}) ENGINE = "
                                          f"{engine} ORDER BY id")
    services.clickhouse_query(servers[0], (
        f"CREATE TABLE default.{table_name} AS {local} ENGINE = "
        f"Distributed({weighted_cluster.name}, default, {table_name}_local, id)"))
    into = (f"{servers[0].url}/default", {})
    shards = [a for s in servers for a in ("--shard", f"{s.endpoint}={s.url}")]
    code, _, err = _load(pg, table_name, into, *UPSERT, *shards)
    assert code == 2 and err.count("\n") == 1, err
    assert f"needs {local} on " in err and "but it is MergeTree ORDER BY id" in err, err
    services.clickhouse_query(servers[-1], f"DROP TABLE {local}")
    services.clickhouse_query(servers[-1], f"CREATE TABLE {local} ({schema}) ENGINE = "
                                           "ReplacingMergeTree(updated_at) ORDER BY id")
    for change in (CHANGE, ""):
        code, out, err = _load(pg, table_name, into, *UPSERT, *shards)
        assert code == 0, err
        if change:
            pg.sql(change.format(t=table_name))
    assert "30 rows" in out, out
    source = pg.sql(ROWS.format(t=table_name, final=""))
    final = services.clickhouse_query(servers[0], ROWS.format(t=f"default.{table_name}",
                                                              final="FINAL"))
    assert final.strip() == source.strip()
