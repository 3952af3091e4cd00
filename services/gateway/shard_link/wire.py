"""The shard wire: newline-delimited JSON, one object per line, with a cap on line length
enforced while reading (an over-long line is never held whole), the ``server.hello`` check,
and the sorting of each line into a frame or a dead letter."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from shared.errors import ShardbusError
from shared.subjects import is_safe_kind, is_shard_id


class LineTooLong(ShardbusError):
    """The shard sent a line longer than the configured cap (the link ends: docs/gateway.md)."""

    status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE


class HelloRefused(ShardbusError):
    """The first line was not an acceptable ``server.hello``; the message says why (the link
    is refused: docs/gateway.md)."""

    status = HTTPStatus.UNAUTHORIZED


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


class _NotInterchangeable(ValueError):
    """JSON that RFC 8259 parsers do not all read the same way."""


def _no_constant(name: str) -> Any:
    raise _NotInterchangeable(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _NotInterchangeable(f"the key {twice[:40]!r} appears twice")
    return obj


_STRICT = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
"""Built once: ``json.loads`` with these options would build a decoder per line."""


def parse_object(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """The line as a JSON object, or None and the reason it is not one.

    Only what every RFC 8259 parser reads the same way, since websites parse the frame
    again (``JSON.parse``): UTF-8 without a byte-order mark (``json.loads`` would also
    accept UTF-16/32 and a BOM), no ``NaN``/``Infinity``, no key twice (which one wins
    differs between parsers)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    if text.startswith("\ufeff"):
        return None, "starts with a byte-order mark"
    try:
        value = _STRICT.decode(text)
    except _NotInterchangeable as exc:
        return None, f"malformed JSON: {exc}"
    except RecursionError:
        return None, "malformed JSON: nested too deeply"
    except ValueError as exc:  # JSONDecodeError, huge integers
        return None, f"malformed JSON: {exc.__class__.__name__}"
    if not isinstance(value, dict):
        return None, f"not a JSON object ({type(value).__name__})"
    return value, ""


@dataclass(frozen=True)
class Frame:
    """A line the gateway publishes: its bytes, its kind and its parsed object."""

    data: bytes
    kind: str
    body: dict[str, Any]


@dataclass(frozen=True)
class DeadLetter:
    """A line that cannot be a frame, and why."""

    data: bytes
    reason: str


def sort_line(line: bytes) -> Frame | DeadLetter:
    """A frame when the line is a JSON object with a safe ``kind``, else a dead letter."""
    body, problem = parse_object(line)
    if body is None:
        return DeadLetter(line, problem)
    if "kind" not in body:
        return DeadLetter(line, "frame has no kind")
    kind = body["kind"]
    if not is_safe_kind(kind):
        return DeadLetter(line, f"kind is not a safe subject tail: {str(kind)[:80]!r}")
    return Frame(line, kind, body)


@dataclass(frozen=True)
class Hello:
    """A shard's accepted ``server.hello``."""

    shard: str
    protocol: int


def check_hello(line: bytes, token_for: Callable[[str], str] | str) -> Hello:
    """Parse the first line; HelloRefused names what is wrong (never the token's value).

    ``token_for`` gives the token configured for a shard id (or is one token for all)."""
    frame, problem = parse_object(line)
    if frame is None:
        raise HelloRefused(f"first line is not a JSON object: {problem}")
    if frame.get("kind") != "server.hello":
        raise HelloRefused("first line must be a server.hello object")
    shard = frame.get("shard")
    if not isinstance(shard, str) or not is_shard_id(shard):
        raise HelloRefused("server.hello: shard must match [a-z0-9_-]{1,32}")
    protocol = frame.get("protocol")
    if not isinstance(protocol, int) or isinstance(protocol, bool):
        raise HelloRefused("server.hello: protocol must be an integer")
    expected = token_for if isinstance(token_for, str) else token_for(shard)
    if not expected:
        # An unset token must lock shards out, not let an empty token in.
        raise HelloRefused(f"server.hello: no token is configured for shard {shard!r}")
    token = frame.get("token")
    if not isinstance(token, str) or not hmac.compare_digest(token.encode(), expected.encode()):
        raise HelloRefused("server.hello: wrong or missing token")
    return Hello(shard=shard, protocol=protocol)
