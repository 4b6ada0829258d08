"""A pipelines file (`chload run chload.toml`): its loads, read and checked, nothing run.

    [defaults]
    target = "./chload-data"

    [loads.trips]
    source = "data/*.csv.gz"
    table = "trips"
    max_errors = 10

Each `[loads.NAME]` is one call of `chload.load`: `source` (or `sources`, a list) and
its keyword parameters, by name, over `[defaults]`. The options are read from
`chload.load`'s signature, so a new option of a load is one here with no change. A value
`${VAR}` (or a part of one) is taken from the environment when the file is read; the
load runs with it, but what is shown (`--check`, messages) is the file's text, and
what the ledger keeps is each source's display, which never holds a secret.

tomllib gives no line numbers: a key's line is found by scanning the text (`_lines`),
so a misspelled option is one line naming the file, its line and the load.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chload import api
from chload.errors import ChloadError, UsageError

SOURCE_KEYS = ("source", "sources")
# load()'s keyword parameters a file may set (a listener is code, not configuration).
OPTIONS = tuple(name for name, p in inspect.signature(api.load).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "listener")
_SPEC_FIELDS = frozenset(api.LoadSpec.__dataclass_fields__) - {"sources", "table"}
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_-]+)\s*=""")


@dataclass(frozen=True)
class Declared:
    """One load of the file: its name, where it is, what it runs and how it is shown."""

    name: str
    line: int  # its [loads.NAME] header
    spec: api.LoadSpec  # ${VAR} resolved: never shown
    metrics_port: int | None
    written: dict[str, Any] = field(repr=False)  # as in the file (defaults merged)

    @property
    def follows(self) -> bool:
        return self.spec.follow


@dataclass(frozen=True)
class Pipelines:
    path: str
    loads: list[Declared]


def read(path: str, env: Mapping[str, str], *, follow: bool = False,
         metrics_port: int | None = None) -> Pipelines:
    """The file's loads, each checked as `chload.load` would check it. `follow`: every
    load whose source can follow does (chload run --follow); `metrics_port`: the port
    of loads that name none."""
    text = _text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not TOML: {exc}") from None
    lines = _lines(text)
    for key in data:
        if key not in ("defaults", "loads"):
            raise UsageError(f"{path}:{lines.get(('', key), 1)}: {key}: a pipelines file "
                             "has [defaults] and [loads.NAME] tables only")
    defaults = _table(path, lines, data.get("defaults", {}), "defaults")
    _known(path, lines, "defaults", defaults)
    loads = _table(path, lines, data.get("loads"), "loads")
    if not loads:
        raise UsageError(f"{path}: no load: add a [loads.NAME] table with source and table")
    return Pipelines(path, [
        _declared(path, lines, name, {**defaults, **_table(path, lines, load, f"loads.{name}")},
                  env, follow, metrics_port)
        for name, load in loads.items()])


def _text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc})") from None


