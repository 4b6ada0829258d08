"""One exception tree for chload; retryability is part of the type.

    ChloadError                      every error chload raises on purpose
    ├── TerminalError                retrying cannot help: fail fast, say what to do
    │   ├── UsageError               a flag, setting or spec that makes no sense
    │   ├── SourceError              a file or object missing, unreadable, wrong format
    │   │   ├── VanishedFile         listed for loading, gone when read (targets/vanished.py)
    │   │   └── NothingMatched       a pattern that names no file now (--follow waits)
    │   ├── DataError                rows the engine could not parse or convert
    │   ├── SchemaError              table and data disagree (missing/unknown columns)
    │   │   └── ValuesRefused        values no column type holds, found by a check of the
    │   │                            whole run (a database's): stops the run, not one unit
    │   ├── TargetInUse              another process holds the embedded target directory
    │   ├── AuthError                the server refused the user or password
    │   ├── CommitInterrupted        a commit whose outcome is unsettled (commit/committer.py)
    │   ├── BatchOverlap             another load committed files of a batch: load in halves
    │   └── EngineError              any other error answered by ClickHouse
    └── TransientError               worth a retry with backoff: network, 5xx, too many parts

Every error's text is `context: reason` (`.context`, `.reason`, ClickHouse's `.code`):
one line naming the file, table, setting or server; callers never split the text.
Engine and server errors are converted here, at one boundary (`from_engine_message`,
`server_error`, `from_push_message`): nothing else reads ClickHouse message text.
`_TRANSIENT_CODES` is the one table of codes worth a retry; how often is retry.py's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

E = TypeVar("E", bound="ChloadError")


class ChloadError(Exception):
    """Base of all errors chload raises on purpose.

    Made either from its parts (`context=`, `reason=`, and `code=` where ClickHouse
    answered one) or from a whole message, whose `context: ` head is its context (the
    text before the first ": "; none if it has no such head).
    """

    def __init__(self, message: str = "", *, context: str | None = None,
                 reason: str | None = None, code: int | None = None) -> None:
        if context is None and reason is None:
            head, colon, rest = message.partition(": ")
            context, reason = (head, rest) if colon else ("", message)
        else:
            reason = reason or ""
            message = message or (reason if context is None else f"{context}: {reason}")
            context = context or ""
        super().__init__(message)
        self.context, self.reason, self.code = context, reason, code

    def masked(self: E, mask: Callable[[str], str]) -> E:
        """The same error (type and fields kept) with `mask` applied to its text, e.g.
        a password replaced by ***."""
        self.args = tuple(mask(a) if isinstance(a, str) else a for a in self.args)
        self.context, self.reason = mask(self.context), mask(self.reason)
        return self


class TerminalError(ChloadError):
    """Retrying will not help."""


class TransientError(ChloadError):
    """May succeed if tried again later."""


class UsageError(TerminalError):
    """A flag, setting or spec that makes no sense."""


class SourceError(TerminalError):
    """A source that is missing, unreadable or not in the expected format."""


class VanishedFile(SourceError):
    """A file listed for loading that was gone (or unreadable) when it was read."""


class NothingMatched(SourceError):
    """A pattern (a glob, a directory, a prefix) that names no file now: a load stops
    on it; a load that follows (--follow) waits for files to come."""


class DataError(TerminalError):
    """Rows that the engine could not parse or convert; `row` and `column` say where,
    when the engine says so."""

    row: int | None = None
    column: str | None = None


class SchemaError(TerminalError):
    """The table and the data disagree."""


class ValuesRefused(SchemaError):
    """Values no column type holds, found by a source's check of every row the run
    loads (databases/base.py): the run stops in this one line (core/run.py raises it
    rather than failing the unit that met it), nothing committed."""


class TargetInUse(TerminalError):
    """Another process holds the embedded target directory."""


class AuthError(TerminalError):
    """The server refused the user or password."""


class CommitInterrupted(TerminalError):
    """A commit whose outcome this process could not settle; the next holder settles it."""


class BatchOverlap(TerminalError):
    """Some files of a batch were committed by another load: load each half again."""


class EngineError(TerminalError):
    """An error answered by ClickHouse that is none of the above."""

    def __init__(self, message: str = "", code: int | None = None, *,
                 context: str | None = None, reason: str | None = None) -> None:
        super().__init__(message, context=context, reason=reason, code=code)


def retyped(error: ChloadError, kind: type[E]) -> E:
    """`error`'s context, reason and code as an error of `kind` (the same text)."""
    return kind(str(error), context=error.context, reason=error.reason, code=error.code)


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

