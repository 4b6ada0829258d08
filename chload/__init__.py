"""chload: get data into ClickHouse fast and exactly once.

    import chload
    report = chload.load(["data/*.csv.gz"], table="trips")

Imports are lazy: `chload --help` and the CLI start without loading the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["load", "files", "sql", "history", "errors", "validate", "run_files", "LoadSpec",
           "LoadReport", "FileCheck", "ChloadError"]

if TYPE_CHECKING:
    from chload.api import (
        FileCheck,
        LoadReport,
        LoadSpec,
        errors,
        files,
        history,
        load,
        run_files,
        sql,
        validate,
    )
    from chload.errors import ChloadError


def __getattr__(name: str) -> Any:
    if name == "ChloadError":
        from chload import errors

        return errors.ChloadError
    if name in __all__:
        from chload import api

        return getattr(api, name)
    raise AttributeError(name)
