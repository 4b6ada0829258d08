"""The native MySQL reader's small pieces that need no server: how a metadata row's
fields are unescaped, and string literals whatever the server's sql_mode."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from chload.runtime import native
from chload.sources.databases import mysql, mysql_native


def test_fields_are_unescaped_and_only_a_bare_backslash_n_is_null() -> None:
    assert mysql_native._field("\\N") is None
    assert mysql_native._field("\\\\N") == "\\N"
    assert mysql_native._field("NULL") == "NULL"
    assert mysql_native._field("a\\tb\\nc\\rd\\0e\\\\f") == "a\tb\nc\rd\0e\\f"
    assert mysql_native._field("plain") == "plain"


def test_string_literals_carry_any_name_as_hex() -> None:
    assert mysql._string("o'k\\") == "CONVERT(X'6f276b5c' USING utf8mb4)"
    assert mysql._string("") == "CONVERT(X'' USING utf8mb4)"


def test_the_client_is_used_when_asked(monkeypatch) -> None:
    monkeypatch.setenv("CHLOAD_MYSQL_READER", "client")
    lib, why = native.Once(mysql_native._build)()  # a fresh memo: the module's may be built
    assert lib is None and "CHLOAD_MYSQL_READER" in why


def test_a_reader_is_built_once_per_process_even_when_threads_ask_together() -> None:
    calls = []

    def build() -> tuple[object, str]:
        calls.append(1)
        time.sleep(0.05)  # long enough for the other threads to ask meanwhile
        return object(), ""

    once = native.Once(build)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: once(), range(4)))
    assert len(calls) == 1 and all(g is got[0] for g in got)
