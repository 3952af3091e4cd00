"""The door's NATS requests: one wildcard inbox subscription for every call in flight, each
reply handed to its caller by token.

nats-py's own request does the same (its "new style"), but its replies go through the
subscription's task and ``asyncio.wait_for``: two more wake-ups per call, and a random token
read from the OS. Here each reply is dispatched to its caller's future from nats-py's read loop
itself, there and then: :func:`shared.natspy_internals.subscribe_in_read_loop`, nats-py's
``subscribe`` given a ``future`` that never completes (the fence says how). nats-py
subscribes it again after a reconnect, as any subscription.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import Callable
from typing import Any

import nats.errors
from nats.aio.client import NO_RESPONDERS_STATUS, Client
from nats.aio.msg import Msg

from shared.natspy_internals import subscribe_in_read_loop

_muxes: weakref.WeakKeyDictionary[Client, RequestMux] = weakref.WeakKeyDictionary()


def _dispatcher(waiting: dict[str, asyncio.Future[Msg]], prefix_len: int) -> Callable[[Msg], None]:
    """What nats-py's read loop calls with each reply: the reply to its caller's future."""

    def dispatch(msg: Msg) -> None:
        future = waiting.get(msg.subject[prefix_len:])
        if future is not None and not future.done():
            future.set_result(msg)

    return dispatch


class RequestMux:
    """Requests over ``nc``; replies come to ``<inbox>.<token>``, one subscription for all."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox() + "."
        self.waiting: dict[str, asyncio.Future[Msg]] = {}
        self._tokens = itertools.count(1)
        self._subscribed: asyncio.Future[Any] | None = None

    async def request(self, subject: str, payload: bytes, timeout: float,
                      headers: dict[str, str] | None = None) -> Msg:
        """The reply; nats.errors.TimeoutError after ``timeout``, NoRespondersError when NATS
        says nobody listens, nats-py's own errors when it cannot publish."""
        if self._subscribed is None:
            dispatch = _dispatcher(self.waiting, len(self.prefix))
            self._subscribed = asyncio.ensure_future(subscribe_in_read_loop(self.nc, self.prefix + "*", dispatch))
        try:
            await asyncio.shield(self._subscribed)  # one caller's cancellation is not the others'
        except Exception:
            self._subscribed = None  # NATS away at the first call: subscribe again at the next
            raise
        loop = asyncio.get_running_loop()
        token = str(next(self._tokens))
        future: asyncio.Future[Msg] = loop.create_future()
        self.waiting[token] = future
        timer = loop.call_later(timeout, _expire, future)
        try:
            await self.nc.publish(subject, payload, reply=self.prefix + token, headers=headers)
            msg = await future
        finally:
            timer.cancel()
            del self.waiting[token]
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS_STATUS and not msg.data:
            raise nats.errors.NoRespondersError
        return msg


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(nats.errors.TimeoutError())


def mux(nc: Client) -> RequestMux:
    """The mux of ``nc`` (made at its first request)."""
    found = _muxes.get(nc)
    if found is None:
        found = _muxes[nc] = RequestMux(nc)
    return found
