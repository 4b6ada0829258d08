"""One exception tree for chload; retryability is part of the type.

    ChloadError                      every error chload raises on purpose
    ├── TerminalError                retrying cannot help: fail fast, say what to do
    │   ├── UsageError               a flag, setting or spec that makes no sense
    │   ├── SourceError              a file or object missing, unreadable, wrong format
    │   ├── DataError                rows the engine could not parse or convert
    │   ├── SchemaError              table and data disagree (missing/unknown columns)
    │   ├── TargetInUse              another process holds the embedded target directory
    │   └── EngineError              any other error answered by ClickHouse
    └── TransientError               worth a retry with backoff: network, 5xx, too many parts

Third-party and engine exceptions are converted here, at one boundary
(`from_engine_message`); the rest of the code never inspects ClickHouse message text.
Every message is one line that names the file or table and, where it helps, what to do.
"""

from __future__ import annotations

import re


class ChloadError(Exception):
    """Base of all errors chload raises on purpose."""


class TerminalError(ChloadError):
    """Retrying will not help."""


class TransientError(ChloadError):
    """May succeed if tried again later."""


class UsageError(TerminalError):
    """A flag, setting or spec that makes no sense."""


class SourceError(TerminalError):
    """A source that is missing, unreadable or not in the expected format."""


class DataError(TerminalError):
    """Rows that the engine could not parse or convert."""


class SchemaError(TerminalError):
    """The table and the data disagree."""


class TargetInUse(TerminalError):
    """Another process holds the embedded target directory."""


