"""Input formats and compression: detection from a name, ClickHouse's names for them.

The engine detects compression from the file extension by itself; we still need to
know it to strip it before looking at the format extension, to tell a server what
`Content-Encoding` a body has, and to let `--compression` override a misleading name.
"""

from __future__ import annotations

from dataclasses import dataclass

from chload.errors import UsageError

# extension -> ClickHouse compression method name (the `compression` argument of file())
COMPRESSIONS = {
    ".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2",
    ".xz": "xz", ".lz4": "lz4", ".br": "br", ".snappy": "snappy", ".deflate": "deflate",
}
COMPRESSION_NAMES = sorted({*COMPRESSIONS.values(), "none", "auto"})
# A file's first bytes -> its compression, for a name that does not say (a download
# saved as trips.csv that is gzip): the engine decides by the name alone.
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bz2"),
         (b"\xfd7zXZ\x00", "xz"), (b"\x04\x22\x4d\x18", "lz4"))

# extension -> ClickHouse format; CSV/TSV get their header decided later (see schema.py)
FORMATS = {
    ".csv": "CSV", ".tsv": "TSV", ".tab": "TSV", ".json": "JSONEachRow",
    ".jsonl": "JSONEachRow", ".ndjson": "JSONEachRow", ".parquet": "Parquet",
    ".pq": "Parquet", ".orc": "ORC", ".avro": "Avro", ".native": "Native",
    ".arrow": "Arrow", ".arrows": "ArrowStream", ".msgpack": "MsgPack",
}

# Formats whose first line may be a header of column names.
HEADER_FORMATS = {"CSV": "CSVWithNames", "TSV": "TSVWithNames", "TabSeparated": "TSVWithNames"}
# Formats where a line number means something (rejected rows, progress by line).
# Formats of one JSON object a row (JSON lines).
JSON_LINES = frozenset({"JSONEachRow", "JSONLines", "NDJSON"})
LINE_FORMATS = {"CSV", "CSVWithNames", "TSV", "TSVWithNames", "TabSeparated",
                "TabSeparatedWithNames", "JSONEachRow", "JSONLines", "NDJSON"}


@dataclass(frozen=True, slots=True)
class FileFormat:
    """How the engine should read one source: format name and compression method."""

    name: str  # a ClickHouse input format name
    compression: str  # a ClickHouse compression method, or "none"
    delimiter: str = ""  # CSV's field separator when not `,` (format_csv_delimiter)

    @property
    def has_header(self) -> bool:
        return self.name.endswith("WithNames") or self.name.endswith("WithNamesAndTypes")


def split_compression(name: str) -> tuple[str, str]:
    """`trips.csv.gz` -> (`trips.csv`, `gzip`); no known suffix -> (name, `none`)."""
    lower = name.lower()
    for ext, method in COMPRESSIONS.items():
        if lower.endswith(ext):
            return name[: -len(ext)], method
    return name, "none"


def detect(name: str, fmt: str | None = None, compression: str | None = None,
           strict: bool = True) -> FileFormat:
    """The format of a source from its name, with user overrides taking precedence.
    A name that does not tell is a UsageError, or with `strict=False` a format named
    '' (a listing's README.txt or Spark's _SUCCESS: the run decides, core/load.py `_told`)."""
    base, method = split_compression(name)
    if compression and compression != "auto":
        method = compression
    if fmt:
        return FileFormat(fmt, method)
    lower = base.lower()
    for ext, format_name in FORMATS.items():
        if lower.endswith(ext):
            return FileFormat(format_name, method)
    if not strict:
        return FileFormat("", method)
    raise UsageError(untold(name))


def magic(head: bytes) -> str:
    """The compression a file's first bytes show ("none" if none)."""
    return next((m for sign, m in MAGIC if head.startswith(sign)), "none")


def untold(name: str) -> str:
    """Why a file whose name does not tell its format is not read, and what to do."""
    known = ", ".join(sorted(FORMATS))
    return (f"{name}: cannot tell the format from the name (known extensions: {known}); "
            "pass --format (e.g. --format CSVWithNames), or leave it out of the sources "
            "(e.g. data/*.csv rather than data/)")


def check_compression(value: str) -> str:
    """Validate a --compression value up front, listing the allowed ones."""
    if value not in COMPRESSION_NAMES:
        raise UsageError(
            f"--compression {value}: unknown; use one of {', '.join(COMPRESSION_NAMES)}"
        )
    return value
