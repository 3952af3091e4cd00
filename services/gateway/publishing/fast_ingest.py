"""JetStream's fast-ingest batches (nats-server 2.14 and later, NATS ADR-50), as the gateway uses
them: each shard's frames go to ``SHARD_FRAMES`` in a batch with ``gap: fail``.

Why: frames of a shard are published many at a time (the window). A leader change can drop some
in flight and store later ones, so a plain publish cannot keep a shard's order (docs/gateway.md,
"What a shard may rely on"). In a fast-ingest batch the stream's leader numbers the messages
(the batch sequence) and, at the first gap — a message it never got, or a new leader that did not
hold the batch's last ones — stores nothing more of the batch and ends it with a publish
acknowledgement saying how far it got. The shard's recovery then publishes the rest in order
(ADR 0015).

The batch is told in the reply subject, ``<prefix>.<id>.<flow>.<gap>.<seq>.<op>.$FI``; the server
answers on it: ``{"type":"ack","seq":N}`` (every message up to N stored), ``{"type":"gap"}`` and
``{"type":"err"}`` (the batch ends), and a publish acknowledgement (with ``"batch"``: the batch
ended; with ``"error"``: the message was refused). nats-py has no client for it; these are the
server's own strings (``server/stream.go``, ``server/jetstream_batching.go``), checked against a
real server in tests/gateway/test_fast_ingest.py.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

SUFFIX = ".$FI"
"""How a reply subject says "fast-ingest batch" to the server."""

OP_START, OP_APPEND, OP_END = 0, 1, 3
"""The batch operations the gateway uses: the first message, each one after it, and the end of a
batch by a message that is not stored (EOB)."""

FLOW = 1
"""Answers asked for: one every message, so each frame is acknowledged to its shard as soon as it
is stored (the server may only lower the rate it is asked for: it never goes above 1)."""

IDLE_S = 5.0
"""A batch unused this long is ended and not used again: the server forgets one after 10 s without
a message, and a message for a batch it forgot is refused ("batch publish ID unknown"). Ended, it
no longer counts against the stream's open batches (1,000), which quiet shards would fill."""

DISABLED = 10205
"""JetStream's error code: the stream does not allow batches (``allow_batched``)."""

TOO_MANY = 10211
"""JetStream's error code: the stream (1,000) or the server (50,000) has as many batches open as
it allows; the shard publishes plainly for a while."""

REPLY_TAIL = re.compile(r"(?P<id>[0-9a-f]{32})\.\d+\.fail\.(?P<seq>[1-9][0-9]{0,19})\.[0-4]\.\$FI")
"""A fast-ingest reply subject after the pipeline's inbox prefix, as :func:`reply_tail` makes it."""


@dataclass(slots=True, eq=False)
class FastBatch:
    """One shard's open batch: its id, the last batch sequence sent, whether the server answered
    its first message (until then nothing more is sent: ADR-50), when a message last went, and
    whether it ended (nothing more is sent in it)."""

    id: str
    subject: str = ""
    """The subject of its last message: where the message that ends it goes."""
    last_seq: int = 0
    open: bool = False
    ended: bool = False
    last_sent_at: float = 0.0

    @classmethod
    def new(cls) -> FastBatch:
        return cls(uuid.uuid4().hex)

    def usable(self, now: float) -> bool:
        """True while more messages may go in it."""
        return not self.ended and (self.last_seq == 0 or now - self.last_sent_at < IDLE_S)


def reply_tail(batch: FastBatch, seq: int) -> str:
    """The reply subject after the inbox prefix for message ``seq`` of ``batch``."""
    op = OP_START if seq == 1 else OP_APPEND
    return f"{batch.id}.{FLOW}.fail.{seq}.{op}{SUFFIX}"


def end_tail(batch: FastBatch) -> str:
    """The reply subject after the inbox prefix of the message that ends ``batch`` (not stored)."""
    return f"{batch.id}.{FLOW}.fail.{batch.last_seq + 1}.{OP_END}{SUFFIX}"


def parse_reply_tail(tail: str) -> tuple[str, int] | None:
    """(batch id, batch sequence) of a reply subject :func:`reply_tail` made; None otherwise."""
    found = REPLY_TAIL.fullmatch(tail)
    return (found["id"], int(found["seq"])) if found else None


@dataclass(slots=True, frozen=True)
class Answer:
    """What the server said on a batch's reply subject.

    ``kind``: "ack" (``seq``: stored up to it), "gap" or "err" (the batch ends; ``seq`` is the
    message that found the gap or was refused), "end" (the batch ended; ``seq``: its messages up
    to it are stored), "refused" (a publish acknowledgement with an error: the message of the
    reply subject was not stored, nor anything after it), "stored" (a plain publish
    acknowledgement: a server that does not know batches stored this one message)."""

    kind: str
    seq: int = 0
    error: dict[str, object] | None = None


ACK_HEAD = b'{"type":"ack","seq":'
"""How the server writes the common answer, ``{"type":"ack","seq":N,"msgs":M}``."""


def parse_answer(data: bytes) -> Answer:
    """The server's answer; ValueError when it is none of ADR-50's."""
    if data.startswith(ACK_HEAD):  # the common answer, without a JSON parse (a third of the cost)
        end = data.find(b",", len(ACK_HEAD))
        digits = data[len(ACK_HEAD):end]
        if end > 0 and digits.isdigit():
            return Answer("ack", int(digits))
    body = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    kind = body.get("type")
    if kind in ("ack", "gap", "err"):
        seq = body.get("seq")
        if not isinstance(seq, int) or seq < 0:
            raise ValueError(f"{kind} without a sequence")
        error = body.get("error") if isinstance(body.get("error"), dict) else None
        return Answer(kind, seq, error)
    if isinstance(body.get("error"), dict):
        return Answer("refused", error=body["error"])
    if "stream" not in body:
        raise ValueError("neither a flow message nor a publish acknowledgement")
    if "batch" in body:
        count = body.get("count")
        if not isinstance(count, int) or count < 0:
            raise ValueError("a batch's acknowledgement without its count")
        return Answer("end", count)
    return Answer("stored")
