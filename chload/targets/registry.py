"""The registry of targets: which kind of target a `--target` names, opened here.

The one place that names every kind of target (embedded, server; a server's
Distributed table opens the cluster target, targets/cluster/). Each is imported only
when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chload.errors import UsageError
from chload.targets.base import Target

if TYPE_CHECKING:
    from chload.schema import Column
    from chload.targets.cluster.target import ClusterTarget
    from chload.targets.embedded.target import EmbeddedTarget
    from chload.targets.server.http import TargetURL
    from chload.targets.server.target import ServerTarget

    def _conforms(e: EmbeddedTarget, s: ServerTarget,
                  c: ClusterTarget) -> tuple[Target, Target, Target]:
        return e, s, c


DEFAULT_TARGET = "./chload-data"
TARGET_ENV = "CHLOAD_TARGET"


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """Where rows go, resolved once at the top (api.py) from --target and the
    environment, then passed down: nothing under targets/ reads the environment.

    `where`: a directory (embedded ClickHouse) or the URL as given; `url`: a server's,
    parsed, with its password (the URL's, else $CLICKHOUSE_PASSWORD). `create=False`
    (commands that only read): an embedded directory must exist already."""

    where: str = field(repr=False)  # a URL may hold the password
    url: TargetURL | None = field(default=None, repr=False)
    create: bool = True

    @property
    def display(self) -> str:
        """The target without its password."""
        return self.url.display if self.url is not None else self.where

    @classmethod
    def resolve(cls, target: str | None, env: Mapping[str, str],
                create: bool = True) -> TargetSpec:
        """A --target value (else env's CHLOAD_TARGET, else the default)."""
        value = target or env.get(TARGET_ENV) or DEFAULT_TARGET
        if value.startswith(("http://", "https://")):
            from chload.targets.server.http import parse_target_url

            return cls(value, parse_target_url(value, env), create)
        if "://" in value:
            raise UsageError(
                f"--target: '{value.split('://')[0]}://' is not a target; use a directory "
                "(embedded ClickHouse) or http(s)://host:port/db (a ClickHouse server)"
            )
        return cls(value, None, create)


def open_target(spec: TargetSpec) -> Target:
    """The target a TargetSpec names.

    `spec.create=False` (commands that only read) refuses an embedded directory that
    does not exist yet, rather than making an empty one.
    """
    if spec.url is not None:
        from chload.targets.server.target import ServerTarget

        return ServerTarget(spec.url, clusters=_open_cluster,
                            make_on_cluster=_make_on_cluster)
    if not spec.create and not os.path.isdir(spec.where):
        raise UsageError(f"target {spec.where}: no embedded ClickHouse there yet; load "
                         "something first, or pass --target DIR (or http(s)://...)")
    from chload.targets.embedded.target import EmbeddedTarget

    return EmbeddedTarget(spec.where)


def _make_on_cluster(server: ServerTarget, table: str, cluster: str,
                     columns: Sequence[Column], key: Sequence[str], engine: str,
                     shards: Sequence[tuple[str, str]], env: Mapping[str, str]) -> None:
    """A followed table made on a cluster (targets/cluster/create.py)."""
    from chload.targets.cluster.create import create_on_cluster

    create_on_cluster(server, table, cluster, columns, key, engine, shards, env)


def _open_cluster(server: ServerTarget, table: str, shards: Sequence[tuple[str, str]],
                  shard_by: str, env: dict[str, str]) -> AbstractContextManager[Target]:
    """The cluster target of a server's Distributed table (targets/cluster/)."""
    from chload.targets.cluster.open import for_table

    return for_table(server, table, shards, shard_by, env)
