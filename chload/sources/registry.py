"""The registry of sources: which module reads a URI scheme, found by name.

The one place that names every kind of source. A kind is a module exposing `SOURCE` (a
`Source`, sources/base.py); it is imported only when a run names its scheme, so the
Kafka and database clients cost nothing to a load of files. A new kind of source is a
module and a line in `KINDS` (and in `SCHEMES` for its URI schemes).

Only the layers above the sources import this module (the API, the targets): a source
never does, so no source is tied back to the list of all of them.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from chload import schema
from chload.errors import UsageError
from chload.sources.base import Source, SourceContext, SourceFile, Stream

if TYPE_CHECKING:
    from chload.core.report import LoadSpec
    from chload.sources.files.aws import S3Settings
    from chload.sources.files.azure import AzureSettings
    from chload.targets.base import Target

if TYPE_CHECKING:  # every kind's SOURCE is a Source: mypy checks every member
    from chload.sources.databases.mysql import MysqlSource
    from chload.sources.databases.postgres import PostgresSource
    from chload.sources.files.azure import AzureSource
    from chload.sources.files.gcs import GcsSource
    from chload.sources.files.hdfs import HdfsSource
    from chload.sources.files.http import HttpSource
    from chload.sources.files.local import LocalSource
    from chload.sources.files.s3 import S3Source
    from chload.sources.kafka.source import KafkaStreamSource
    from chload.sources.lake.delta import DeltaSource
    from chload.sources.lake.iceberg import IcebergSource

    def _conforms(a: LocalSource, b: S3Source, c: HdfsSource, d: HttpSource,
                  e: PostgresSource, f: MysqlSource, g: KafkaStreamSource,
                  h: AzureSource, i: GcsSource, j: IcebergSource,
                  k: DeltaSource) -> list[Source]:
        return [a, b, c, d, e, f, g, h, i, j, k]


# kind -> the module whose `SOURCE` lists and reads it
KINDS: dict[str, str] = {
    "local": "chload.sources.files.local",
    "s3": "chload.sources.files.s3",
    "azure": "chload.sources.files.azure",
    "gcs": "chload.sources.files.gcs",
    "hdfs": "chload.sources.files.hdfs",
    "http": "chload.sources.files.http",
    "postgres": "chload.sources.databases.postgres",
    "mysql": "chload.sources.databases.mysql",
    "kafka": "chload.sources.kafka.source",
    "mysql-changes": "chload.sources.changes.mysql",
    "iceberg": "chload.sources.lake.iceberg",
    "delta": "chload.sources.lake.delta",
}

# URI scheme -> kind. A path without a scheme (and `-`, standard input) is `local`.
SCHEMES: dict[str, str] = {
    "file": "local",
    "s3": "s3",
    "az": "azure",
    "azure": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "gs": "gcs",
    "hdfs": "hdfs",
    "http": "http",
    "https": "http",
    "postgresql": "postgres",
    "postgres": "postgres",
    "mysql": "mysql",
    "mariadb": "mysql",
    "kafka": "kafka",
    "iceberg+s3": "iceberg",
    "iceberg+file": "iceberg",
    "iceberg+sqlite": "iceberg",
    "delta+s3": "delta",
    "delta+file": "delta",
}


# kind -> the module that follows a table's changes (its units are spooled local files)
CHANGES: dict[str, str] = {"postgres": "chload.sources.changes.postgres"}

STREAMS = ("kafka",)  # kinds loaded round by round: their SOURCE is also a `Stream`


def stream_of(patterns: Sequence[str]) -> Stream | None:
    """The `Stream` that loads these patterns, when they name a stream (a Kafka topic);
    None for files and tables. Its module is imported only then."""
    kinds = {kind_of(p) for p in patterns}
    stream = next((k for k in STREAMS if k in kinds), None)
    if stream is None:
        return None
    source: Stream = importlib.import_module(KINDS[stream]).SOURCE
    return source


def binlog_of(spec: LoadSpec, target: Target, table: Any) -> Any:
    """The change stream that follows a MySQL table (--follow, or a table whose ledger
    holds its stream), or None: a plain copy. Imported only for a mysql:// source."""
    if len(spec.sources) != 1 or kind_of(spec.sources[0]) != "mysql" or spec.query \
            or spec.incremental_by:
        return None
    source = importlib.import_module(KINDS["mysql-changes"]).SOURCE
    return source if source.follows(spec, target, table) else None


