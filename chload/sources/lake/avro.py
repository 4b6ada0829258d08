"""Avro object container files, read whole: the records of Iceberg's manifest lists and
manifests (a few records each: one per manifest, one per data file).

A reader of the spec's binary encoding (apache.org's Avro 1.11 specification, "Object
Container Files"), so that listing a table costs no heavy import: pyiceberg's reader
pulls in pandas and pyarrow.dataset. Codecs `null` and `deflate` (Iceberg's default for
metadata), and `zstandard` when its module is installed; logical types are left as
their underlying values (no row of data is read here, only metadata).
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

MAGIC = b"Obj\x01"


class AvroError(ValueError):
    """Bytes that are not an Avro container file this reader knows."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.buf = io.BytesIO(data)

    def read(self, n: int) -> bytes:
        out = self.buf.read(n)
        if len(out) != n:
            raise AvroError("truncated Avro data")
        return out

    def long(self) -> int:
        shift = result = 0
        while True:
            byte = self.read(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7

    def bytes_(self) -> bytes:
        return self.read(self.long())


def _decoder(schema: Any, named: dict[str, Any]) -> Callable[[_Reader], Any]:
    """A function decoding one value of `schema` (named types resolved through `named`)."""
    if isinstance(schema, list):
        branches = [_decoder(s, named) for s in schema]
        return lambda r: branches[r.long()](r)
    if isinstance(schema, str):
        primitive = _PRIMITIVES.get(schema)
        if primitive is not None:
            return primitive
        if schema not in named:
            raise AvroError(f"unknown Avro type {schema}")
        return lambda r: named[schema](r)
    kind = schema["type"]
    if kind == "record":
        fields: list[tuple[str, Callable[[_Reader], Any]]] = []
        named[schema["name"]] = lambda r: {n: d(r) for n, d in fields}
        fields += [(f["name"], _decoder(f["type"], named)) for f in schema["fields"]]
        return named[schema["name"]]
    if kind == "enum":
        symbols = schema["symbols"]
        named[schema["name"]] = lambda r: symbols[r.long()]
        return named[schema["name"]]
    if kind == "fixed":
        size = schema["size"]
        named[schema["name"]] = lambda r: r.read(size)
        return named[schema["name"]]
    if kind in ("array", "map"):
        item = _decoder(schema["items" if kind == "array" else "values"], named)
        key = _PRIMITIVES["string"] if kind == "map" else None
        return lambda r: _blocks(r, item, key)
    return _decoder(kind, named)  # {"type": "long", "logicalType": ...}


def _blocks(r: _Reader, item: Callable[[_Reader], Any],
            key: Callable[[_Reader], Any] | None) -> Any:
    out: list[Any] = []
    while (count := r.long()) != 0:
        if count < 0:
            count = -count
            r.long()  # the block's size in bytes
        out += [(key(r), item(r)) if key else item(r) for _ in range(count)]
    return dict(out) if key else out


_PRIMITIVES: dict[str, Callable[[_Reader], Any]] = {
    "null": lambda r: None,
    "boolean": lambda r: r.read(1) != b"\x00",
    "int": _Reader.long,
    "long": _Reader.long,
    "float": lambda r: struct.unpack("<f", r.read(4))[0],
    "double": lambda r: struct.unpack("<d", r.read(8))[0],
    "bytes": _Reader.bytes_,
    "string": lambda r: r.bytes_().decode("utf-8"),
}


def _decompress(codec: str, block: bytes) -> bytes:
    if codec == "null":
        return block
    if codec == "deflate":
        return zlib.decompress(block, -15)
    if codec == "zstandard":
        try:
            import zstandard
        except ImportError as exc:
            raise AvroError("zstandard-compressed Avro needs the Python package "
                            "zstandard") from exc
        return zstandard.ZstdDecompressor().decompressobj().decompress(block)
    raise AvroError(f"Avro codec {codec} is not read here (null, deflate, zstandard are)")


def records(data: bytes) -> Iterator[dict[str, Any]]:
    """The records of an Avro container file's bytes, in order."""
    r = _Reader(data)
    if r.read(4) != MAGIC:
        raise AvroError("not an Avro container file")
    meta = _blocks(r, _Reader.bytes_, _PRIMITIVES["string"])
    sync = r.read(16)
    decode = _decoder(json.loads(meta["avro.schema"]), {})
    codec = meta.get("avro.codec", b"null").decode() or "null"
    while r.buf.tell() < len(data):
        count, size = r.long(), r.long()
        block = _Reader(_decompress(codec, r.read(size)))
        for _ in range(count):
            yield decode(block)
        if r.read(16) != sync:
            raise AvroError("Avro block without its sync marker")
