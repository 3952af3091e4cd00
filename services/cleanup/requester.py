"""The one door the cleanup logic talks through: a NATS request that returns decoded JSON.

The sweep, the reconcile and the ledger client only ever call :meth:`Requester.request`, so they
can be exercised without FastStream; the app hands them a :class:`NatsRequester` over the
broker's own nats-py connection. Transport failures become the failures of
:mod:`shared.nats_calls` the logic can classify: nobody subscribed (``NoResponders``), no answer
in time (``NoAnswer``), and NATS itself away (``NatsAway``, which the logic reads as a kind of no
answer: the connection is closed or draining, or cannot take the request
while it reconnects). Nothing else a transport can raise for NATS being away escapes, so an
outage is never a caller's 500 or a traceback.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from nats.aio.client import Client

from shared import nats_calls


class Requester(Protocol):
    """Request/reply over NATS: the decoded JSON answer, or raw text when it is not JSON."""

    async def request(self, subject: str, payload: dict[str, Any], timeout: float) -> Any: ...


class NatsRequester:
    """:class:`Requester` over a nats-py connection."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def request(self, subject: str, payload: dict[str, Any], timeout: float) -> Any:
        data = json.dumps(payload, separators=(",", ":")).encode()
        # A request too large for NATS raises nats-py's own MaxPayloadError, as it always has.
        msg = await nats_calls.request(self.client, subject, data, timeout, refuse_oversize=False)
        return decode(msg.data)


def decode(data: bytes) -> Any:
    """JSON if it parses, else the text as received (classified as garbage downstream)."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return data.decode("utf-8", errors="replace")
