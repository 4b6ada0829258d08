"""The native MySQL reader's small pieces that need no server: how a metadata row's
fields are unescaped, and string literals whatever the server's sql_mode."""

from __future__ import annotations

from chload.sources import mysql, mysql_native


def test_fields_are_unescaped_and_only_a_bare_backslash_n_is_null() -> None:
    assert mysql_native._field("\\N") is None
    assert mysql_native._field("\\\\N") == "\\N"
    assert mysql_native._field("NULL") == "NULL"
    assert mysql_native._field("a\\tb\\nc\\rd\\0e\\\\f") == "a\tb\nc\rd\0e\\f"
    assert mysql_native._field("plain") == "plain"


def test_string_literals_carry_any_name_as_hex() -> None:
    assert mysql._string("o'k\\") == "CONVERT(X'6f276b5c' USING utf8mb4)"
    assert mysql._string("") == "CONVERT(X'' USING utf8mb4)"


def test_the_client_is_used_when_asked() -> None:
    import os
    saved = dict(mysql_native._loaded)
    mysql_native._loaded.clear()
    os.environ["CHLOAD_MYSQL_READER"] = "client"
    try:
        lib, why = mysql_native.load()
        assert lib is None and "CHLOAD_MYSQL_READER" in why
    finally:
        del os.environ["CHLOAD_MYSQL_READER"]
        mysql_native._loaded.clear()
        mysql_native._loaded.update(saved)
