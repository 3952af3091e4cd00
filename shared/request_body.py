"""Reading a request body so that what Python's ``json`` cannot read is a 400, not a 500.

The ledger and cleanup decode their request bodies with :func:`decode_body` (FastStream's
``decoder=``): an integer with more digits than Python converts (4,300) becomes an
:class:`OversizedNumber`, which the request model's validation refuses naming its field; a
body that is not JSON, or nested deeper than Python's recursion limit, is handed on as its
bytes, which no request model takes (a 400 naming the body)."""

from __future__ import annotations

import json
from typing import Any

INT_DIGITS_MAX = 4300
"""Python's default limit on the digits of an integer read from text."""


class OversizedNumber:
    """A JSON integer with more digits than Python reads: it fails validation naming its field
    (a 400) instead of failing the decoding (a 500)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<a number of {self.digits} digits>"


def _read_int(text: str) -> int | OversizedNumber:
    digits = len(text) - text.startswith("-")
    return OversizedNumber(digits) if digits > INT_DIGITS_MAX else int(text)


async def decode_body(msg: Any) -> Any:
    """A request body as its JSON value, or its bytes when it is no JSON Python can read."""
    return read_body(msg.body)


def read_body(body: bytes) -> Any:
    """:func:`decode_body` of a body's bytes (a service's own nats-py subscriptions read with it)."""
    try:
        return json.loads(body, parse_int=_read_int)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return body
