"""One NATS request, its failures named, and the one answer to "is NATS away?".

Every service and command that asks over NATS reads nats-py's failures through this module:
:func:`request` turns them into the failures below (all :class:`~shared.errors.ShardbusError`,
each with the status a reply would give it), :func:`is_away` says whether an exception means
NATS or its JetStream is away rather than that the request was wrong, and :data:`HEADER_ROOM`
is the room headers need under ``max_payload``. The command helpers at the end serve the
``shardbus`` commands that ask a running service (``status``, ``cleanup …``, ``module …``) —
here, not in the command-line package, because each service's ``commands.py`` uses them and no
service imports ``shardbus/`` (docs/architecture.md, "Layout"). ADR 0010 says why there is one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from shared.errors import ShardbusError
from shared.logs import redact

HEADER_ROOM = 4096
"""Bytes kept for headers under ``max_payload``: the server counts headers and body together
and closes a connection that publishes over it (nats-py checks the body alone), which would cut
the publisher off NATS for every caller. The gateway and the web door keep this room."""


# --- the failures -------------------------------------------------------------------------

class CallFailed(ShardbusError):
    """A request that got no usable reply."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


class NoResponders(CallFailed):
    """Nobody listens on the subject (NATS answered "no responders" at once)."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


class NoAnswer(CallFailed):
    """Somebody listens, but no reply came within the timeout."""

    status = HTTPStatus.GATEWAY_TIMEOUT


class BadReply(CallFailed):
    """The reply is not a JSON object."""

    status = HTTPStatus.BAD_GATEWAY


class NatsAway(CallFailed):
    """NATS itself is away: the request could not be sent, or the connection closed before the
    answer came (like a timeout, it may be retried). ``reason`` names nats-py's exception."""

    status = HTTPStatus.SERVICE_UNAVAILABLE

    def __init__(self, sentence: str, reason: str = "") -> None:
        super().__init__(sentence)
        self.reason = reason


class TooLarge(CallFailed):
    """The request is more than NATS carries in one message."""

    status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request is larger than NATS carries ({limit} bytes)")
        self.limit = limit


# --- is NATS away? -------------------------------------------------------------------------

GONE: tuple[type[BaseException], ...] = (
    nats.errors.NoServersError, nats.errors.ConnectionClosedError, nats.errors.StaleConnectionError)
"""The connection is gone: none to be had, closed (for good, or by a stop), stale."""

HELD_UP: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionDrainingError, nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError)
"""The connection cannot take the request now: draining, reconnecting (a drain refused), or
reconnecting with its buffer full. (A request made while it reconnects is buffered and, if NATS
stays away, times out.)"""

SILENT: tuple[type[BaseException], ...] = (nats.errors.NoRespondersError, nats.errors.TimeoutError)
"""Nothing answered: no responders, no answer in time. For JetStream's API: no JetStream, no
meta leader; for a service's subject the service may be what is missing (:func:`request` tells
them apart)."""

JETSTREAM_AWAY: tuple[type[BaseException], ...] = (
    nats.js.errors.ServiceUnavailableError, nats.js.errors.NoStreamResponseError)
"""JetStream away: nobody answers its API, a publish got its 503 (and see :func:`is_away`)."""

AWAY: tuple[type[BaseException], ...] = (
    *GONE, *HELD_UP, *SILENT, *JETSTREAM_AWAY, TimeoutError, OSError)
"""What nats-py raises when NATS or its JetStream is away rather than the request wrong, with a
socket's errors (a TimeoutError is an OSError too)."""


