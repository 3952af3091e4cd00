"""The one place shardbus goes beneath nats-py's public API (docs/adr/0007 and 0009 say why,
with the measurements): the gateway writes its frames' HPUB commands itself and drops what
nats-py holds for a dead connection; the gateway and the ledger set up ``publish_async``'s
reply subscription before their first publish; the stop replaces a connection's ``drain``; the
web door's request mux has its replies dispatched from nats-py's read loop itself
(services/web/mux.py); and closing a socket waits a bounded time for its buffered bytes
(:func:`bound_socket_close`).

nats-py is pinned exactly in pyproject.toml. :func:`incompatibilities` names each attribute
used here that a release lacks or has changed; ``tests/shared/test_library_fences.py`` fails on
any, so a new nats-py is taken only with this file checked against it."""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.aio.transport import TcpTransport
from nats.js import JetStreamContext

PINNED = "2.16.0"
"""The nats-py release this file was checked against (pyproject.toml pins the same)."""

Callback = Callable[[], Awaitable[None]]


async def write_commands(nc: Client, data: bytes) -> None:
    """Hand protocol commands (HPUB/PUB lines, already built) to nats-py's writer and flush them
    now: one write for a whole pass of frames (``Client.publish`` would build each again)."""
    await nc._send_command(data)
    await nc._flush_pending()


def drop_unsent(nc: Client) -> None:
    """Forget what nats-py still holds for a dead connection (it would be sent first on the new
    one, ahead of earlier frames that died in the old one's socket)."""
    nc._pending = []
    nc._pending_data_size = 0


def disconnected_callback(nc: Client) -> Callback | None:
    """The callback nats-py calls once a connection is closed, before it reconnects."""
    callback: Callback | None = nc._disconnected_cb
    return callback


def set_disconnected_callback(nc: Client, callback: Callback | None) -> None:
    """Set it after connecting (nats-py takes it only as a ``connect`` option)."""
    nc._disconnected_cb = callback


async def ensure_publish_async_reply(js: JetStreamContext) -> None:
    """Set up ``publish_async``'s reply subscription once, before the first publish: nats-py
    does it on first use, unguarded, so two publishers at once could each set one up and lose
    the other's acknowledgements."""
    if not js._async_reply_prefix:
        await js._init_async_reply()


def replace_drain(nc: Client, drain: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Replace this connection's ``drain`` (FastStream's stop calls ``nc.drain()``)."""
    nc.drain = drain  # type: ignore[method-assign]


class _ReadLoopDispatch:
    """What nats-py takes for a subscription's ``future``: it calls ``set_result`` with each
    message, in its read loop, unless ``cancelled()``. This one never completes, so every message
    goes to ``dispatch`` (``set_result`` is ``dispatch`` itself: no call in between)."""

    __slots__ = ("set_result",)

    def __init__(self, dispatch: Callable[[Msg], None]) -> None:
        self.set_result = dispatch

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False


async def subscribe_in_read_loop(nc: Client, subject: str, dispatch: Callable[[Msg], None]) -> Subscription:
    """Subscribe to ``subject`` with ``dispatch`` called on each message in nats-py's read loop
    itself: no subscription task, no queue, no wake-up between a message and its handling. It
    is ``subscribe(future=…)`` (nats-py's one way to be called from its read loop, meant for one
    reply) given a future that never completes. nats-py subscribes it again after a reconnect,
    as any subscription. ``dispatch`` must not block: the read loop waits for it."""
    future: Any = _ReadLoopDispatch(dispatch)
    return await nc.subscribe(subject, future=future)


SOCKET_CLOSE_WAIT_S = 2.0
"""How long closing a connection's socket waits for the bytes it still buffers to go out."""


