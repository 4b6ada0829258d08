"""The native Kafka reader: spool.c, compiled on first use, through ctypes.

Why: reading through confluent-kafka makes a Python object per message, and that alone
took longer than loading the same rows from a file (docs/sources-kafka.md). The C reader
writes message values straight into the spool files with librdkafka's batch API, all
of a round's partitions at once; ctypes releases the GIL during the call, so it can
read the next round while the engine loads this one.

It is built with the system `cc` against the librdkafka that confluent-kafka bundles
(the same library the Python client uses), or the system's librdkafka.so.1, into
`$CHLOAD_CACHE` or ~/.cache/chload/native, named by a hash of its source and the
library, so an upgrade rebuilds it. No compiler or no library: `load()` says why
and the Python reader is used (same spools, slower).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chload.errors import SourceError
from chload.runtime import native

SOURCE = Path(__file__).with_name("spool.c")
TIMEOUT_MS = 30_000  # no message for this long while offsets are still due: fail



class NativeUnit(ctypes.Structure):
    """chl_unit in spool.c (same order and types)."""

    _fields_ = [("topic", ctypes.c_char_p), ("partition", ctypes.c_int32),
                ("fd", ctypes.c_int32), ("first", ctypes.c_int64), ("last", ctypes.c_int64),
                ("audit", ctypes.c_int32), ("contiguous", ctypes.c_int32),
                ("messages", ctypes.c_int64), ("bytes", ctypes.c_int64),
                ("first_offset", ctypes.c_int64), ("expect", ctypes.c_int64),
                ("done", ctypes.c_int32), ("used", ctypes.c_int32), ("rkt", ctypes.c_void_p),
                ("buf", ctypes.c_void_p)]


def librdkafka() -> str:
    """The librdkafka to link: confluent-kafka's own, else the system's; '' if none."""
    try:
        import confluent_kafka
    except ImportError:
        return ""
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    bundled = sorted(glob.glob(str(libs / "librdkafka*.so*")))
    if bundled:
        return bundled[0]
    return native.system_library(["librdkafka.so.1"], "rdkafka")


def _build() -> tuple[Any, str]:
    if os.environ.get("CHLOAD_KAFKA_READER") == "python":
        return None, "CHLOAD_KAFKA_READER=python"
    rdkafka = librdkafka()
    if not rdkafka:
        return None, "no librdkafka found (confluent-kafka's nor the system's)"
    lib, why = native.load(SOURCE, rdkafka, "chload_kafka", "native Kafka reader", _bind)
    if lib is None:
        return None, why
    if lib.chl_unit_size() != ctypes.sizeof(NativeUnit):
        return None, "the native Kafka reader's unit struct differs from kafka_native's"
    return lib, ""


def _bind(lib: Any) -> Any:
    lib.chl_open.restype = ctypes.c_void_p
    lib.chl_open.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
                             ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.chl_read.restype = ctypes.c_int
    lib.chl_read.argtypes = [ctypes.c_void_p, ctypes.POINTER(NativeUnit), ctypes.c_int,
                             ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.chl_unit_size.restype = ctypes.c_size_t
    lib.chl_unit_size.argtypes = []
    lib.chl_close.restype = None
    lib.chl_close.argtypes = [ctypes.c_void_p]
    return lib


class NativeReader:
    """One librdkafka consumer (assign only: no group join, no offsets committed)."""

    def __init__(self, lib: Any, config: dict[str, str]) -> None:
        self.lib = lib
        names = (ctypes.c_char_p * len(config))(*(k.encode() for k in config))
        values = (ctypes.c_char_p * len(config))(*(str(v).encode() for v in config.values()))
        err = ctypes.create_string_buffer(512)
        self.handle = lib.chl_open(names, values, len(config), err, len(err))
        if not self.handle:
            raise SourceError(f"kafka at {config.get('bootstrap.servers')}: "
                              f"{err.value.decode(errors='replace')}")

    def close(self) -> None:
        if self.handle:
            self.lib.chl_close(self.handle)
            self.handle = None

    def read(self, units: Sequence[tuple[str, int, int, int, int, int]]) -> list[NativeUnit]:
        """(topic, partition, first, last, fd, audit) each: read all at once; `audit`
        (read.AUDIT_*): each value gets the message's Kafka columns as its last
        fields (read.audited, audited_line)."""
        array = (NativeUnit * len(units))()
        for slot, (topic, partition, first, last, fd, audit) in zip(array, units,
                                                                     strict=True):
            slot.topic, slot.partition, slot.first, slot.last = (topic.encode(), partition,
                                                                 first, last)
            slot.fd, slot.audit = fd, audit
        err = ctypes.create_string_buffer(1024)
        if self.lib.chl_read(self.handle, array, len(units), TIMEOUT_MS, err, len(err)):
            raise SourceError(err.value.decode(errors="replace"))
        return list(array)


load = native.Once(_build)  # the compiled reader, or None and why not (one line)
