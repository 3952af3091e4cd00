"""FastStream wiring every service shares: a named, reconnecting NATS broker whose failures
become replies, and the health subject.

Without an exception middleware FastStream sends *no* reply when a request fails validation
or its handler raises, so the caller would wait for its timeout. Here every such request is
answered: a validation error with a 400 naming the fields, anything unexpected with a 500.

Before any of that, :class:`DirectOnly` drops every message that was not sent to the
subscription directly (shared/delivery.py: a JetStream push consumer's delivery, a reply to a
``$`` subject): it is neither handled nor answered. And a connection nats-py closes for good
while the service runs ends the process (:class:`shared.nats_connect.ClosedForGood`), so a
supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
import weakref
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from faststream import BaseMiddleware, ExceptionMiddleware, FastStream
from faststream.exceptions import SkipMessage
from faststream.nats import NatsBroker
from faststream.nats.subscriber.usecases import CoreSubscriber
from pydantic import ValidationError

from shared import faststream_internals, natspy_internals, replies, subjects
from shared.delivery import is_direct, why_not_direct
from shared.nats_connect import ClosedForGood, connect_options
from shared.settings import CommonSettings

log = logging.getLogger("shardbus.broker")

HEARTBEAT_EVERY_S = 5.0
"""How often the health file is touched while NATS is connected."""

ErrorHandler = Callable[[Exception], dict[str, Any]]


def _internal_reply(exc: Exception) -> dict[str, Any]:
    log.error("request failed", exc_info=exc)
    return replies.fail(HTTPStatus.INTERNAL_SERVER_ERROR,
                        f"internal error ({type(exc).__name__}); the service logged the details")


def _validation_reply(exc: Exception) -> dict[str, Any]:
    """The reply to a request that failed validation (the middleware hands this handler
    ValidationErrors only: it picks a handler by the exception's type)."""
    if not isinstance(exc, ValidationError):
        return _internal_reply(exc)
    return replies.fail(replies.BAD_REQUEST, replies.describe_validation_error(exc))


def error_handlers(error_replies: dict[type[Exception], ErrorHandler] | None = None) -> dict[type[Exception],
                                                                                          ErrorHandler]:
    """Every service's answers to failures (a validation error: 400 naming the fields; anything
    unexpected: 500), with ``error_replies`` (a service's own, e.g. a database outage) added."""
    return {ValidationError: _validation_reply, Exception: _internal_reply, **(error_replies or {})}


def error_reply(handlers: dict[type[Exception], ErrorHandler], exc: Exception) -> dict[str, Any]:
    """The reply to ``exc`` from ``handlers`` (:func:`error_handlers`): the most specific type
    wins, as FastStream's exception middleware picks, for a service's own nats-py subscriptions."""
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            return handler(exc)
    return _internal_reply(exc)  # pragma: no cover - Exception is always in handlers


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


_closed_guards: weakref.WeakKeyDictionary[NatsBroker, ClosedForGood] = weakref.WeakKeyDictionary()
"""Each service broker's ``closed_cb``, which :func:`make_app` arms while the app runs."""


def make_broker(settings: CommonSettings, service: str,
                error_replies: dict[type[Exception], ErrorHandler] | None = None,
                count_replies: CountReplies | None = None) -> NatsBroker:
    """A broker for ``service``: named, reconnecting for ever, and answering every request.

    ``error_replies`` maps further exception types (e.g. a database outage) to the reply
    the caller gets; the most specific type wins. ``count_replies`` counts the replies."""
    handlers = error_handlers(error_replies)
    middleware = ExceptionMiddleware(
        publish_handlers={exc: (lambda e, _h=h: _h(e)) for exc, h in handlers.items()}
    )
    servers = settings.nats_servers()
    closed = ClosedForGood(service)
    broker = NatsBroker(
        servers,
        # DirectOnly first: a refused message must not reach the exception middleware (whose
        # answer would go to the refused message's reply).
        middlewares=[DirectOnly(service), *([count_replies] if count_replies else []), middleware],
        logger=logging.getLogger(f"shardbus.{service}.faststream"),
        # FastStream's "Received"/"Processed" lines per message, at DEBUG: at INFO they were
        # two log lines per ledger request (1.2 MB in a 10-minute soak) for nothing an
        # operator reads. Errors are still logged at their own level.
        log_level=logging.DEBUG,
        closed_cb=closed.on_closed,
        graceful_timeout=STOP_GRACE_S,  # the stop: in-flight requests' time to finish
        **connect_options(service, settings.reconnect_wait_s, settings.reconnect_wait_max_s, servers),
    )
    closed.reason = lambda: broker.connection.last_error
    _closed_guards[broker] = closed
    return broker


class ServiceApp(FastStream):
    """A FastStream app whose broker's connection closing for good (while it runs and is not
    stopping) stops it in order and makes ``run`` end with ``SystemExit(75)``."""

    fatal_exit_code: int | None = None

    async def run(self, *args: Any, **kwargs: Any) -> None:
        guards = [g for b in self.brokers if isinstance(b, NatsBroker) and (g := _closed_guards.get(b)) is not None]
        for guard in guards:
            guard.arm(self._closed_for_good)
        try:
            await super().run(*args, **kwargs)
        finally:
            for guard in guards:
                guard.disarm()
            if self.fatal_exit_code is not None:
                raise SystemExit(self.fatal_exit_code)

    def _closed_for_good(self, exit_code: int) -> None:
        self.fatal_exit_code = exit_code
        self.exit()

    def disarm_closed_guards(self) -> None:
        """A stop begins: the broker's close is expected from now on."""
        for broker in self.brokers:
            if isinstance(broker, NatsBroker) and (guard := _closed_guards.get(broker)) is not None:
                guard.disarm()


def make_app(broker: NatsBroker, service: str) -> FastStream:
    """The FastStream app around ``broker``, logging through our one-line JSON logs; a NATS
    connection closed for good while it runs ends the process (:class:`ServiceApp`)."""
    app = ServiceApp(broker, logger=logging.getLogger(f"shardbus.{service}.faststream"))
    # The first shutdown hook: from here on the broker's close (its drain) is expected.
    app.on_shutdown(app.disarm_closed_guards)
    app.on_shutdown(_drain_or_let_go(broker))  # the stop's drain, bounded when NATS is away
    return app


async def _no_body(_msg: Any) -> None:
    """The decoder of subjects that take no body: whatever is sent (even JSON nested deeper than
    Python reads, a RecursionError) is not read, so it cannot turn the answer into a 500."""
    return None


def add_health(app: FastStream, broker: NatsBroker, service: str, settings: CommonSettings,
               details: Callable[[], dict[str, Any]] | None = None) -> None:
    """Answer ``<service>.health`` (any one replica) and ``shardbus.ping`` (every replica),
    and, if configured, keep the health file fresh."""
    started = time.monotonic()

    @broker.subscriber(subjects.health(service), queue=f"{service}-health", decoder=_no_body)
    async def health() -> dict[str, Any]:
        extra = details() if details else {}
        return replies.ok(service=service, pid=os.getpid(),
                          uptime_s=round(time.monotonic() - started, 3), **extra)

    # No queue group: every replica answers, so ``shardbus status`` can count them.
    @broker.subscriber(subjects.PING, decoder=_no_body)
    async def ping() -> dict[str, Any]:
        return replies.ok(service=service, pid=os.getpid(), host=socket.gethostname(),
                          uptime_s=round(time.monotonic() - started, 3))

    if not settings.health_file:
        return
    path = Path(settings.health_file)
    tasks: list[asyncio.Task[None]] = []

    async def beat() -> None:
        while True:
            if (nc := faststream_internals.connection_of(broker)) is not None and nc.is_connected:
                # A few bytes to a local file, written in the loop on purpose: off it, a write still
                # under way could land after the stop's unlink and leave a stale health file.
                path.write_text(f"{time.time():.3f}\n")  # noqa: ASYNC240 — see above
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    @app.after_startup
    async def _start_beat() -> None:
        tasks.append(asyncio.create_task(beat()))

    @app.on_shutdown
    async def _stop_beat() -> None:
        for task in tasks:
            task.cancel()
        path.unlink(missing_ok=True)  # noqa: ASYNC240 — in the loop, after the last write (see beat)


def health_file_is_fresh(path: str, max_age_s: float = 3 * HEARTBEAT_EVERY_S) -> bool:
    """What a compose health check asks: was the health file touched recently?"""
    try:
        return time.time() - float(Path(path).read_text().strip()) <= max_age_s
    except (OSError, ValueError):
        return False


# --- the stop ------------------------------------------------------------------------------

STOP_GRACE_S = 5.0
"""How long a stopping service lets the requests it is handling finish (FastStream's graceful
timeout; the ledger's statements are bounded well inside it) before cancelling them."""

NATS_PROBE_S = 1.0
"""At the stop's drain, a NATS that does not answer a PING within this is away."""

NATS_CLOSE_S = 2.0
"""Longest the stop waits for a connection to NATS that is away to close."""


def _drain_or_let_go(broker: NatsBroker) -> Callable[[], Any]:
    """A shutdown hook making the broker's final drain bounded. FastStream's stop drains the
    connection, which with NATS away either fails at once (reconnecting) or — NATS hung or cut
    off while the socket looks alive — waits out nats-py's flush and drain timeouts (10 s and
    30 s) and fails with a traceback. Armed by this hook, the drain first PINGs NATS
    (:data:`NATS_PROBE_S`): answered, it drains as before; not, it closes the connection
    (within :data:`NATS_CLOSE_S`; nothing can be delivered anyway) and the stop goes on,
    shutdown hooks included."""

    async def arm() -> None:
        nc = faststream_internals.connection_of(broker)
        if nc is None:
            return
        drain = nc.drain

        async def drain_or_close() -> None:
            if nc.is_connected:
                try:
                    # nats-py annotates the timeout as int; it is seconds for asyncio.wait_for (a float).
                    await nc.flush(timeout=NATS_PROBE_S)  # type: ignore[arg-type]
                except Exception:  # noqa: BLE001 — no PONG in time, or the connection broke: away
                    pass
                else:
                    await drain()
                    return
            log.warning("NATS is away while stopping: closing the connection without draining it")
            try:
                await asyncio.wait_for(nc.close(), NATS_CLOSE_S)
            except Exception as exc:  # noqa: BLE001 — it is going away either way
                log.warning("could not close the NATS connection cleanly", extra={"reason": repr(exc)})

        # This connection's own drain, replaced on purpose: FastStream's stop calls nc.drain().
        natspy_internals.replace_drain(nc, drain_or_close)

    return arm