def bound_socket_close(wait_s: float = SOCKET_CLOSE_WAIT_S) -> None:
    """Make every nats-py TCP connection's close wait at most ``wait_s`` for its buffered bytes,
    then abort the socket (once per process; idempotent).

    Before it reconnects, nats-py closes the old socket and awaits the close
    (``TcpTransport.wait_closed``). Over a link that drops every packet (a partition) the bytes
    still buffered never go out, so the close never completes and the client stays
    "reconnecting" until the link heals, never trying the other servers listed: a gateway cut off
    from its node by iptables noticed the silent link within seconds (its pings) and then sat
    there for the whole cut (tests/hosts, docs/reliability.md, "A silent NATS link"). A close of a
    healthy link flushes within the bound, so nothing it would have sent is lost."""
    current = TcpTransport.wait_closed
    if getattr(current, "bounded_s", None) == wait_s:
        return
    original = getattr(current, "original", current)

    async def wait_closed(self: TcpTransport) -> None:
        closing = asyncio.ensure_future(original(self))
        done, _ = await asyncio.wait({closing}, timeout=wait_s)
        if closing in done:
            closing.result()
            return
        writer = self._io_writer
        if writer is not None:
            writer.transport.abort()  # the buffered bytes are dropped: the link is dead anyway
        await asyncio.wait({closing}, timeout=1.0)
        if not closing.done():
            closing.cancel()

    wait_closed.bounded_s = wait_s  # type: ignore[attr-defined]
    wait_closed.original = original  # type: ignore[attr-defined]
    TcpTransport.wait_closed = wait_closed  # type: ignore[method-assign]


def incompatibilities(client: type[Any] = Client, jetstream: type[Any] = JetStreamContext,
                      installed: str | None = None, subscription: type[Any] = Subscription) -> list[str]:
    """What this file uses that the installed nats-py lacks or has changed (empty: all there)."""
    found = []
    version = installed if installed is not None else importlib.metadata.version("nats-py")
    if version != PINNED:
        found.append(f"nats-py {version} is installed; this file was checked against {PINNED}")
    for name, params in (("_send_command", ["self", "cmd", "priority"]), ("_flush_pending", ["self", "force_flush"])):
        method = getattr(client, name, None)
        if not inspect.iscoroutinefunction(method):
            found.append(f"Client.{name} is not a coroutine function")
        elif list(inspect.signature(method).parameters) != params:
            found.append(f"Client.{name}{inspect.signature(method)} changed")
    instance = client()
    for name, kind in (("_pending", list), ("_pending_data_size", int)):
        if not isinstance(getattr(instance, name, None), kind):
            found.append(f"Client().{name} is not a {kind.__name__}")
    if not hasattr(instance, "_disconnected_cb"):
        found.append("Client()._disconnected_cb is missing")
    if not inspect.iscoroutinefunction(getattr(jetstream, "_init_async_reply", None)):
        found.append("JetStreamContext._init_async_reply is not a coroutine function")
    if client is Client and not hasattr(instance.jetstream(), "_async_reply_prefix"):
        found.append("JetStreamContext()._async_reply_prefix is missing")
    subscribe = getattr(client, "subscribe", None)
    if not inspect.iscoroutinefunction(subscribe) or "future" not in inspect.signature(subscribe).parameters:
        found.append("Client.subscribe takes no future")
    process = getattr(client, "_process_msg", None)
    if not inspect.iscoroutinefunction(process) or "_future.set_result(msg)" not in inspect.getsource(process):
        found.append("Client._process_msg no longer hands each message to a subscription's future")
    marker = _ReadLoopDispatch(lambda msg: None)
    try:
        kept = subscription(None, future=marker)._future is marker
    except TypeError:
        kept = False
    if not kept:
        found.append("Subscription(conn, future=…)._future is not the future given")
    waits = getattr(TcpTransport.wait_closed, "original", TcpTransport.wait_closed)
    if not inspect.iscoroutinefunction(waits) or "_io_writer" not in inspect.getsource(waits):
        found.append("TcpTransport.wait_closed no longer awaits its _io_writer's close")
    return found
