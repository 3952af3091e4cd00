"""FastStream wiring every service shares: a named, reconnecting NATS broker whose failures
become replies, the app around it, and its stop.

Without an exception middleware FastStream sends *no* reply when a request fails validation
or its handler raises, so the caller would wait for its timeout. Here every such request is
answered (shared/error_replies.py: a validation error with a 400 naming the fields, anything
unexpected with a 500).

Before any of that, :class:`~shared.middlewares.DirectOnly` drops every message that was not
sent to the subscription directly (shared/delivery.py: a JetStream push consumer's delivery, a
reply to a ``$`` subject): it is neither handled nor answered. And a connection nats-py closes
for good while the service runs ends the process (:class:`shared.nats_connect.ClosedForGood`),
so a supervisor restarts it. Health is shared/health.py.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any

from faststream import ExceptionMiddleware, FastStream
from faststream.nats import NatsBroker
from faststream.nats.security import NatsSecurity

from shared import faststream_internals, natspy_internals
from shared.error_replies import ErrorHandler, error_handlers
from shared.middlewares import CountReplies, DirectOnly
from shared.nats_connect import ClosedForGood, connect_options
from shared.settings import CommonSettings

log = logging.getLogger("shardbus.broker")

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
    tls = settings.nats_tls()  # docs/security.md, "TLS": a bad CA or certificate file stops the start
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
        security=NatsSecurity(ssl_context=tls["tls"], tls_hostname=tls.get("tls_hostname"),
                              tls_handshake_first=tls["tls_handshake_first"]) if tls else None,
        **connect_options(service, settings.reconnect_wait_s, settings.reconnect_wait_max_s, servers,
                          ping_interval_s=settings.nats_ping_interval_s,
                          max_outstanding_pings=settings.nats_max_outstanding_pings),
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
