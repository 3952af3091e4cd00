"""The shards' TCP connections, from hello to close: the hello's check, attaching the link (its
command and news subscriptions), reading its lines, the heartbeat, and detaching it.

Plain asyncio and nats-py (no FastStream). The command subscription ``shard.<shard>.cmd.>``
exists only while the shard is connected, so only the replica holding the shard answers, and
a shard with no connection anywhere gives the caller NATS's immediate "no responders" — the
503 of the command plane.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import time
from typing import cast

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.gateway.boards.store import direct, news_line
from services.gateway.commands.command_relay import CommandRelay
from services.gateway.counts import GatewayCounts
from services.gateway.intake import FrameIntake, Spawn
from services.gateway.settings import GatewaySettings
from services.gateway.shard_link.handshake import HandshakeRefused, accept_tls
from services.gateway.shard_link.line_reader import ShardLines
from services.gateway.shard_link.link import ShardLink
from services.gateway.shard_link.wire import Hello, HelloRefused, LineTooLong, check_hello, read_line
from shared import asyncio_internals, subjects
from shared.tls import ReloadingServerContext

log = logging.getLogger("shardbus.gateway")

HELLO_REFUSED = "gateway.hello.refused"
"""The one line a refused shard gets before the gateway closes: why (never the token)."""


class Connections:
    """Accepts a shard's connection (``handle``, the listener's callback) and keeps its link in
    ``links`` (shard → link) while it lasts; a shard's new connection replaces its old one."""

    def __init__(self, nc: Client, settings: GatewaySettings, line_cap: int, links: dict[str, ShardLink],
                 intake: FrameIntake, commands: CommandRelay, spawn: Spawn,
                 counts: GatewayCounts | None = None, tls: ReloadingServerContext | None = None) -> None:
        self.nc, self.settings, self.line_cap = nc, settings, line_cap
        self.links, self.intake, self.commands, self.spawn = links, intake, commands, spawn
        self.counts = counts or GatewayCounts()
        self.tls = tls
        """The listener's TLS (docs/gateway.md, "TLS"); None: plain TCP."""
        self.opening = 0
        """Connections accepted that are not a link yet (in their handshake or before their hello)."""

    def token_for(self, shard: str) -> str:
        """The token ``shard`` must present: its own if configured, else the common one."""
        own = self.settings.shard_tokens.get(shard)
        return (own or self.settings.shard_token).get_secret_value()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One TCP connection of the plain listener, from hello to close."""
        await self._serve(reader, writer, str(writer.get_extra_info("peername")), None)

    def take_tls(self, sock: socket.socket) -> None:
        """One accepted socket of the TLS listener (:class:`TLSHandoff`): its handshake, hello and
        life, in a task of its own."""
        self.spawn(self._tls(sock))

    async def _tls(self, sock: socket.socket) -> None:
        try:
            peer = str(sock.getpeername())
        except OSError:
            peer = "?"
        await self._serve(None, None, peer, sock)

    async def _serve(self, reader: asyncio.StreamReader | None, writer: asyncio.StreamWriter | None, peer: str,
                     sock: socket.socket | None) -> None:
        """A connection from (TLS handshake and) hello to close: ``reader`` and ``writer`` of a
        plain one, or the accepted ``sock`` of a TLS one."""
        link: ShardLink | None = None
        why = "the shard closed the connection"
        self.opening += 1
        opening = True
        try:
            reader, writer, first = await self._opening(reader, writer, sock)
            self.opening -= 1
            opening = False
            if first is None:
                return
            hello = check_hello(first, self.token_for)
            link = await self._attach(hello, writer, first, peer)
            await self._read_lines(link, reader)
        except HelloRefused as exc:
            log.warning("hello refused", extra={"peer": peer, "reason": str(exc)})
            self.counts.frame_out(HELLO_REFUSED)
            self.counts.refused("hello_refused")
            if writer is not None:
                await _tell_refused(writer, str(exc))
        except HandshakeRefused as exc:  # logged once, here: the connection ends with it
            log.warning("TLS handshake refused", extra={"peer": peer, "reason": str(exc), "refusal": exc.label})
            self.counts.refused(exc.label)
        except (LineTooLong, TimeoutError, ConnectionError, ssl.SSLError) as exc:  # SSLError: a bad record
            why = str(exc) or type(exc).__name__
            if link is None:  # a link's end is logged once, as "shard disconnected"
                log.warning("connection closed", extra={"peer": peer, "reason": why})
                if isinstance(exc, LineTooLong):
                    self.counts.refused("hello_too_long")
        except Exception as exc:  # a bug ends this connection only, logged with its trace
            why = f"the gateway failed: {exc!r}"
            log.exception("connection failed", extra={"peer": peer})
        finally:
            if opening:
                self.opening -= 1
            if link is not None:
                await self.detach(link, link.ending or why)
            if writer is not None:
                writer.close()

    async def _opening(self, reader: asyncio.StreamReader | None, writer: asyncio.StreamWriter | None,
                       sock: socket.socket | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes | None]:
        """The TLS handshake (of ``sock``, on the TLS listener) and the first line, within one
        deadline, ``hello_timeout_s``: a connection that sends nothing, or drips its handshake or
        its hello a byte at a time, is refused when it is up (HandshakeRefused, TimeoutError)."""
        timeout = self.settings.hello_timeout_s
        handshaking = sock is not None
        try:
            async with asyncio.timeout(timeout):
                if sock is not None:
                    assert self.tls is not None
                    reader, writer = await accept_tls(sock, self.tls, self.line_cap + 1, timeout)
                    handshaking = False
                assert reader is not None and writer is not None
                return reader, writer, await read_line(reader, self.line_cap)
        except TimeoutError:
            if handshaking:
                raise HandshakeRefused("handshake_timeout", f"no TLS handshake within {timeout} s") from None
            self.counts.refused("hello_timeout")
            raise TimeoutError(f"no hello within {timeout} s") from None

    async def _attach(self, hello: Hello, writer: asyncio.StreamWriter, first: bytes,
                      peer: str) -> ShardLink:
        old = self.links.get(hello.shard)
        if old is not None:
            log.info("shard reconnected; closing its old connection", extra={"shard": hello.shard})
            await self.detach(old, "replaced by a new connection")
        link = ShardLink(hello, writer)
        self.links[hello.shard] = link

        commands, announcements = subjects.command_wildcard(hello.shard), subjects.news_announce(hello.shard)

        async def on_command(msg: Msg) -> None:
            # Taken here, in the subscription's task, without a task of its own: nothing in it
            # waits (the reply is sent when the answer is read, by the sweeper or on close).
            if direct(msg, commands):
                try:
                    await self.commands.take(link, msg)
                except Exception:  # a bug costs this command its reply, not the subscription
                    log.exception("command failed", extra={"shard": link.shard, "subject": msg.subject[:200]})

        async def on_news(msg: Msg) -> None:
            if direct(msg, announcements):
                self.counts.frame_out("news.add")
                self.spawn(link.send(news_line(json.loads(msg.data), announce=True)))

        link.subscriptions = [await self.nc.subscribe(commands, cb=on_command),
                              await self.nc.subscribe(announcements, cb=on_news)]
        try:  # the server knows the subscriptions before the shard counts as connected
            await self.nc.flush(timeout=2)
        except Exception:  # noqa: BLE001 — NATS slow or away: the shard is served all the same
            log.warning("NATS did not confirm the command subscription", extra={"shard": hello.shard})
        log.info("shard connected", extra={"shard": hello.shard, "protocol": hello.protocol, "peer": peer})
        await self.intake.take_hello(link, first)
        self.spawn(self._ping(link))
        return link

    async def detach(self, link: ShardLink, why: str) -> None:
        """Close the link (commands still waiting get their 503 now) and drop its subscriptions."""
        self.counts.remember(link.shard, link.last_line_at)
        # Closed first: a command arriving until the unsubscription lands gets a 503 at once.
        if not link.closed:
            log.info("shard disconnected", extra={"shard": link.shard, "reason": why, "frames": link.frames,
                                                  "deadLetters": link.dead_letters,
                                                  "readsPaused": link.reads_paused,
                                                  "connectedForS": round(time.time() - link.connected_at, 3)})
        link.close(why)
        await self.commands.closed(link, why)
        subscriptions, link.subscriptions = link.subscriptions, []
        try:
            for sub in subscriptions:
                await sub.unsubscribe()
            if subscriptions:
                await self.nc.flush(timeout=2)
        except Exception:  # noqa: BLE001 — NATS away: the subscriptions go with the connection
            pass
        if self.links.get(link.shard) is link:
            del self.links[link.shard]

    async def detach_all(self, why: str) -> None:
        """Close every link."""
        for link in list(self.links.values()):
            await self.detach(link, why)

    async def _ping(self, link: ShardLink) -> None:
        """Ping every so often, and disconnect a shard silent past the timeout.

        A watchdog rather than a timeout around each read: that would cost a task per line."""
        ping = json.dumps({"kind": "gateway.ping"}).encode() + b"\n"
        timeout = self.settings.silence_timeout_s
        next_ping = time.monotonic() + self.settings.ping_every_s
        while not link.closed:
            await asyncio.sleep(min(self.settings.ping_every_s, timeout) / 4)
            if link.silent_for(time.time()) > timeout:
                link.ending = f"silent for {timeout} s"  # logged once, as "shard disconnected"
                link.writer.transport.abort()
                return
            if time.monotonic() >= next_ping:
                next_ping += self.settings.ping_every_s
                self.counts.frame_out("gateway.ping")
                await link.send(ping)

    async def _read_lines(self, link: ShardLink, reader: asyncio.StreamReader) -> None:
        """The lines after the hello, taken by :class:`ShardLines` as they arrive; returns when
        the shard closes, raises why the link ended otherwise."""
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        transport = cast(asyncio.Transport, link.writer.transport)
        lines = ShardLines(link, self.intake.take_now, self.line_cap, transport.get_protocol(), transport,
                           self.counts)
        # What the hello's StreamReader read past the hello is the start of the next lines.
        lines.start(*asyncio_internals.unread_and_eof(reader))
        await lines.done


async def _tell_refused(writer: asyncio.StreamWriter, reason: str) -> None:
    """Say why the hello was refused, on one line, before closing (best effort)."""
    try:
        writer.write(json.dumps({"kind": HELLO_REFUSED, "reason": reason}).encode() + b"\n")
        await asyncio.wait_for(writer.drain(), 1.0)
    except (ConnectionError, TimeoutError):
        pass
