"""One NATS request from a route: JSON out, the reply's JSON back, NATS's own failures named.

The routes never see nats-py's exceptions: "no responders" (nobody subscribes: for a shard's
commands, no gateway holds that shard) and a timeout become :class:`NoResponders` and
:class:`NoAnswer`, a reply that is not a JSON object :class:`BadReply`, a request NATS cannot
carry :class:`TooLarge` (checked before it is sent) and the door's NATS being away
:class:`NatsAway`. Every call's reply comes through one inbox subscription (mux.py).
"""

from __future__ import annotations

import json
from typing import Any

import nats.errors
from nats.aio.client import Client

from services.web.mux import mux


class CallFailed(Exception):
    """The request got no usable reply."""


class NoResponders(CallFailed):
    """Nobody listens on the subject (NATS answered at once)."""


class NoAnswer(CallFailed):
    """Somebody listens, but no reply came within the timeout."""


class BadReply(CallFailed):
    """The reply is not a JSON object."""


class NatsAway(CallFailed):
    """The door's own NATS connection is down (reconnecting)."""


class TooLarge(CallFailed):
    """The request is more than NATS carries in one message."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request is larger than NATS carries ({limit} bytes)")
        self.limit = limit


HEADER_ROOM = 4096
"""Bytes kept for headers under ``max_payload``: the server counts headers and body together
and closes a connection that publishes over it (nats-py checks the body alone), which would cut
the door off NATS for every caller. The gateway keeps the same room for the same reason."""


async def call(nc: Client, subject: str, body: Any, timeout: float,
               headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Request ``subject`` with ``body`` (JSON) and return the reply object."""
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if nc is None or not nc.is_connected:
        raise NatsAway("not connected")
    limit = nc.max_payload - (HEADER_ROOM if headers else 0)
    if len(payload) > limit:
        raise TooLarge(limit)
    try:
        msg = await mux(nc).request(subject, payload, timeout, headers)
    except nats.errors.NoRespondersError as exc:
        raise NoResponders(subject) from exc
    except nats.errors.TimeoutError as exc:
        raise NoAnswer(subject) from exc
    except nats.errors.MaxPayloadError as exc:  # max_payload lowered by a server since the check
        raise TooLarge(nc.max_payload) from exc
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
            nats.errors.StaleConnectionError, nats.errors.OutboundBufferLimitError) as exc:
        raise NatsAway(type(exc).__name__) from exc
    try:
        reply = json.loads(msg.data)
    except ValueError as exc:
        raise BadReply(f"{subject}: reply is not JSON") from exc
    if not isinstance(reply, dict):
        raise BadReply(f"{subject}: reply is not a JSON object")
    return reply
