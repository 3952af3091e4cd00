"""The one place shardbus goes beneath asyncio's public API: once a shard's hello is checked, the
gateway takes its connection over from the ``StreamReader`` that read the hello, and with it
the bytes that reader had already read past the hello and whether the shard had closed
(asyncio has no public way to take them back). ``tests/shared/test_library_fences.py`` fails on
a Python whose ``StreamReader`` keeps them elsewhere."""

from __future__ import annotations

import asyncio
from typing import Any


def unread_and_eof(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """What ``reader`` has read and not handed out yet, and whether the peer has closed."""
    return bytes(reader._buffer), bool(reader._eof)  # type: ignore[attr-defined]


def incompatibilities(reader_class: type[Any] = asyncio.StreamReader) -> list[str]:
    """What this file uses that this Python's ``StreamReader`` lacks (empty: all there)."""
    reader = reader_class()
    found = []
    if not isinstance(getattr(reader, "_buffer", None), bytearray):
        found.append("StreamReader()._buffer is not a bytearray")
    if not isinstance(getattr(reader, "_eof", None), bool):
        found.append("StreamReader()._eof is not a bool")
    return found