# The one table of codes a retry can cure (retry.py decides how often and how long):
_TRANSIENT_CODES = {
    3,    # UNEXPECTED_END_OF_FILE: a stream cut short (a connection dropped mid-body)
    159,  # TIMEOUT_EXCEEDED
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    203,  # NO_FREE_CONNECTION
    209,  # SOCKET_TIMEOUT
    210,  # NETWORK_ERROR
    241,  # MEMORY_LIMIT_EXCEEDED: other queries hold the memory, for now
    242,  # TABLE_IS_READ_ONLY: a replica without its ZooKeeper session, for now
    252,  # TOO_MANY_PARTS: merges catch up
    285,  # TOO_FEW_LIVE_REPLICAS
    319,  # UNKNOWN_STATUS_OF_INSERT
    394,  # QUERY_WAS_CANCELLED: by a server shutting down, or KILL QUERY
    425,  # SYSTEM_ERROR: an OS call failed (disk, sockets)
}
# Not transient: 164 READONLY (the user's `readonly` profile: no retry changes it) and
# 236 ABORTED (a remote read aborted: a source error, _SOURCE_CODES, as it always was).

TOO_MANY_PARTS = 252  # the server's backpressure: never fails a load (core/run.py) ...
# ... but for "Too many partitions for single INSERT block": max_partitions_per_insert_block
# against the data's PARTITION BY, which no wait changes (same code): terminal.
_TOO_MANY_PARTITIONS = "Too many partitions for single INSERT block"


def backpressure(error: BaseException) -> bool:
    """A server pushing back ("too many parts", 252): wait, send less, never fail."""
    return isinstance(error, TransientError) and error.code == TOO_MANY_PARTS


_AUTH_CODES = {192, 193, 194, 195, 497, 516}
# UNKNOWN_USER, WRONG_PASSWORD, REQUIRED_PASSWORD, IP_ADDRESS_NOT_ALLOWED, ACCESS_DENIED,
# AUTHENTICATION_FAILED
PASSWORD_ENV = "CLICKHOUSE_PASSWORD"  # where a server target's password may come from

# The patterns below are compiled when first used (re caches them): they read error
# texts only, and compiling them all at import would slow every start.
_ERRNO_SOURCE = r"Cannot (stat|open) file|No such file|Permission denied"

_BEFORE = r"before: '((?:[^'\\]|\\.)*)'"
_HINTS = {
    354: " (the compressed stream is truncated or not of that kind; if the file is not "
         "compressed, pass --compression none)",
    432: " (the compressed stream is truncated or corrupt)",
}
_CODE = r"Code:\s*(\d+)"
# chDB may repeat it: "Code: 27. DB::Exception: Code: 27. ..."
_EXCEPTION_PREFIX = r"^(?:(Code:\s*\d+\.\s*)?(e\.displayText\(\) = )?DB::\w*Exception:\s*)+"


def engine_code(message: str) -> int | None:
    """The `Code: NNN` of a ClickHouse error text, if it has one."""
    match = re.search(_CODE, message)
    return int(match.group(1)) if match else None


def one_line(message: str, limit: int = 400) -> str:
    """The engine's error reduced to one readable line (its first line, trimmed).

    ClickHouse appends multi-line row dumps and stack traces; the first line carries the
    cause, and the `(at row N)` locator that follows it is kept.
    """
    text = re.sub(_EXCEPTION_PREFIX, "", message.strip())
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
    line = re.sub(_BEFORE, _shorten, line)  # the engine quotes what follows in the data, at length
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
    cause = re.sub(_EXCEPTION_PREFIX, "", cause.strip())
    cause = re.sub(r"\s*\(version [^)]*\)\.?$", "", cause)
    cause = re.sub(r"\s*\([A-Z][A-Z0-9_]+\)\.?$", "", cause)
    cause = re.sub(r":?\s*While reading from: .*$", "", cause).strip(" :.")
    head = re.sub(r"\W*Error:\s*$", "", head)
    if cause.startswith(head):  # "X: the file is empty" under "X. Error:"
        head, cause = cause, ""
    return (f"{head}: {cause}" if cause else head), after, name.group(1) if name else ""