def is_away(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a NATS call, means NATS or its JetStream is away (or nothing
    answered) rather than that the request was wrong: one of :data:`AWAY`, or JetStream's 503
    ("JetStream system temporarily unavailable", no meta leader). A caller that tells "nobody
    listens" or "no answer in time" apart from the rest (:func:`request`) checks those first."""
    if isinstance(exc, nats.js.errors.APIError) and not isinstance(exc, nats.js.errors.ServiceUnavailableError):
        return exc.code == HTTPStatus.SERVICE_UNAVAILABLE
    return isinstance(exc, AWAY)


# --- one request ---------------------------------------------------------------------------

Send = Callable[..., Awaitable[Msg]]
"""How a request is sent: ``nc.request`` by default, or a caller's own (an inbox multiplexer),
called as ``send(subject, payload, timeout=…, headers=…)``."""


async def request(nc: Client, subject: str, payload: bytes, timeout: float,
                  headers: dict[str, str] | None = None, *, send: Send | None = None,
                  refuse_oversize: bool = True) -> Msg:
    """Request ``subject`` with ``payload``: the reply message, or one of the failures above —
    :class:`NoResponders`, :class:`NoAnswer`, :class:`NatsAway` (its sentence names the subject
    and nats-py's exception), :class:`TooLarge` (with ``refuse_oversize``: checked before
    sending, :data:`HEADER_ROOM` kept when there are headers). Anything else nats-py raises
    (a bad subject, say) is raised as it is, as is its own ``MaxPayloadError`` without
    ``refuse_oversize``."""
    if refuse_oversize:
        limit = nc.max_payload - (HEADER_ROOM if headers else 0)
        if len(payload) > limit:
            raise TooLarge(limit)
    try:
        if send is None:
            return await nc.request(subject, payload, timeout=timeout, headers=headers)
        return await send(subject, payload, timeout=timeout, headers=headers)
    except nats.errors.NoRespondersError as exc:
        raise NoResponders(subject) from exc
    except TimeoutError as exc:  # nats-py's TimeoutError is one; before is_away: it is away too
        raise NoAnswer(subject) from exc
    except nats.errors.MaxPayloadError as exc:  # max_payload lowered by a server since the check
        if not refuse_oversize:
            raise
        raise TooLarge(nc.max_payload) from exc
    except Exception as exc:
        if not is_away(exc):
            raise
        raise NatsAway(f"{subject}: NATS is unreachable ({type(exc).__name__})", type(exc).__name__) from exc


def json_object(subject: str, data: bytes) -> dict[str, Any]:
    """A reply's JSON object, or :class:`BadReply`."""
    try:
        reply = json.loads(data)
    except ValueError as exc:
        raise BadReply(f"{subject}: reply is not JSON") from exc
    if not isinstance(reply, dict):
        raise BadReply(f"{subject}: reply is not a JSON object")
    return reply


# --- for the commands that ask a running service -------------------------------------------
# An outage is one sentence, never a traceback: a command that cannot reach NATS says so
# (without the URL's password), and one whose connection is lost while it waits for an answer
# says that at once instead of waiting out its timeout.

def nats_failure(servers: list[str] | str, exc: BaseException) -> str:
    """What a command prints when connecting to NATS failed with ``exc``: ``cannot reach NATS
    at <url>`` for an outage, else what the server said; any password masked."""
    where = redact(servers if isinstance(servers, str) else ",".join(servers))
    if is_away(exc):
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


async def request_while_connected(nc: Client, watch: ClosedWatch, subject: str, data: bytes, timeout: float,
                                  lost: str) -> Msg:
    """:func:`request` (nats-py's own ``MaxPayloadError`` left as it is), but raising
    :class:`NatsAway` with the sentence ``lost`` as soon as the connection closes, or when the
    request meets it away: nats-py would leave the request waiting out its whole timeout for an
    answer that can no longer come."""
    asked = asyncio.ensure_future(request(nc, subject, data, timeout, refuse_oversize=False))
    closed = asyncio.ensure_future(watch.closed.wait())
    try:
        await asyncio.wait({asked, closed}, return_when=asyncio.FIRST_COMPLETED)
        if asked.done():
            try:
                return asked.result()
            except NatsAway as exc:
                raise NatsAway(lost, exc.reason) from exc
        raise NatsAway(lost)
    finally:
        for task in (asked, closed):
            task.cancel()
        await asyncio.gather(asked, closed, return_exceptions=True)
