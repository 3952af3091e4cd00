"""The JetStream streams the gateway publishes to: every frame, and every line that could not
be one (dead letters), each de-duplicating by message id."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError

from services.gateway.settings import GatewaySettings
from shared import natspy_internals, subjects


async def declare_streams(js: JetStreamContext, settings: GatewaySettings) -> None:
    """Create (or update) the frames and dead-letter streams, de-duplicating by message id."""
    window = settings.duplicate_window_s
    for name, subject in ((settings.frames_stream, subjects.FRAMES_WILDCARD),
                          (settings.deadletter_stream, subjects.DEADLETTER_WILDCARD)):
        config = StreamConfig(name=name, subjects=[subject], duplicate_window=window,
                              num_replicas=settings.jetstream_replicas)
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)
    # nats-py sets up publish_async's reply subscription on first use, unguarded: two
    # shards publishing at once could each set it up and lose the other's acks.
    await natspy_internals.ensure_publish_async_reply(js)
