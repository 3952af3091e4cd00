"""One request answered by every replica (``shardbus.ping``, ``gateway.status``: no queue
group), its replies gathered from the caller's own inbox for a bounded time.

A plain ``request`` returns the first reply only. NATS's "no responders" status (nobody
subscribed) ends the wait at once with no replies. At most :data:`MAX_REPLIES` are kept, so a
flood on the inbox cannot grow the caller's memory."""

from __future__ import annotations

import asyncio
import json
from typing import Any

MAX_REPLIES = 1000
"""Replies kept (far more than any deployment has replicas); the wait ends when it is reached."""


async def scatter_gather(nc: Any, subject: str, payload: bytes, wait_s: float,
                         settle_s: float | None = None) -> list[dict[str, Any]]:
    """Publish one request and gather every JSON object reply within ``wait_s``; with
    ``settle_s``, stop that long after the first reply instead (an interactive page waits for
    the replicas that answer together, not for the whole window)."""
    inbox = nc.new_inbox()
    replies: list[dict[str, Any]] = []
    first, done = asyncio.Event(), asyncio.Event()

    async def on_reply(msg: Any) -> None:
        if msg.headers and msg.headers.get("Status") == "503":  # no responders
            done.set()
            return
        try:
            data = json.loads(msg.data)
        except ValueError:
            return
        if isinstance(data, dict) and len(replies) < MAX_REPLIES:
            replies.append(data)
            first.set()
        if len(replies) >= MAX_REPLIES:
            done.set()

    sub = await nc.subscribe(inbox, cb=on_reply)
    try:
        await nc.publish(subject, payload, reply=inbox)
        waits = {asyncio.ensure_future(done.wait())}
        if settle_s is not None:
            waits.add(asyncio.ensure_future(first.wait()))
        try:
            await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if settle_s is not None and replies and not done.is_set():
            await asyncio.sleep(settle_s)
    finally:
        await sub.unsubscribe()
    return replies
