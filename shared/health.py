"""Every service's health: ``<service>.health`` (any one replica answers), ``shardbus.ping``
(every replica answers, so ``shardbus status`` counts them) and, where configured, a health
file kept fresh while NATS is connected (what a compose health check reads)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker

from shared import faststream_internals, replies, subjects
from shared.settings import CommonSettings

HEARTBEAT_EVERY_S = 5.0
"""How often the health file is touched while NATS is connected."""


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
