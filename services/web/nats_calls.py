"""One NATS request from a route: JSON out, the reply's JSON back, NATS's own failures named.

The routes never see nats-py's exceptions: :func:`shared.nats_calls.request` names them —
"no responders" (nobody subscribes: for a shard's commands, no gateway holds that shard) is
:class:`NoResponders`, a timeout :class:`NoAnswer`, a request NATS cannot carry :class:`TooLarge`
(checked before it is sent) and the door's NATS being away :class:`NatsAway` — and a reply that
is not a JSON object is :class:`BadReply`. The door's only addition: every call's reply comes
through one inbox subscription (mux.py).
"""

from __future__ import annotations

import json
from typing import Any

from nats.aio.client import Client

from services.web.mux import mux
from shared.nats_calls import BadReply, CallFailed, NatsAway, NoAnswer, NoResponders, TooLarge, json_object, request

__all__ = ["BadReply", "CallFailed", "NatsAway", "NoAnswer", "NoResponders", "TooLarge", "call"]


async def call(nc: Client, subject: str, body: Any, timeout: float,
               headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Request ``subject`` with ``body`` (JSON) and return the reply object."""
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if nc is None or not nc.is_connected:
        raise NatsAway(f"{subject}: the door is not connected to NATS", "not connected")
    msg = await request(nc, subject, payload, timeout, headers, send=mux(nc).request)
    return json_object(subject, msg.data)