class EngineError(TerminalError):
    """An error answered by ClickHouse that is none of the above."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


# ClickHouse error codes, grouped by what they mean for a load.
_DATA_CODES = {
    6, 26, 27, 32, 33, 38, 41, 53, 62, 69, 70, 72, 75, 76, 117, 130, 131, 132, 173, 321,
    354, 412, 430, 432, 433, 434, 444, 467, 487, 566, 690,
}  # CANNOT_PARSE_*, TYPE_MISMATCH, INCORRECT_DATA, CANNOT_DECOMPRESS, ...
_SOURCE_CODES = {73, 74, 76, 86, 107, 108, 190, 191, 192, 236, 499, 636, 660, 1001}
# 73 UNKNOWN_FORMAT, 86 RECEIVED_ERROR_FROM_REMOTE_IO_SERVER (a URL's 404), 107
# FILE_DOESNT_EXIST, 499 S3_ERROR, 636 CANNOT_EXTRACT_TABLE_STRUCTURE, 660 HDFS_ERROR
_SCHEMA_CODES = {8, 10, 16, 47, 60, 81, 122, 179, 352}
# 8 THERE_IS_NO_COLUMN, 16 NO_SUCH_COLUMN_IN_TABLE, 47 UNKNOWN_IDENTIFIER, 60 UNKNOWN_TABLE
_TRANSIENT_CODES = {3, 159, 164, 202, 203, 209, 210, 236, 241, 242, 252, 285, 319, 394, 425}
# 159 TIMEOUT_EXCEEDED, 209 SOCKET_TIMEOUT, 210 NETWORK_ERROR, 252 TOO_MANY_PARTS ...
_ERRNO_SOURCE = re.compile(r"Cannot (stat|open) file|No such file|Permission denied")

_BEFORE = re.compile(r"before: '((?:[^'\\]|\\.)*)'")
_HINTS = {
    354: " (the compressed stream is truncated or not of that kind; if the file is not "
         "compressed, pass --compression none)",
    432: " (the compressed stream is truncated or corrupt)",
}
_CODE = re.compile(r"Code:\s*(\d+)")
_EXCEPTION_PREFIX = re.compile(  # chDB may repeat it: "Code: 27. DB::Exception: Code: 27. ..."
    r"^(?:(Code:\s*\d+\.\s*)?(e\.displayText\(\) = )?DB::\w*Exception:\s*)+")


def engine_code(message: str) -> int | None:
    """The `Code: NNN` of a ClickHouse error text, if it has one."""
    match = _CODE.search(message)
    return int(match.group(1)) if match else None


def one_line(message: str, limit: int = 400) -> str:
    """The engine's error reduced to one readable line (its first line, trimmed).

    ClickHouse appends multi-line row dumps and stack traces; the first line carries the
    cause, and the `(at row N)` locator that follows it is kept.
    """
    text = _EXCEPTION_PREFIX.sub("", message.strip())
    first, _, rest = text.partition("\n")
    cause_name = ""
    if first.rstrip().endswith("Error:") and rest:  # the cause is on the next line
        first, rest, cause_name = _with_cause(first, rest)
    row = re.search(r"\(at row (\d+)\)", first + rest[:200])
    line = re.sub(r"\s*\((in file/uri|at row)[^)]*\)", "", first).strip(" :.")
    line = re.sub(r": While executing \w+.*$", "", line)
    line = re.sub(r"(\s*\(([A-Z_]+|version [^)]*)\)\.?)+$", "", line)  # (ERROR_NAME) (version)
    if row and "row" not in line:
        line += f" (at row {row.group(1)})"
    line = _BEFORE.sub(_shorten, line)  # the engine quotes what follows in the data, at length
    line = re.sub(r":?\s*While reading from: .*$", "", line)
    line = re.sub(r":?\s*\(while reading header\):?$", "", line).strip(" :").rstrip(".")
    line = line.replace("\t", " ") + (f" ({cause_name})" if cause_name else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _with_cause(head: str, rest: str) -> tuple[str, str, str]:
    """`X. Error:` + the nested error's first line -> (`X: <cause>`, the lines after,
    the cause's ERROR_NAME).

    Schema inference wraps the real reason ("inflate failed: data error
    (ZLIB_INFLATE_FAILED)", "the file is empty") in CANNOT_EXTRACT_TABLE_STRUCTURE,
    one line down, and then says "You can specify the structure manually".
    """
    cause, _, after = rest.partition("\n")
    name = re.search(r"\(([A-Z][A-Z0-9_]+)\)\s*(\(version [^)]*\))?\.?\s*$", cause)
    cause = _EXCEPTION_PREFIX.sub("", cause.strip())
    cause = re.sub(r"\s*\(version [^)]*\)\.?$", "", cause)
    cause = re.sub(r"\s*\([A-Z][A-Z0-9_]+\)\.?$", "", cause)
    cause = re.sub(r":?\s*While reading from: .*$", "", cause).strip(" :.")
    head = re.sub(r"\W*Error:\s*$", "", head)
    if cause.startswith(head):  # "X: the file is empty" under "X. Error:"
        head, cause = cause, ""
    return (f"{head}: {cause}" if cause else head), after, name.group(1) if name else ""


_COLUMN = re.compile(r"name:\s*([^,]+),[^\n]*?ERROR")


def locate(message: str) -> tuple[int | None, str | None]:
    """(row, column) an engine parse error points at, where it says so."""
    row = re.search(r"\(at row (\d+)\)", message)
    column = _COLUMN.search(message)
    return (int(row.group(1)) if row else None,
            column.group(1).strip() if column else None)


def _shorten(match: re.Match[str]) -> str:
    text = match.group(1)
    return f"before: '{text[:24]}{'...' if len(text) > 24 else ''}'"


def from_engine_message(message: str, context: str) -> ChloadError:
    """Convert a ClickHouse error text into the matching chload error.

    `context` names what was being done ("trips_003.csv.gz", "table trips") and
    starts the message, so every error says what it was about.
    """
    code = engine_code(message)
    innermost = int(_CODE.findall(message)[-1]) if code is not None else 0  # a nested cause's
    hint = _HINTS.get(innermost, "")
    if "Unknown field found" in message:  # chload sets input_format_skip_unknown_fields=0
        hint = (" (the table has no such column: add it with ALTER TABLE ... ADD COLUMN, or "
                "pass --setting input_format_skip_unknown_fields=1 to drop it)")
    text = f"{context}: {one_line(message)}{hint}"
    if code in _TRANSIENT_CODES and code != 236:
        return TransientError(text)
    if _ERRNO_SOURCE.search(message) or code in _SOURCE_CODES:
        return SourceError(text)
    if code in _DATA_CODES:
        return DataError(text)
    if code in _SCHEMA_CODES:
        return SchemaError(text)
    return EngineError(text, code)