def _table(path: str, lines: dict[tuple[str, str], int], value: object,
           where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        section, _, key = where.rpartition(".")
        raise UsageError(f"{path}:{lines.get((section, key), 1)}: {where} must be a table "
                         f"([{where}] and its keys)")
    return value


def _known(path: str, lines: dict[tuple[str, str], int], section: str,
           values: Mapping[str, object]) -> None:
    """A key that is no option: one line naming it, its line and the closest option."""
    for key in values:
        if key not in OPTIONS and key not in SOURCE_KEYS:
            close = difflib.get_close_matches(key, [*OPTIONS, *SOURCE_KEYS], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UsageError(f"{path}:{_line(lines, section, key)}: unknown option {key!r} "
                             f"in [{section}]; {hint}(the options are chload.load's, "
                             "docs/pipelines.md)")


def _declared(path: str, lines: dict[tuple[str, str], int], name: str,
              written: dict[str, Any], env: Mapping[str, str], follow: bool,
              metrics_port: int | None) -> Declared:
    section = f"loads.{name}"
    _known(path, lines, section, written)
    here = lines.get(("loads", name), 1)
    if ("source" in written) == ("sources" in written):
        raise UsageError(f"{path}:{here}: [{section}] needs source = \"...\" or sources = "
                         "[...] (one of them)")
    if "table" not in written:
        raise UsageError(f"{path}:{here}: [{section}] needs table = \"...\"")
    values = {key: _resolved(path, _line(lines, section, key, here), f"[{section}] {key}", value,
                            env)
              for key, value in written.items()}
    sources = values.pop("source", None) or values.pop("sources", None)
    port = values.pop("metrics_port", metrics_port)
    table = values.pop("table")
    given = {k: v for k, v in values.items() if k in _SPEC_FIELDS}
    try:
        spec = api.planned(sources, table, given)
        if follow and "follow" not in written and _can_follow(spec):
            spec = api.planned(sources, table, {**given, "follow": True})
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 < port < 65536):
            raise UsageError(f"metrics_port={port!r}: must be a TCP port, e.g. 9464")
    except UsageError as exc:
        key = _named(str(exc), written)
        raise UsageError(f"{path}:{_line(lines, section, key, here) if key else here}: "
                         f"[{section}]: {exc}") from None
    return Declared(name, here, spec, port, written)


def _can_follow(spec: api.LoadSpec) -> bool:
    """Whether the load's sources read `follow` and are a stream (a Kafka topic's): files
    can follow too, but only a load that says `follow = true` does."""
    try:
        api.planned(spec.sources, spec.table, {"follow": True})
    except UsageError:
        return False
    return api.registry.stream_of(spec.sources) is not None


def _resolved(path: str, line: int, key: str, value: object, env: Mapping[str, str]) -> Any:
    """`value` with every `${VAR}` in its strings taken from `env`; one unset is one line."""
    if isinstance(value, str):
        def variable(match: re.Match[str]) -> str:
            if match[1] not in env:
                raise UsageError(f"{path}:{line}: {key}: ${{{match[1]}}} is not set in the "
                                 "environment; set it, or write the value")
            return env[match[1]]
        return _VARIABLE.sub(variable, value)
    if isinstance(value, list):
        return [_resolved(path, line, key, item, env) for item in value]
    if isinstance(value, dict):
        return {k: _resolved(path, line, key, v, env) for k, v in value.items()}
    return value


def _named(message: str, written: Mapping[str, object]) -> str | None:
    """The key of the load a message is about (`max_errors=`, `--max-errors`), if any."""
    generic = ("table", "source", "sources", "target")  # words a message may use itself
    for key in sorted(written, key=lambda k: k in generic):
        flag = "--" + key.replace("_", "-")
        if re.search(rf"(?<![\w-])({re.escape(key)}|{re.escape(flag)})(?![\w-])", message):
            return key
    return None


def _line(lines: dict[tuple[str, str], int], section: str, key: str, default: int = 1) -> int:
    """Where `key` is written in `section`, else in [defaults] (merged into each load)."""
    return lines.get((section, key)) or lines.get(("defaults", key)) or default


def _lines(text: str) -> dict[tuple[str, str], int]:
    """(section, key) -> line number of every `key = ...` line, and ('loads', NAME) of
    each [loads.NAME] header; a section's name without quotes or spaces around dots."""
    found: dict[tuple[str, str], int] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            parts = [p.strip().strip("\"'") for p in header[1].split(".")]
            section = ".".join(parts)
            if len(parts) == 2:
                found.setdefault((parts[0], parts[1]), number)
            found.setdefault(("", parts[0]), number)
            continue
        key = _KEY.match(line)
        if key:
            found.setdefault((section, key[1].strip("\"'")), number)
    return found


def described(load: Declared) -> str:
    """What a load would do, in a line: source kind and source, table, target, mode;
    from the file's text (a ${VAR} not filled in) and sources' displays."""
    from chload.sources import registry

    written = load.written
    raw = written.get("source") or written.get("sources")
    shown = [str(s) for s in (raw if isinstance(raw, list) else [raw])]
    kinds = sorted({registry.kind_of(s) for s in load.spec.sources})
    sources = ", ".join(_shown(s, registry.display) for s in shown)
    target = written.get("target") or os.environ.get("CHLOAD_TARGET") or "./chload-data"
    target = _shown(str(target), lambda t: api.where(t)[0] if "://" in t else t)
    mode = "follows until SIGINT/SIGTERM" if load.follows else "once"
    if load.spec.incremental_by:
        mode += f", rows above the last {load.spec.incremental_by} loaded"
    if load.spec.force:
        mode += ", forced (loaded units again)"
    if load.spec.mode != "append":
        mode += f", --mode {load.spec.mode}: {api.MODE_EFFECT[load.spec.mode]}"
    port = f", metrics on 127.0.0.1:{load.metrics_port}" if load.metrics_port else ""
    return (f"{load.name}: {'/'.join(kinds)} {sources} -> {written['table']} in "
            f"{target}: {mode}{port}")


def _shown(text: str, display: Callable[[str], str]) -> str:
    """A source or target as written (a ${VAR} unfilled), as its kind shows it (no
    password, no secret query parameter); one it cannot parse yet (a ${VAR} for its
    port), without a `:password@`."""
    try:
        text = display(text)
    except (ChloadError, ValueError):
        pass
    return re.sub(r"(://[^/@:]*):[^/@]*@", r"\1@", text)
