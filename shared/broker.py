"""FastStream wiring every service shares: a named, reconnecting NATS broker whose failures
become replies, and the health subject.

Without an exception middleware FastStream sends *no* reply when a request fails validation
or its handler raises, so the caller would wait for its timeout. Here every such request is
answered: a validation error with a 400 naming the fields, anything unexpected with a 500.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faststream import ExceptionMiddleware, FastStream
from faststream.nats import NatsBroker
from pydantic import ValidationError

from shared import replies, subjects
from shared.nats_connect import connect_options
from shared.settings import CommonSettings

log = logging.getLogger("shardbus.broker")

HEARTBEAT_EVERY_S = 5.0
"""How often the health file is touched while NATS is connected."""

ErrorHandler = Callable[[Exception], dict[str, Any]]


def _validation_reply(exc: ValidationError) -> dict[str, Any]:
    return replies.fail(replies.BAD_REQUEST, replies.describe_validation_error(exc))


def _internal_reply(exc: Exception) -> dict[str, Any]:
    log.error("request failed", exc_info=exc)
    return replies.fail(500, f"internal error ({type(exc).__name__}); the service logged the details")


def make_broker(settings: CommonSettings, service: str,
                error_replies: dict[type[Exception], ErrorHandler] | None = None) -> NatsBroker:
    """A broker for ``service``: named, reconnecting for ever, and answering every request.

    ``error_replies`` maps further exception types (e.g. a database outage) to the reply
    the caller gets; the most specific type wins."""
    handlers: dict[type[Exception], ErrorHandler] = {
        ValidationError: _validation_reply,
        Exception: _internal_reply,
        **(error_replies or {}),
    }
    middleware = ExceptionMiddleware(
        publish_handlers={exc: (lambda e, _h=h: _h(e)) for exc, h in handlers.items()}
    )
    servers = settings.nats_servers()
    return NatsBroker(
        servers,
        middlewares=[middleware],
        logger=logging.getLogger(f"shardbus.{service}.faststream"),
        # FastStream's "Received"/"Processed" lines per message, at DEBUG: at INFO they were
        # two log lines per ledger request (1.2 MB in a 10-minute soak) for nothing an
        # operator reads. Errors are still logged at their own level.
        log_level=logging.DEBUG,
        **connect_options(service, settings.reconnect_wait_s, settings.reconnect_wait_max_s, servers),
    )


def make_app(broker: NatsBroker, service: str) -> FastStream:
    """The FastStream app around ``broker``, logging through our one-line JSON logs."""
    return FastStream(broker, logger=logging.getLogger(f"shardbus.{service}.faststream"))


def add_health(app: FastStream, broker: NatsBroker, service: str, settings: CommonSettings,
               details: Callable[[], dict[str, Any]] | None = None) -> None:
    """Answer ``<service>.health`` (any one replica) and ``shardbus.ping`` (every replica),
    and, if configured, keep the health file fresh."""
    started = time.monotonic()

    @broker.subscriber(subjects.health(service), queue=f"{service}-health")
    async def health() -> dict[str, Any]:
        extra = details() if details else {}
        return replies.ok(service=service, pid=os.getpid(),
                          uptime_s=round(time.monotonic() - started, 3), **extra)

    # No queue group: every replica answers, so ``shardbus status`` can count them.
    @broker.subscriber(subjects.PING)
    async def ping() -> dict[str, Any]:
        return replies.ok(service=service, pid=os.getpid(), host=socket.gethostname(),
                          uptime_s=round(time.monotonic() - started, 3))

    if not settings.health_file:
        return
    path = Path(settings.health_file)
    tasks: list[asyncio.Task[None]] = []

    async def beat() -> None:
        while True:
            if broker._connection is not None and broker._connection.is_connected:
                path.write_text(f"{time.time():.3f}\n")
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    @app.after_startup
    async def _start_beat() -> None:
        tasks.append(asyncio.create_task(beat()))

    @app.on_shutdown
    async def _stop_beat() -> None:
        for task in tasks:
            task.cancel()
        path.unlink(missing_ok=True)


def health_file_is_fresh(path: str, max_age_s: float = 3 * HEARTBEAT_EVERY_S) -> bool:
    """What a compose health check asks: was the health file touched recently?"""
    try:
        return time.time() - float(Path(path).read_text().strip()) <= max_age_s
    except (OSError, ValueError):
        return False
