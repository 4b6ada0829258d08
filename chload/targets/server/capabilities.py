"""What a ClickHouse server can do, asked once at connect.

The plan follows answers, not version numbers: input formats, table functions,
settings, data types, `max_threads`, and which `Content-Encoding`s a request body may
have. Everything but the encodings comes back in one query; an encoding is tried (a tiny
`SELECT 1` so compressed) the first time a file compressed that way is planned.

Invariant: `server_type` maps a type chDB inferred down to the server's only where no
value can change (Bool -> UInt8, DateTime64(0) -> DateTime, LowCardinality(T) -> T where
it is still experimental) and refuses the rest in one line naming the column and
`--schema`. docs/target-server.md ("What happens") is the user's side.
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from chload.errors import SchemaError, TerminalError
from chload.schema import AUDIT_COLUMNS, Column, schema_argument

# "SELECT 1" compressed by each method (made once with the standard library, or for
# zstd, br and lz4 with chDB's file() writer): no compression module is imported.
_PROBES: dict[str, bytes] = {
    "gzip": bytes.fromhex("1f8b08000000000002030b76f571750e513004009b397f6608000000"),
    "deflate": bytes.fromhex("789c0b76f571750e513004000a1d0212"),
    "zstd": bytes.fromhex("28b52ffd045840000053454c4543542031010000ba7526b3"),
    "br": bytes.fromhex("8f038053454c454354203103"),
    "lz4": bytes.fromhex("04224d184050770800008053454c454354203100000000"),
    "xz": bytes.fromhex("fd377a585a000004e6d6b4460200210116000000742fe5a301000753454c"
                        "4543542031007347eb23ad2ced6700012008bb19d9bb1fb6f37d01000000"
                        "0004595a"),
    "bz2": bytes.fromhex("425a6839314159265359acc39b2e0000031e00400020000a040c00200031"
                        "0c010699a1ce0a145dc914e14242b30e6cb8"),
}

_PROBE_SQL = """SELECT 'version' AS k, version() AS v
UNION ALL SELECT 'timezone', timezone()
UNION ALL SELECT 'max_threads', value FROM system.settings WHERE name = 'max_threads'
UNION ALL SELECT 'format', name FROM system.formats WHERE is_input
UNION ALL SELECT 'function', name FROM system.table_functions
UNION ALL SELECT 'setting', name FROM system.settings
UNION ALL SELECT 'type', name FROM system.data_type_families
UNION ALL SELECT 'ledger', name FROM system.tables WHERE database = 'chload'
UNION ALL SELECT 'ledger', concat(table, '.', name) FROM system.columns
    WHERE database = 'chload' AND ((table = 'files' AND name = 'table_uuid')
    OR (table = 'runs' AND name = 'concurrency'))"""


@dataclass(frozen=True, slots=True)
class Capabilities:
    version: str
    timezone: str = "UTC"
    max_threads: int = 2
    input_formats: frozenset[str] = frozenset()
    table_functions: frozenset[str] = frozenset()
    settings: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    encodings: frozenset[str] = frozenset()  # known to be accepted without asking
    ledger_tables: frozenset[str] = field(default=frozenset(), compare=False)
    # post_encoded(method, body) -> True once the server ran the compressed body
    post_encoded: Callable[[str, bytes], bool] | None = field(default=None, compare=False)
    _asked: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)
    _asking: threading.Lock = field(default_factory=threading.Lock, compare=False,
                                    repr=False)

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", self.version)[:3])

    def parses(self, fmt: str) -> bool:
        return fmt in self.input_formats

    def accepts(self, compression: str) -> bool:
        """True when a body compressed this way can be posted as is; asked of the server
        the first time. A server that cannot answer now raises (TransientError): a
        failed probe must not send every file down the slow path for the whole run."""
        if compression == "none" or compression in self.encodings:
            return True
        if self.post_encoded is None or compression not in _PROBES:
            return False
        with self._asking:
            if compression not in self._asked:
                try:
                    self._asked[compression] = self.post_encoded(compression,
                                                                 _PROBES[compression])
                except TerminalError:  # e.g. Code: 89, Unknown Content-Encoding
                    self._asked[compression] = False
            return self._asked[compression]

    @property
    def dedup_tokens(self) -> bool:
        return "insert_deduplication_token" in self.settings

    @property
    def low_cardinality_experimental(self) -> bool:
        return "allow_experimental_low_cardinality_type" in self.settings


def probe(query: Callable[[str], str],
          post_encoded: Callable[[str, bytes], bool] | None = None) -> Capabilities:
    """Ask the server in one query. `query(sql)` returns TSV; `post_encoded(method,
    body)` (True when the server ran the compressed body) is called later, by
    `accepts`, once per encoding a load needs."""
    found: dict[str, set[str]] = {}
    for line in query(_PROBE_SQL).splitlines():
        key, _, value = line.partition("\t")
        found.setdefault(key, set()).add(value)

    def one(key: str, default: str) -> str:
        return next(iter(found.get(key, {default})))

    threads = re.findall(r"\d+", one("max_threads", "2"))
    return Capabilities(
        version=one("version", "0"), timezone=one("timezone", "UTC"),
        max_threads=int(threads[-1]) if threads else 2,
        input_formats=frozenset(found.get("format", ())),
        table_functions=frozenset(found.get("function", ())),
        settings=frozenset(found.get("setting", ())), types=frozenset(found.get("type", ())),
        ledger_tables=frozenset(found.get("ledger", ())), post_encoded=post_encoded,
    )


def probe_gzipped(ask: Callable[[str, bytes | None], str],
                  post_encoded: Callable[[str, bytes], bool] | None = None) -> Capabilities:
    """As `probe`, the question sent gzip-compressed (`ask(sql, body)`; body None: plain):
    an answer says the server reads gzip bodies too, so a load's first gzip file is not
    held back by asking (a round trip on its way to the first byte). A server that
    refuses the encoding (Code 89, Unknown Content-Encoding) is asked plainly."""
    def gzipped(sql: str) -> bytes:
        packer = zlib.compressobj(wbits=31)  # gzip framing
        return packer.compress(sql.encode()) + packer.flush()

    try:
        caps = probe(lambda sql: ask(sql, gzipped(sql)), post_encoded)
    except TerminalError:
        return probe(lambda sql: ask(sql, None), post_encoded)
    return replace(caps, encodings=caps.encodings | {"gzip"})


# -- types ----------------------------------------------------------------------------

_WRAPPERS = ("Nullable", "Array", "LowCardinality")
_DATETIME64 = re.compile(r"^DateTime64\((\d+)(?:,\s*('[^']*'))?\)$")


def storable(typ: str, caps: Capabilities) -> str:
    """`typ` mapped down where that changes no value; unchanged where it cannot be (the
    table may exist with its own type for it; creating one checks: `server_columns`)."""
    try:
        return server_type(typ, caps, "", "")
    except SchemaError:
        return typ


_SUFFIX = re.compile(r"\s+(?:DEFAULT|MATERIALIZED|ALIAS|CODEC|COMMENT)\b")


def server_columns(columns: Sequence[Column], caps: Capabilities, where: str) -> list[Column]:
    """Columns for a CREATE TABLE here: each type as `server_type` stores it (a DEFAULT,
    CODEC, ... after it kept). Types the server cannot store are one SchemaError naming
    every such column and a whole --schema that loads (`_refusal`)."""
    stored, refused = [], []
    for column in columns:
        suffix = _SUFFIX.search(column.type)
        cut = suffix.start() if suffix else len(column.type)
        try:
            typ = server_type(column.type[:cut], caps, column.name, where)
        except SchemaError as exc:
            refused.append((column, exc))
            continue
        stored.append(Column(column.name, typ + column.type[cut:], column.default_kind))
    if refused:
        raise _refusal(columns, stored, refused, caps, where)
    return stored


def _refusal(columns: Sequence[Column], stored: Sequence[Column],
             refused: Sequence[tuple[Column, SchemaError]], caps: Capabilities,
             where: str) -> SchemaError:
    """One line for every column this server cannot store: what each may be instead,
    and a whole --schema (the others as stored, those as String) that loads."""
    kept = {c.name: c.type for c in stored}
    whole = schema_argument(
        (c.name, kept.get(c.name) or ("Nullable(String)" if c.type.startswith("Nullable(")
                                      else "String"))
        for c in columns if not c.default_kind and c.name not in AUDIT_COLUMNS)
    if len(refused) == 1:
        return SchemaError(f"{refused[0][1]}; a whole --schema: {whole}")
    which = ", ".join(f"{c.name} ({c.type})" for c, _ in refused)
    ways = "; ".join(f"{c.name}: {_hint(c.type)}" for c, _ in refused)
    return SchemaError(f"{where}: columns {which} have types ClickHouse {caps.version} "
                       f"cannot store; pass --schema with types it has for them ({ways}), "
                       f"e.g. --schema {whole}")


def server_type(typ: str, caps: Capabilities, column: str, where: str) -> str:
    """`typ` as this server can store it without changing any value; else SchemaError."""
    typ = typ.strip()
    family = typ.split("(", 1)[0]
    inner = typ[len(family) + 1:-1] if "(" in typ else ""
    if family == "LowCardinality" and ("LowCardinality" not in caps.types
                                       or caps.low_cardinality_experimental):
        return server_type(inner, caps, column, where)
    if family in _WRAPPERS:
        return f"{family}({server_type(inner, caps, column, where)})"
    if family == "Tuple" and "Tuple" in caps.types:
        return f"Tuple({', '.join(server_type(p, caps, column, where) for p in _split(inner))})"
    digits = re.match(r"Decimal\((\d+)", typ)
    if digits and int(digits.group(1)) > 38 and "Decimal256" not in caps.types:
        raise SchemaError(  # 18.16's Decimal: 38 digits (the CREATE said "Wrong precision")
            f"{where}: column {column} has type {typ}, which ClickHouse {caps.version} "
            f"cannot store (its Decimal holds 38 digits); pass --schema with a type it has "
            f"for {column}, e.g. String")
    if family in caps.types or family in ("Tuple", "Nested"):
        return typ
    if family == "Bool":
        return "UInt8"
    match = _DATETIME64.match(typ)
    if match and match.group(1) == "0" and "DateTime" in caps.types:
        return f"DateTime({match.group(2)})" if match.group(2) else "DateTime"
    raise SchemaError(
        f"{where}: column {column} has type {typ}, which ClickHouse {caps.version} cannot "
        f"store; pass --schema with a type it has for {column}, e.g. {_hint(typ)}"
    )


def _hint(typ: str) -> str:
    """What a column of `typ` may be on a server that lacks it."""
    bare = re.sub(r"^(?:(?:Nullable|LowCardinality|Array)\()+", "", typ)
    family = bare.split("(", 1)[0].rstrip(")")
    return {"DateTime64": "DateTime (drops fractions of a second) or String",
            "Date32": "Date (1970 to 2105 only on 18.16) or String"}.get(family, "String")


def _split(args: str) -> list[str]:
    """Split 'a, Tuple(b, c), d' at top-level commas."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(args + ","):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(args[start:i].strip())
            start = i + 1
    return [p for p in parts if p]
