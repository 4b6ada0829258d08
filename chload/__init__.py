"""chload: get data into ClickHouse fast and exactly once.

    import chload
    report = chload.load(["data/*.csv.gz"], table="trips")

The functions and the types they return are chload.api's (see its docstring). Imports
are lazy: `chload --help` and the CLI start without loading the engine.

`chload.errors(...)` is a function, although `chload.errors` is also a module: Python
sets a package's attribute to a submodule when the submodule is first imported, so the
module is imported here first (it is small) and the function defined after it, and no
later import can replace it. Import the exceptions with `from chload.errors import ...`
(`import chload.errors as m` binds the function).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import chload.errors as _errors_module  # before `def errors` below: see the docstring

__version__ = "0.1.0"
__all__ = ["load", "validate", "files", "sql", "history", "errors", "run_files", "LoadSpec",
           "LoadReport", "FileResult", "FileEvent", "FileCheck", "Event", "Saturation",
           "Concurrency", "StreamChange", "Costs", "ShardLoad", "ServerSaturation",
           "ChloadError", "Poll"]

ChloadError = _errors_module.ChloadError

if TYPE_CHECKING:
    from chload.api import (
        Concurrency,
        Costs,
        Event,
        FileCheck,
        FileEvent,
        FileResult,
        LoadReport,
        LoadSpec,
        Poll,
        Saturation,
        ServerSaturation,
        ShardLoad,
        StreamChange,
        TargetName,
        files,
        history,
        load,
        run_files,
        sql,
        validate,
    )


def errors(table: str, *, target: TargetName = None, limit: int = 10_000) -> list[dict[str, Any]]:
    """Rejected rows of a table's current loads: file, line, error, raw (api.errors,
    which documents the options)."""
    from chload import api

    return api.errors(table, target=target, limit=limit)


def __getattr__(name: str) -> Any:
    if name in __all__:
        from chload import api

        return getattr(api, name)
    raise AttributeError(name)
