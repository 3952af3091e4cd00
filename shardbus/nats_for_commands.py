"""NATS for the ``shardbus`` commands that ask a running service (``status``, ``cleanup …``,
``module …``): an outage is one sentence, never a traceback — a command that cannot reach NATS
says so (without the URL's password), and one whose connection is lost while it waits for an
answer says that at once instead of waiting out its timeout."""

from __future__ import annotations

import asyncio
from typing import Any


class NatsAway(Exception):
    """NATS could not be reached, or the connection closed before the answer came; the message
    is the sentence to print (no password)."""


def nats_failure(servers: list[str] | str, exc: BaseException) -> str:
    """What to print when connecting to NATS failed with ``exc``: ``cannot reach NATS at <url>``
    for an outage, else what the server said; any password masked."""
    import nats.errors

    from shared.logs import redact

    where = redact(servers if isinstance(servers, str) else ",".join(servers))
    if isinstance(exc, (nats.errors.NoServersError, nats.errors.ConnectionClosedError,
                        nats.errors.StaleConnectionError, OSError, asyncio.TimeoutError)):
        return f"cannot reach NATS at {where}"
    return f"NATS at {where} refused the connection: {redact(str(exc)) or type(exc).__name__}"


async def quiet(_exc: Exception) -> None:
    """An ``error_cb`` for commands: nats-py logs every failed connection attempt; the command
    says it once instead."""


class ClosedWatch:
    """Its :meth:`on_closed` is a ``closed_cb`` remembering that the connection closed for good
    (its reconnect attempts ran out, or reconnecting was off), so a command waiting for an
    answer stops waiting."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def on_closed(self) -> None:
        self.closed.set()


async def request_while_connected(nc: Any, watch: ClosedWatch, subject: str, data: bytes, timeout: float,
                                  lost: str) -> Any:
    """``nc.request``, but raising :class:`NatsAway` (``lost``) as soon as the connection closes:
    nats-py would leave the request waiting out its whole timeout for an answer that can no
    longer come."""
    import nats.errors

    request = asyncio.ensure_future(nc.request(subject, data, timeout=timeout))
    closed = asyncio.ensure_future(watch.closed.wait())
    try:
        await asyncio.wait({request, closed}, return_when=asyncio.FIRST_COMPLETED)
        if request.done():
            try:
                return request.result()
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
                    nats.errors.OutboundBufferLimitError, nats.errors.StaleConnectionError) as exc:
                raise NatsAway(lost) from exc
        raise NatsAway(lost)
    finally:
        for task in (request, closed):
            task.cancel()
        await asyncio.gather(request, closed, return_exceptions=True)
