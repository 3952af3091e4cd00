"""The shard wire: newline-delimited JSON, one object per line, with a cap on line length
enforced while reading (an over-long line is never held whole)."""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass
from typing import Any

from shared.subjects import is_shard_id


class LineTooLong(Exception):
    """The shard sent a line longer than the configured cap."""


class HelloRefused(Exception):
    """The first line was not an acceptable ``server.hello``; the message says why."""


async def read_line(reader: asyncio.StreamReader, cap: int) -> bytes | None:
    """The next line without its ``\\n``; None at end of stream; LineTooLong past ``cap``.

    ``StreamReader``'s own limit is set to ``cap`` by the listener, so an over-long line
    raises before it is buffered whole."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        line = exc.partial
    except asyncio.LimitOverrunError as exc:
        raise LineTooLong(f"line longer than {cap} bytes") from exc
    if len(line) > cap + 1:
        raise LineTooLong(f"line longer than {cap} bytes")
    return line.rstrip(b"\n").rstrip(b"\r")


@dataclass(frozen=True)
class Hello:
    """A shard's accepted ``server.hello``."""

    shard: str
    protocol: int


def check_hello(line: bytes, expected_token: str) -> Hello:
    """Parse the first line; HelloRefused names what is wrong (never the token's value)."""
    try:
        frame: Any = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HelloRefused(f"first line is not JSON: {exc.__class__.__name__}") from None
    if not isinstance(frame, dict) or frame.get("kind") != "server.hello":
        raise HelloRefused("first line must be a server.hello object")
    shard = frame.get("shard")
    if not is_shard_id(shard):
        raise HelloRefused("server.hello: shard must match [a-z0-9_-]{1,32}")
    protocol = frame.get("protocol")
    if not isinstance(protocol, int) or isinstance(protocol, bool):
        raise HelloRefused("server.hello: protocol must be an integer")
    token = frame.get("token")
    if not isinstance(token, str) or not hmac.compare_digest(token.encode(), expected_token.encode()):
        raise HelloRefused("server.hello: wrong or missing token")
    return Hello(shard=shard, protocol=protocol)
