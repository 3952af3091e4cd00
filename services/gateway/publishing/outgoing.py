"""What the gateway sends to JetStream, and a frame's state while in flight: shared by a shard's
publisher (``publisher.py``) and the gateway's pipeline (``pipeline.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.publishing.fast_ingest import FastBatch


@dataclass(slots=True)
class Outgoing:
    """One message to JetStream: subject, exact bytes, de-duplication id, extra headers (None:
    only the id, as most frames), and the shard's ``seq`` to acknowledge once it is stored."""

    subject: str
    data: bytes
    msg_id: str
    headers: dict[str, str] | None = None
    ack_seq: int | None = None


WAITING, STORED, FAILED = 0, 1, 2
"""States of a frame in flight."""


@dataclass(slots=True, eq=False)
class InFlight:
    """A frame published and not yet taken off its shard's window: its token in the pipeline's
    inbox, when it was sent (the event loop's clock) and on which connection to NATS (nats-py's
    reconnect count), what its acknowledgement said, and the fast-ingest batch it went in (None:
    published plainly, answered on its token) with its sequence there."""

    item: Outgoing
    sent_at: float
    connection: int = 0
    token: str | None = None
    state: int = WAITING
    error: Exception | None = None
    batch: FastBatch | None = None
    batch_seq: int = 0