_COLUMN_FIELD = r"Column \d+,\s*name:\s*([^,]+),\s*type:\s*([^,]+?),"
_QUOTED = r'"((?:[^"\\]|\\.)*)"'
_NOT_LIKE = rf"ERROR: text {_QUOTED} is not like ([^\n]+?)\s*$"
_GARBAGE = (rf'parsed text: (?:{_QUOTED}|<EMPTY>)\s*ERROR: garbage after ([^:\n]+): '
            rf'{_QUOTED}')
_DUMP_MARKS = r"<LINE FEED>|<CARRIAGE RETURN>|<TAB>|\\[ntr]|[,;|]"


def locate(message: str) -> tuple[int | None, str | None]:
    """(row, column) an engine parse error points at, where it says so: the row of its
    `(at row N)`; the column whose field in the row dump holds the `ERROR` (on its line,
    or, for `garbage after` the parsed text, on the next one; a row's error such as
    "There is no line feed" names no column)."""
    row = re.search(r"\(at row (\d+)\)", message)
    lines = message.splitlines()
    at = next((i for i, line in enumerate(lines) if "ERROR" in line), None)
    field = None
    if at is not None:
        if "name:" in lines[at]:
            field = re.search(_COLUMN_FIELD, lines[at])
        elif at and lines[at].lstrip().startswith("ERROR: garbage after"):
            field = re.search(_COLUMN_FIELD, lines[at - 1])
    return (int(row.group(1)) if row else None, field.group(1).strip() if field else None)


def misfit(message: str) -> tuple[str, str] | None:
    """(`N/A`, `Int64`): the value a parse error's row dump shows its column could not
    read as its type, where it shows one (`ERROR: text "N/A,2020-0" is not like Int64`,
    or `parsed text: "12"` then `ERROR: garbage after Int64: "abc,..."`). The dump
    shows the next ten bytes of the data: the value is cut at the next delimiter."""
    found = re.search(_NOT_LIKE, message, re.M)
    if found:
        parsed, rest, type_ = "", found.group(1), found.group(2)
    else:
        found = re.search(_GARBAGE, message)
        if not found:
            return None
        parsed, rest, type_ = found.group(1) or "", found.group(3), found.group(2)
    # The first line quotes more of the data: `before: 'N/A,2020-01-02\n'` (18.16: bare)
    before = re.search(_BEFORE, message) or re.search(r"before: ([^'\n]+?):?\s*\(at row",
                                                      message)
    if before and before.group(1).startswith(rest):
        rest = before.group(1)
    text = parsed + rest
    cut = re.search(_DUMP_MARKS, text)
    value = text[:cut.start()] if cut else text + ("..." if len(text) >= 10 else "")
    while (inner := re.fullmatch(r"(?:Nullable|LowCardinality)\((.*)\)", type_)):
        type_ = inner.group(1)
    return value, type_


def _shorten(match: re.Match[str]) -> str:
    text = match.group(1)
    return f"before: '{text[:24]}{'...' if len(text) > 24 else ''}'"


# The way on past rows the engine cannot read, said by every message about them.
KEEP_BAD_ROWS = "--max-errors N to load the other rows and keep such rows in chload.rejects"

_SECRETS: set[str] = set()


def keep_secret(value: str) -> None:
    """A value no message may show: a URL's signature or token (sources/files/http.py). The
    engine quotes the URLs it fails to read, in full; every engine or server message
    chload turns into an error has these masked (`***`). A value under 4 characters is
    not taken: it would mask ordinary words."""
    if len(value) >= 4:
        _SECRETS.add(value)


