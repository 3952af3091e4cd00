"""The stream that keeps the ledger's update events (``ledger.events.run.<runId>``), so that a
reader that was away — the web door's feed — can replay them. The ledger still publishes them
on core NATS; the stream only captures what is published."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from shared import subjects

MAX_AGE_S = 7 * 24 * 3600.0
"""How long an event is kept: longer than any outage of a reader that sources the stream (the
feed keeps its own, shorter, window)."""

MAX_BYTES = 256 * 1024 * 1024
"""Size cap; the oldest events go first."""


def events_stream_config(replicas: int = 1) -> StreamConfig:
    """The stream's configuration."""
    return StreamConfig(name=subjects.LEDGER_EVENTS_STREAM, subjects=[subjects.LEDGER_EVENTS_WILDCARD],
                        max_age=MAX_AGE_S, max_bytes=MAX_BYTES, storage=StorageType.FILE,
                        discard=DiscardPolicy.OLD, num_replicas=replicas)


async def declare_events_stream(js: JetStreamContext, replicas: int = 1) -> None:
    """Create the stream, or bring an existing one to this configuration (idempotent: every
    ledger replica calls it at start)."""
    config = events_stream_config(replicas)
    try:
        await js.add_stream(config)
    except BadRequestError:  # it exists with another configuration (an older release, other replicas)
        await js.update_stream(config)
