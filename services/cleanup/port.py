"""The one door the cleanup logic talks through: a NATS request that returns decoded JSON.

The sweep, the reconcile and the ledger client only ever call :meth:`Port.request`, so they
can be exercised without FastStream; the app hands them a :class:`NatsPort` over the
broker's own nats-py connection. Transport failures become exceptions the logic can
classify: nobody subscribed (:class:`NoResponder`), no answer in time (:class:`NoAnswer`), and
NATS itself away (:class:`Unreachable`, a kind of no answer: the connection is closed or
draining, or cannot take the request while it reconnects). Nothing else a transport can
raise escapes, so an outage is never a caller's 500 or a traceback.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from nats.aio.client import Client
from nats.errors import (
    ConnectionClosedError,
    ConnectionDrainingError,
    ConnectionReconnectingError,
    NoRespondersError,
    NoServersError,
    OutboundBufferLimitError,
    StaleConnectionError,
)
from nats.errors import TimeoutError as NatsTimeoutError

NATS_AWAY: tuple[type[BaseException], ...] = (
    ConnectionClosedError, ConnectionDrainingError, ConnectionReconnectingError, OutboundBufferLimitError,
    StaleConnectionError, NoServersError, OSError)
"""What nats-py raises for a request when NATS is away rather than merely slow: the connection
closed (for good, or by a stop) or draining, reconnecting with its buffer full, stale; a socket
error. (A request made while it reconnects is buffered and, if NATS stays away, times out.)"""


class NoResponder(Exception):
    """Nothing subscribes to the subject (NATS answered "no responders" at once)."""


class NoAnswer(Exception):
    """A responder exists but did not answer within the timeout."""


class Unreachable(NoAnswer):
    """NATS is away: the request could not be sent (so, like a timeout, it may be retried)."""

    def __init__(self, subject: str, cause: BaseException) -> None:
        super().__init__(f"{subject}: NATS is unreachable ({type(cause).__name__})")
        self.reason = type(cause).__name__


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
        except (NatsTimeoutError, TimeoutError) as exc:  # before NATS_AWAY: a TimeoutError is an OSError
            raise NoAnswer(subject) from exc
        except NATS_AWAY as exc:
            raise Unreachable(subject, exc) from exc
        return decode(msg.data)


def decode(data: bytes) -> Any:
    """JSON if it parses, else the text as received (classified as garbage downstream)."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return data.decode("utf-8", errors="replace")
