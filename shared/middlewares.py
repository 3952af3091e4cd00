"""The broker middlewares every service's FastStream broker runs (shared/broker.py):
:class:`DirectOnly` drops every message not sent to the subscription directly (shared/delivery.py),
:class:`CountReplies` counts each request's reply by subject and status for the metrics."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from faststream import BaseMiddleware
from faststream.exceptions import SkipMessage
from faststream.nats.subscriber.usecases import CoreSubscriber

from shared.delivery import is_direct, why_not_direct

REFUSAL_LOG_EVERY_S = 10.0
"""At most one log line per subscription this often about messages refused as not direct."""


class DirectOnly:
    """Broker middleware: a core-NATS subscriber handles only messages sent to it directly.

    A message whose subject does not match the subscription (a JetStream push consumer's
    delivery keeps its stream subject), whose reply is a ``$`` subject (``$JS.ACK.…``) or that
    is a JetStream status message is dropped before any other middleware: no handler runs, no
    reply is sent (an answer would acknowledge the delivery, or write where the reply points).
    JetStream and key-value subscribers, which expect stream subjects, are left alone."""

    def __init__(self, service: str) -> None:
        self.log = logging.getLogger(f"shardbus.{service}")
        self._last: dict[str, tuple[float, int]] = {}

    def __call__(self, msg: Any, /, *, context: Any) -> BaseMiddleware:
        return _DirectOnly(msg, context=context, gate=self)

    def refused(self, pattern: str, why: str, subject: str) -> None:
        """Count a refusal; log it, at most once per subscription every REFUSAL_LOG_EVERY_S."""
        now = time.monotonic()
        last, count = self._last.get(pattern, (float("-inf"), 0))
        if now - last < REFUSAL_LOG_EVERY_S:
            self._last[pattern] = (last, count + 1)
            return
        self._last[pattern] = (now, 0)
        self.log.warning("refused a message not sent to this subject directly",
                         extra={"subscription": pattern, "msg_subject": subject, "why": why,
                                "refused_since_last_line": count})


class _DirectOnly(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: Any, gate: DirectOnly) -> None:
        super().__init__(msg, context=context)
        self.gate = gate

    async def on_receive(self) -> None:
        handler = self.context.get_local("handler_")
        if not isinstance(handler, CoreSubscriber):
            return
        sub = getattr(handler, "subscription", None)
        pattern = getattr(sub, "subject", None) or handler.subject.broker_address
        msg = self.msg
        subject, reply, headers = getattr(msg, "subject", ""), getattr(msg, "reply", ""), getattr(msg, "headers", None)
        if not is_direct(subject, pattern, reply, headers):
            self.gate.refused(pattern, why_not_direct(subject, pattern, reply, headers), subject)
            raise SkipMessage  # FastStream drops it: no handler, no reply


_ENCODED_STATUS = re.compile(rb'\{"status": ?(\d{3})[,}]')
"""The status of a reply already encoded (a page: ``{"status": 200, …``)."""


class CountReplies:
    """Broker middleware: counts each request's reply by subject and status into ``counts``
    ((subject label, status) → n; a service's metrics read it). Placed outside the exception
    middleware, it sees the replies of failures too. ``label`` bounds the subject (a known one,
    else ``other``)."""

    def __init__(self, counts: dict[tuple[str, int], int], label: Callable[[str], str]) -> None:
        self.counts, self.label = counts, label

    def __call__(self, msg: Any, /, *, context: Any) -> BaseMiddleware:
        return _CountReplies(msg, context=context, gate=self)


class _CountReplies(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: Any, gate: CountReplies) -> None:
        super().__init__(msg, context=context)
        self.gate = gate

    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        result = await call_next(msg)
        status: Any = HTTPStatus.OK
        if isinstance(result, dict):
            status = result.get("status", HTTPStatus.OK)
        elif isinstance(result, bytes) and (found := _ENCODED_STATUS.match(result)):
            status = int(found[1])
        key = (self.gate.label(getattr(msg.raw_message, "subject", "")), int(status) if isinstance(status, int) else 0)
        self.gate.counts[key] = self.gate.counts.get(key, 0) + 1
        return result
