"""A run that fails before its first unit loads leaves nothing on disk: no embedded
target directory made for it (a typo in a topic or table name must not leave an empty
`./chload-data` behind), and a directory that was there before is left as it was."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import services
from conftest import DATABASE_PASSWORD, run_chload

pytestmark = pytest.mark.integration


def _tree(directory: str) -> dict[str, bytes]:
    """Every file under `directory` and its bytes."""
    found = {}
    for root, _dirs, names in os.walk(directory):
        for name in names:
            path = Path(root) / name
            found[str(path.relative_to(directory))] = path.read_bytes()
    return found


def _failed(target: str, source: str, table: str, env: dict[str, str] | None = None) -> str:
    done = run_chload("load", source, "--table", table, "--target", target, env=env,
                      timeout=120)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr


def _sources(kafka: services.Service, postgres: services.Service,
             mariadb: services.Service) -> list[tuple[str, dict[str, str]]]:
    """A missing topic, a missing table in each database, and a database no one serves."""
    port = services.free_ports(1)[0]
    missing = f"no_such_{uuid.uuid4().hex[:6]}"
    return [(f"kafka://{kafka.extra['bootstrap']}/{missing}", {}),
            (f"postgresql://loader@{postgres.endpoint}/shop/public.{missing}",
             {"PGPASSWORD": DATABASE_PASSWORD}),
            (f"mysql://loader@{mariadb.endpoint}/shop/{missing}",
             {"MYSQL_PWD": DATABASE_PASSWORD}),
            (f"postgresql://loader@127.0.0.1:{port}/shop/public.t",
             {"PGPASSWORD": DATABASE_PASSWORD})]


def test_a_run_failing_before_loading_makes_no_target_directory(
        kafka: services.Service, postgres: services.Service, mariadb: services.Service,
        tmp_path: Path, table_name: str) -> None:
    for i, (source, env) in enumerate(_sources(kafka, postgres, mariadb)):
        target = str(tmp_path / f"target{i}")
        why = _failed(target, source, table_name, env)
        assert not os.path.exists(target), (source, why)
        os.mkdir(target)  # an empty directory given as the target stays empty
        why = _failed(target, source, table_name, env)
        assert os.listdir(target) == [], (source, why)


def test_a_run_failing_before_loading_leaves_an_existing_target_as_it_was(
        kafka: services.Service, postgres: services.Service, mariadb: services.Service,
        target_dir: str, tmp_path: Path, table_name: str) -> None:
    data = tmp_path / "a.csv"
    data.write_text("id,name\n1,a\n2,b\n")
    done = run_chload("load", str(data), "--table", "kept", "--target", target_dir)
    assert done.returncode == 0, done.stderr
    before = _tree(target_dir)
    for source, env in _sources(kafka, postgres, mariadb):
        _failed(target_dir, source, table_name, env)
        assert _tree(target_dir).keys() == before.keys(), source
    out = run_chload("sql", "SELECT count() FROM kept", "--target", target_dir, "--format", "TSV")
    assert out.stdout.strip() == "2", out.stderr
