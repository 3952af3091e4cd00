"""The stream that keeps the ledger's update events (``ledger.events.run.<runId>``), so that a
reader that was away — a website, the web door's feed — can replay them. The outbox relay
publishes every event into it with a ``Nats-Msg-Id`` (outbox_relay.py); core NATS subscribers
of the same subjects receive them as well."""

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


DUPLICATE_WINDOW_S = 120.0
"""JetStream's duplicate window: an event id seen within it is dropped (the server default)."""


def events_stream_config(replicas: int = 1, duplicate_window_s: float = DUPLICATE_WINDOW_S) -> StreamConfig:
    """The stream's configuration."""
    return StreamConfig(name=subjects.LEDGER_EVENTS_STREAM, subjects=[subjects.LEDGER_EVENTS_WILDCARD],
                        max_age=MAX_AGE_S, max_bytes=MAX_BYTES, storage=StorageType.FILE,
                        discard=DiscardPolicy.OLD, num_replicas=replicas, duplicate_window=duplicate_window_s)


async def declare_events_stream(js: JetStreamContext, replicas: int = 1,
                                duplicate_window_s: float = DUPLICATE_WINDOW_S) -> None:
    """Create the stream, or bring an existing one to this configuration (idempotent: every
    ledger replica calls it at start)."""
    config = events_stream_config(replicas, duplicate_window_s)
    try:
        await js.add_stream(config)
    except BadRequestError:  # it exists with another configuration (an older release, other replicas)
        await js.update_stream(config)
