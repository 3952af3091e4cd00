"""The JetStream streams the gateway publishes to: every frame, and every line that could not
be one (dead letters), each de-duplicating by message id."""

from __future__ import annotations

import json
import logging
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import APIError, BadRequestError

from services.gateway.settings import GatewaySettings
from shared import natspy_internals, subjects
from shared.nats_calls import json_object

log = logging.getLogger("shardbus.gateway")

NAME_IN_USE = 10058
"""JetStream's error code: a stream of that name exists with another configuration."""

API_TIMEOUT_S = 5.0


async def declare_streams(nc: Client, js: JetStreamContext, settings: GatewaySettings) -> bool:
    """Create (or update) the frames and dead-letter streams, de-duplicating by message id; True
    when the frames stream takes fast-ingest batches (``settings.fast_ingest`` and a server that
    has them: nats-server 2.14 and later; docs/gateway.md, "What a shard may rely on")."""
    window = settings.duplicate_window_s
    letters = StreamConfig(name=settings.deadletter_stream, subjects=[subjects.DEADLETTER_WILDCARD],
                           duplicate_window=window, num_replicas=settings.jetstream_replicas)
    try:
        await js.add_stream(letters)
    except BadRequestError:
        await js.update_stream(letters)
    frames = StreamConfig(name=settings.frames_stream, subjects=[subjects.FRAMES_WILDCARD],
                          duplicate_window=window, num_replicas=settings.jetstream_replicas)
    batched = await declare_batched_stream(nc, frames, settings.fast_ingest)
    if settings.fast_ingest and not batched:
        log.warning("nats-server does not take fast-ingest batches (2.14 and later do): frames are "
                    "published plainly, and a leader change can break a shard's order",
                    extra={"stream": settings.frames_stream})
    # nats-py sets up publish_async's reply subscription on first use, unguarded: two
    # shards publishing at once could each set it up and lose the other's acks.
    await natspy_internals.ensure_publish_async_reply(js)
    return batched


async def declare_batched_stream(nc: Client, config: StreamConfig, allow_batched: bool) -> bool:
    """Create (or update) the stream of ``config`` with ``allow_batched``; True when the server's
    answer says the stream takes fast-ingest batches (a server before 2.14 ignores the field)."""
    # nats-py's StreamConfig has no allow_batched (nor keeps it from an answer): the request is
    # written here.
    body = {**config.as_dict(), "allow_batched": allow_batched}
    answer = await _stream_request(nc, "CREATE", str(config.name), body)
    if answer.get("error", {}).get("err_code") == NAME_IN_USE:
        answer = await _stream_request(nc, "UPDATE", str(config.name), body)
    if "error" in answer:
        APIError.from_error(answer["error"])  # raises the error's class, as nats-py's add_stream
    return bool(answer.get("config", {}).get("allow_batched"))


async def _stream_request(nc: Client, verb: str, name: str, config: dict[str, Any]) -> dict[str, Any]:
    subject = f"$JS.API.STREAM.{verb}.{name}"
    reply = await nc.request(subject, json.dumps(config).encode(), timeout=API_TIMEOUT_S)
    return json_object(subject, reply.data)
