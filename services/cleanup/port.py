"""The one door the cleanup logic talks through: a NATS request that returns decoded JSON.

The sweep, the reconcile and the ledger client only ever call :meth:`Port.request`, so they
can be exercised without FastStream; the app hands them a :class:`NatsPort` over the
broker's own nats-py connection. Transport failures become two exceptions the logic can
classify: nobody subscribed (:class:`NoResponder`) and no answer in time (:class:`NoAnswer`).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError


class NoResponder(Exception):
    """Nothing subscribes to the subject (NATS answered "no responders" at once)."""


class NoAnswer(Exception):
    """A responder exists but did not answer within the timeout."""


class Port(Protocol):
    """Request/reply over NATS: the decoded JSON answer, or raw text when it is not JSON."""

    async def request(self, subject: str, payload: dict[str, Any], timeout: float) -> Any: ...


class NatsPort:
    """:class:`Port` over a nats-py connection."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def request(self, subject: str, payload: dict[str, Any], timeout: float) -> Any:
        data = json.dumps(payload, separators=(",", ":")).encode()
        try:
            msg = await self.client.request(subject, data, timeout=timeout)
        except NoRespondersError as exc:
            raise NoResponder(subject) from exc
        except (NatsTimeoutError, TimeoutError) as exc:
            raise NoAnswer(subject) from exc
        return decode(msg.data)


def decode(data: bytes) -> Any:
    """JSON if it parses, else the text as received (classified as garbage downstream)."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return data.decode("utf-8", errors="replace")