def unsecret(text: str) -> str:
    """`text` with every value given to keep_secret masked, longest first."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def from_engine_message(message: str, context: str) -> ChloadError:
    """Convert a ClickHouse error text into the matching chload error.

    `context` names what was being done ("trips_003.csv.gz", "table trips") and
    starts the message, so every error says what it was about. Secrets the engine
    quotes are masked (keep_secret).
    """
    message = unsecret(message)
    code = engine_code(message)
    innermost = int(re.findall(_CODE, message)[-1]) if code is not None else 0  # a nested cause's
    hint = _HINTS.get(innermost, "")
    if "Unknown field found" in message:  # chload sets input_format_skip_unknown_fields=0
        hint = (" (the table has no such column: loading files, pass --on-new-column add "
                "to add it or ignore to drop it; else add it with ALTER TABLE ... ADD COLUMN, "
                "or drop such fields with --setting input_format_skip_unknown_fields=1)")
    kind = _kind(code, message)
    reason = one_line(message)
    null = _null_misfit(message)
    wide = re.search(r"Value in column (\S+) cannot be safely converted into type ([^:\s]+)",
                     message)
    if wide:  # fit.insert_expr: a number its column cannot hold (read wider)
        cast = re.search(r"accurateCast\((?:__table\d+\.)?(?:`((?:[^`\\]|\\.)*)`|([^ :`,]+))",
                         message)  # (a quoted name may hold spaces)
        name = (cast.group(1) or cast.group(2)) if cast else ""
        kind, hint = DataError, WIDER_COLUMN
        reason = (f"{f'column {name}: ' if name else ''}a value does not fit "
                  f"{wide.group(2)} (read as {wide.group(1)}): it would be stored wrapped")
    elif null:  # input_format_null_as_default=0 (engine.py): the cause named, and the way on
        kind, hint = DataError, NULL_INTO_ORDINARY
        at = locate(message)[0]
        where = f"column {null[0]}: " if null[0] else ""
        reason = (f"{where}NULL in a column that is not Nullable"
                  f"{f' ({null[1]})' if null[1] else ''}{f' (at row {at})' if at else ''}")
    elif kind is DataError:
        row, column = locate(message)
        found = misfit(message)
        at_row = f" (at row {row})" if row else ""
        if found and column:  # "column v: 'N/A' is not Int64 (at row 2)"
            value, type_ = found
            said = f"{value!r} is not {type_}" if value else f"an empty value is not {type_}"
            if value == column:  # files joined with cat
                said += ": the header line again, as when files are joined with cat"
            reason = f"column {column}: {said}{at_row}"
        elif "more columns than expected" in message:
            reason = (re.sub(_AT_ROW, "", reason) + ": the row has more fields than there "
                      f"are columns{at_row}")
        elif re.search(r"expected '?[,;|\t]'? before: '?\\n", message):  # the line ended
            reason = f"the row has fewer fields than there are columns{at_row}"
    error = kind(context=context, reason=f"{reason}{hint}", code=code)
    if isinstance(error, DataError):
        error.row, error.column = locate(message)
    return error


WIDER_COLUMN = ("; give the column a type that holds it (ALTER TABLE ... MODIFY COLUMN, or in "
                "--schema)")
NULL_INTO_ORDINARY = ("; make the column Nullable (ALTER TABLE ... MODIFY COLUMN, or in "
                      "--schema), or pass --setting input_format_null_as_default=1 to store "
                      "the type's default for it")
_NULL_MESSAGES = (  # (the engine's words for a NULL into a column not Nullable, by format)
    r"Cannot convert NULL value to non-Nullable type(?: for column (?P<c1>[^:\s]+)"
    r"|: while converting column [`\"](?P<c2>[^`\"]+)[`\"] from type \S+ to type "
    r"(?P<t2>[^:\s]+))",  # Parquet / ORC, Arrow, Native
    r"Unexpected NULL value of not Nullable type (?P<t3>[^.\s]+)",  # TSV
    r"Cannot insert Avro Union\(Null, \w+\) into non-nullable type (?P<t4>[^.\s]+)",
    r"ERROR: text \"<BACKSLASH>N(?:<[A-Z ]+>)*\" is not like (?P<t5>[^\s]+)",  # CSV
)


def _null_misfit(message: str) -> tuple[str, str] | None:
    """(column, type) of a NULL the engine refused for a column that is not Nullable,
    or None. The column: the message's, else the row dump's; '' where neither says (an
    Avro file's message), as the type where the message does not (a Parquet file's)."""
    for pattern in _NULL_MESSAGES:
        found = re.search(pattern, message)
        if found:
            named = {k: v for k, v in found.groupdict().items() if v}
            column = named.get("c1") or named.get("c2") or locate(message)[1] or ""
            return column, next((v for k, v in named.items() if k.startswith("t")), "")
    return None


def _kind(code: int | None, message: str) -> type[ChloadError]:
    if code == TOO_MANY_PARTS and _TOO_MANY_PARTITIONS in message:
        return EngineError  # the data's partitions, not the server's state: terminal
    if code in _TRANSIENT_CODES:
        return TransientError
    if re.search(_ERRNO_SOURCE, message) or code in _SOURCE_CODES:
        return SourceError
    if code in _DATA_CODES:
        return DataError
    if code in _SCHEMA_CODES:
        return SchemaError
    return EngineError


# -- a server's answers (HTTP) ------------------------------------------------------------
def normalize(text: str) -> str:
    """An 18.16 error body in the modern shape `one_line` expects.

    18.16 sends no exception headers: the code is in the body text,
    `Code: 60, e.displayText() = DB::Exception: ..., e.what() = DB::Exception`.
    """
    text = text.strip()
    text = re.sub(r"^Code:\s*(\d+),\s*e\.displayText\(\) = ", r"Code: \1. ", text)
    text = re.sub(r",\s*e\.what\(\) = DB::\w*Exception\s*$", "", text, flags=re.M)
    return text


def server_error(status: int, body: str, context: str) -> ChloadError:
    """The chload error for a server's non-200 answer; `context` starts the message.

    HTTP 401/403 and the auth codes are an AuthError (it names the user only); a
    transient code, or a 5xx without one, a TransientError; the rest as the engine's.
    """
    code = engine_code(body)
    text = unsecret(normalize(body)) or f"HTTP {status}"
    if status in (401, 403) or code in _AUTH_CODES:
        return AuthError(context=context, code=code,
                         reason=f"authentication failed ({one_line(text)}); check the user "
                                f"and password in --target or ${PASSWORD_ENV}")
    if (code in _TRANSIENT_CODES and _kind(code, text) is TransientError) or (
            code is None and status >= 500):
        return TransientError(context=context, reason=one_line(text), code=code)
    return from_engine_message(text, context)


_REMOTE_ERROR = r"(?s)HTTP status code: (\d+)[^\n]*?body: '(.*)'"
_NETWORK = (r"(?i)Connection (refused|reset)|Timeout|timed out|Broken pipe|"
            r"Network is unreachable|No route to host")


def from_push_message(message: str, context: str, server: str | None) -> ChloadError:
    """A chDB error of a push to `server` (host:port), which may carry the server's
    answer (`HTTP status code: 500 ... body: '...'`) or say the server was unreachable."""
    remote = re.search(_REMOTE_ERROR, message)
    if remote:
        return server_error(int(remote.group(1)), remote.group(2), context)
    network = re.search(_NETWORK, message) if "POCO_EXCEPTION" in message else None
    if network and server is not None:
        return TransientError(context=context, reason=f"server {server} unreachable: "
                                                       f"{network.group(0).lower()}")
    return from_engine_message(message, context)


_MISSING_TABLE = r"Table (\S+?)\.? doesn't exist"


def missing_table(error: ChloadError) -> str | None:
    """The bare name of the table an "X doesn't exist" error names (code 60), if any."""
    missing = re.search(_MISSING_TABLE, error.reason)
    return missing.group(1).replace("`", "").rpartition(".")[2] if missing else None


# -- a parse error, pinpointed ------------------------------------------------------------
_AT_ROW = r"\s*\(at row \d+\)"


def pinpointed(error: DataError, context: str, header_lines: int) -> DataError:
    """`error` naming the line of the file (its row after `header_lines`) and the column
    where the engine says so: `f.csv: line 12, column fare: <reason>`."""
    reason = re.sub(_AT_ROW, "", error.reason)
    if error.column:
        reason = reason.removeprefix(f"column {error.column}: ")
    where = f"line {error.row + header_lines}" if error.row else ""
    where += f", column {error.column}" if error.column else ""
    where = where.removeprefix(", ")
    pinned = DataError(context=context, reason=f"{where}: {reason}" if where else reason,
                       code=error.code)
    pinned.row, pinned.column = error.row, error.column
    return pinned
