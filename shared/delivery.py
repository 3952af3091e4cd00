"""Was a message sent to a subscription directly, or did somebody have NATS put it there?

A service acts only on a message somebody published to one of its subjects. Two ways let a
user put a message on a subject it may not publish to, and :func:`is_direct` refuses both:

- **A JetStream push consumer.** Whoever may create a consumer on a stream chooses its
  ``deliver_subject`` (and ``deliver_group``); nats-server does not check that the creator may
  publish there. So the website, allowed to watch ``KV_BOARD_NEWS``, could have JetStream
  deliver a news item it wrote to ``ledger.sweep.claim`` in the ``ledger`` queue group. Such a
  message keeps its *stream* subject (``$KV.BOARD_NEWS.uo1.n1``), not the subject subscribed
  to, and its reply is a JetStream acknowledgement (``$JS.ACK.KV_BOARD_NEWS.…``); the consumer's
  idle heartbeats and flow-control requests arrive on the subscribed subject itself, with a
  ``Status: 100`` header (and a ``$JS.FC.…`` reply).
- **A reply subject.** A service answers a request by publishing to its reply subject, and
  ``allow_responses`` lets it publish there whatever the subject is. A request whose reply is
  ``$KV.BOARD_GUILDS.uo1.x`` makes the service write a board entry for the asker, and
  ``$JS.ACK.…``/``$JS.FC.…`` would acknowledge a JetStream delivery. Real requests carry an
  inbox (``_INBOX_<user>.…``); no client of shardbus replies to a ``$`` subject.

So a message is direct when its subject matches the subscribed pattern (NATS matching, token
by token), its reply (if any) is not a ``$`` subject, and it carries no JetStream status.
FastStream subscribers of every service go through :class:`shared.middlewares.DirectOnly`, which
asks this; the gateway's own nats-py subscriptions ask it in their callbacks.
"""

from __future__ import annotations

from collections.abc import Mapping

SYSTEM_PREFIX = "$"
"""Subjects of the server itself: ``$JS.ACK.``, ``$JS.FC.``, ``$JS.API.``, ``$KV.``, ``$SYS.``…"""

JS_ACK_PREFIX = "$JS.ACK."
"""The reply of a message JetStream delivered to a push consumer (a subset of ``$``)."""

STATUS_HEADER = "Status"
"""The header nats-py gives a status message (a consumer's idle heartbeat or flow control)."""


def subject_matches(subject: str, pattern: str) -> bool:
    """Whether the literal ``subject`` matches the subscription ``pattern`` as NATS matches:
    ``*`` is exactly one token, ``>`` one or more tokens at the end; any other token equal.
    An empty subject or pattern, or an empty token (``a..b``, ``a.``), matches nothing."""
    if not subject or not pattern:
        return False
    tokens, wanted = subject.split("."), pattern.split(".")
    if "" in tokens or "" in wanted:
        return False
    for i, want in enumerate(wanted):
        if want == ">":
            return i == len(wanted) - 1 and len(tokens) > i
        if i >= len(tokens) or (want != "*" and want != tokens[i]):
            return False
    return len(tokens) == len(wanted)


def is_direct(msg_subject: str, subscribed_pattern: str, reply: str | None,
              headers: Mapping[str, str] | None = None) -> bool:
    """True when a message that arrived on the subscription ``subscribed_pattern`` was sent to
    it directly: its subject matches the pattern, its reply (if any) is not a ``$`` subject
    (``$JS.ACK.…`` above all), and it carries no JetStream status header. Anything else was
    put there by a push consumer or asks for a reply nobody may send: act on nothing of it
    and answer nothing."""
    if not subject_matches(msg_subject, subscribed_pattern):
        return False
    if reply and reply.startswith(SYSTEM_PREFIX):
        return False
    return not (headers and STATUS_HEADER in headers)


def why_not_direct(msg_subject: str, subscribed_pattern: str, reply: str | None,
                   headers: Mapping[str, str] | None = None) -> str:
    """The reason :func:`is_direct` refuses a message, for a log line ("" when it is direct)."""
    if not subject_matches(msg_subject, subscribed_pattern):
        return "its subject is not one subscribed to (a JetStream delivery keeps its stream subject)"
    if reply and reply.startswith(JS_ACK_PREFIX):
        return "its reply is a JetStream acknowledgement"
    if reply and reply.startswith(SYSTEM_PREFIX):
        return "its reply is a system subject"
    if headers and STATUS_HEADER in headers:
        return "it is a JetStream status message"
    return ""
