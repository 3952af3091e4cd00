"""A stream just created with three replicas, used as soon as it can be: the tests that make one
on a real cluster share this wait (docs/reliability.md, "Scaling and replication")."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
from nats.js.api import PubAck
from nats.js.client import JetStreamContext


async def publish_when_led(js: JetStreamContext, subject: str, data: bytes, timeout: float = 30.0) -> PubAck:
    """Publish to a stream just created with three replicas, once it takes messages: its leader
    may still be being elected, or its interest not yet known across the routes (no responders;
    seen once in five runs of ``make test``). Made to happen, not hoped for: retried with one
    message id, so a try whose answer was lost is not stored twice."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await js.publish(subject, data, timeout=2, headers={"Nats-Msg-Id": f"once-{subject}"})
        except (nats.js.errors.NoStreamResponseError, nats.errors.TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)