def changes_of(patterns: Sequence[str]) -> ModuleType | None:
    """The module that follows a database table's changes (sources/changes/), when the
    load names one table of such a database and follows it; None otherwise. Without
    --follow the API asks `followed` of it: a table followed before applies its changes
    up to now."""
    if len(patterns) != 1 or kind_of(patterns[0]) != "postgres" or "://" not in patterns[0]:
        return None
    return importlib.import_module(CHANGES["postgres"])


def follows(target: Any, env: Mapping[str, str], max_retained: int | None,
            drop: str | None, shards: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """`chload sources`: the target's followed tables (sources/changes/status.py), those
    into its Distributed tables too (read from their shards: changes/followed.py)."""
    status = importlib.import_module("chload.sources.changes.status")
    mysql = importlib.import_module("chload.sources.changes.mysql_status")
    followed = importlib.import_module("chload.sources.changes.followed")
    with followed.clusters(target, shards, env) as (clusters, unreachable):
        binlog: list[dict[str, Any]] = mysql.follows(target, env, drop, clusters)
        if drop is not None and binlog:
            return binlog
        found: list[dict[str, Any]] = status.follows(
            target, env, status.MAX_RETAINED if max_retained is None else max_retained, drop,
            clusters)
    return found + binlog + (unreachable if drop is None else [])


def kind_of(pattern: str) -> str:
    """Which kind of source reads what the user typed (a path, `-`, or scheme://...)."""
    if "://" not in pattern:
        return "local"
    scheme = pattern.split("://")[0].lower()
    if scheme not in SCHEMES:
        raise UsageError(f"{pattern.split('@')[-1]}: {scheme}:// is not a source chload "
                         "reads; use a path, s3://, az://, gs://, hdfs://, http(s)://, kafka://, "
                         "postgresql://, mysql://, or a table: iceberg+s3://, delta+s3:// "
                         "(+file:// on disk)")
    return SCHEMES[scheme]


def source_for(what: str | SourceFile) -> Source:
    """The source that lists a pattern, or that listed a file (by its `kind`)."""
    kind = what.kind if isinstance(what, SourceFile) else kind_of(what)
    if kind not in KINDS:
        raise NotImplementedError(f"{kind}: no reader for this kind of source")
    source: Source = importlib.import_module(KINDS[kind]).SOURCE
    return source


def table_function(file: SourceFile, fmt: str, structure: str | None) -> str:
    """The SQL table function with which the engine reads `file` itself (pull).

    `structure` None means: let the engine infer it. One place per kind of source, so
    targets never build source SQL (and secrets stay out of SQL text where possible).
    A file with `constants` (a Delta table's partition values) is read with them added.
    """
    if not file.constants:
        return source_for(file).table_function(file, fmt, structure)
    inner = source_for(file).table_function(file, fmt, _without(file, structure))
    return _with_constants(inner, file.constants, structure is not None)


def table_function_many(files: Sequence[SourceFile], fmt: str,
                        structure: str | None) -> tuple[str, str] | None:
    """One table function reading several files, and the SQL expression that gives each
    row's file `uri`; None when the files cannot share one (read them one by one).

    For object stores this is what makes many small objects fast: the engine reads a
    `{a,b,c}` list of keys without listing, one query plan for the whole batch.
    """
    if len(files) < 2 or len({f.kind for f in files}) != 1:
        return None
    names = {tuple((name, typ) for name, typ, _ in f.constants) for f in files}
    if len(names) != 1:
        return None  # files of tables partitioned otherwise: read one by one
    many = source_for(files[0]).table_function_many(files, fmt, _without(files[0], structure))
    if many is None or not files[0].constants:
        return many
    inner, uri = many
    picked = tuple((name, typ, _picked(uri, [(f.uri, f.constants[i][2]) for f in files]))
                   for i, (name, typ) in enumerate(next(iter(names))))
    return _with_constants(inner, picked, structure is not None), uri


def _without(file: SourceFile, structure: str | None) -> str | None:
    """`structure` less the columns `file`'s bytes do not hold (its constants)."""
    if structure is None or not file.constants:
        return structure
    held = {name for name, _, _ in file.constants}
    return schema.structure([c for c in schema.parse_structure(structure)
                             if c.name not in held])


def _with_constants(inner: str, constants: Sequence[tuple[str, str, str]],
                    reading: bool) -> str:
    """`inner`'s rows with `constants` as columns. Named, not taken from `*`: the engine
    would also read a `name=value` folder of the path as a column (use_hive_partitioning,
    on by default), typed as it guesses. Reading, the subquery passes on the virtual
    columns `_path` and `_file` that the uri of a row and --audit read; described (no
    structure), only the data's columns."""
    names = ", ".join(schema.quote_ident(name) for name, _, _ in constants)
    virtual = ", _path, _file" if reading else ""
    added = ", ".join(f"CAST({value} AS {typ}) AS {schema.quote_ident(name)}"
                      for name, typ, value in constants)
    return f"(SELECT * EXCEPT ({names}){virtual}, {added} FROM {inner})"


def _picked(uri: str, values: Sequence[tuple[str, str]]) -> str:
    """The value of each row's file, by its `uri` (the SQL giving a row's file), among
    the files' `values` (uri, SQL): one branch per distinct value, the last the default
    (the branches' NULL and literals, cast to the column's type by the caller)."""
    by_value: dict[str, list[str]] = {}
    for file_uri, value in values:
        by_value.setdefault(value, []).append(file_uri)
    *branches, (default, _) = by_value.items()
    if not branches:
        return default
    conditions = [f"{uri} IN ({', '.join(schema.quote_str(u) for u in uris)}), {value}"
                  for value, uris in branches]
    return f"multiIf({', '.join(conditions)}, {default})"


def release(files: Iterable[SourceFile]) -> None:
    """Release what listing made for each file (its source's `release`)."""
    by_kind: dict[str, list[SourceFile]] = {}
    for f in files:
        by_kind.setdefault(f.kind, []).append(f)
    for group in by_kind.values():
        source_for(group[0]).release(group)


def display(pattern: str) -> str:
    """What the user typed, without secrets (Source.display)."""
    return source_for(pattern).display(pattern)


def s3_settings(patterns: Sequence[str], env: Mapping[str, str],
                endpoint: str | None) -> S3Settings | None:
    """The S3 settings of a run (credentials, endpoint) when a pattern is s3:// (an
    Iceberg or Delta table's too, and an Iceberg catalog's, whose tables may be on S3);
    None otherwise (resolving reads ~/.aws and may import
    botocore, so only then)."""
    if not any(kind_of(p) == "s3" or p.split("://")[0].lower().endswith(("+s3", "+sqlite"))
               for p in patterns):
        return None
    from chload.sources.files import aws

    return aws.resolve(env, endpoint)


def azure_settings(patterns: Sequence[str], env: Mapping[str, str]) -> AzureSettings | None:
    """The Azure account of a run when a pattern is az:// (azure.resolve); None otherwise."""
    if not any(kind_of(p) == "azure" for p in patterns):
        return None
    from chload.sources.files import azure

    return azure.resolve(env)


def gcs_settings(patterns: Sequence[str], env: Mapping[str, str]) -> S3Settings | None:
    """The GCS settings of a run when a pattern is gs:// (gcs.resolve); None otherwise.
    The engine takes GCS's key where it takes S3's: a run reads one of them with keys."""
    kinds = {kind_of(p) for p in patterns}
    if "gcs" not in kinds:
        return None
    from chload.sources.files import gcs

    settings = gcs.resolve(env)
    if "s3" in kinds and settings.credentials is not None:
        raise UsageError("gs:// and s3:// sources: load them in separate runs (the engine "
                         "takes one HMAC or AWS key at a time)")
    return settings


@contextlib.contextmanager
def engine_credentials(context: SourceContext, env: MutableMapping[str, str]) -> Iterator[None]:
    """The credentials handed to the engine while it reads: S3's or GCS's keys
    (aws.hand_to_engine), an Azure account (azure.hand_to_engine)."""
    with contextlib.ExitStack() as stack:
        settings = context.s3 or context.gcs
        if settings is not None:
            from chload.sources.files import aws

            stack.enter_context(aws.hand_to_engine(settings.credentials, env))
        if context.azure is not None:
            from chload.sources.files import azure

            stack.enter_context(azure.hand_to_engine(context.azure))
        yield
