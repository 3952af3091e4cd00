"""A userspace TCP proxy for the hosts scenarios (docs/reliability.md, "Hosts", "A lossy
link"): the kernel here has no ``netem``, so delay, stalls and dropped connections are made by
a proxy placed on a link. It listens on the bridge's address (the test's own namespace, which
every host reaches) and forwards each connection to its target; the test then, at the moments
its seed chose:

- :meth:`Proxy.delay` holds every chunk, both ways, that long before passing it on (in order);
- :meth:`Proxy.stall` passes nothing on, either way, for that long (the connections stay open,
  the bytes wait: a link gone silent, then back);
- :meth:`Proxy.drop` ends every connection of a link with a TCP reset, both sides.

The proxy runs its own event loop in a thread of the test process, so a test's blocking calls
(the monitoring requests of ``harness.py``) cannot stall it by accident; :meth:`Proxy.stop`
closes every listener and connection and joins the thread."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tests.hosts import harness
from tests.hosts.net import Host, Hosts
from tests.hosts.scene import Wiring

T = TypeVar("T")


@dataclass
class Link:
    """One proxied address: what it forwards to, its faults now, and what it carried."""

    name: str
    target: tuple[str, int]
    port: int = 0
    delay_s: float = 0.0
    stalled_until: float = 0.0
    server: asyncio.Server | None = None
    open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = field(default_factory=set)
    accepted: int = 0
    dropped: int = 0
    bytes: int = 0


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped connection ends."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    """Listeners on ``listen_host``, one a :class:`Link`, served by one thread."""

    def __init__(self, listen_host: str) -> None:
        self.listen_host = listen_host
        self.links: dict[str, Link] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="hosts-proxy", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    # --- links ------------------------------------------------------------------------------

    def add(self, name: str, host: str, port: int) -> int:
        """A new link forwarding to ``host:port``; returns the port it listens on."""
        link = Link(name, (host, port))

        async def serve() -> int:
            link.server = await asyncio.start_server(lambda r, w: self._accept(link, r, w), self.listen_host, 0)
            return int(link.server.sockets[0].getsockname()[1])

        link.port = self._call(serve())
        self.links[name] = link
        return link.port

    def address(self, name: str) -> str:
        return f"{self.listen_host}:{self.links[name].port}"

    async def _accept(self, link: Link, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        link.accepted += 1
        try:
            target_r, target_w = await asyncio.wait_for(asyncio.open_connection(*link.target), 5.0)
        except (OSError, TimeoutError):
            _reset(client_w)
            return
        pair = (client_w, target_w)
        link.open.add(pair)
        try:
            await asyncio.gather(self._pump(link, client_r, target_w), self._pump(link, target_r, client_w))
        finally:
            link.open.discard(pair)
            for writer in pair:
                writer.transport.abort()

    async def _pump(self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: every chunk read is written ``delay_s`` later, none while stalled."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def read() -> None:
            try:
                while data := await reader.read(65536):
                    queue.put_nowait((self.loop.time() + link.delay_s, data))
            except (OSError, asyncio.IncompleteReadError):
                pass
            queue.put_nowait(None)

        reading = asyncio.create_task(read())
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                while (wait := max(due, link.stalled_until) - self.loop.time()) > 0:
                    await asyncio.sleep(min(wait, 0.1))  # a calm ends a stall at once
                writer.write(data)
                link.bytes += len(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            reading.cancel()
            writer.transport.abort()  # one side ended: so does the other, as a proxy's would

    # --- faults (called from the test's thread) ---------------------------------------------

    def delay(self, name: str, seconds: float) -> None:
        self.links[name].delay_s = seconds

    def stall(self, name: str, seconds: float) -> None:
        link = self.links[name]
        # Overlapping stalls: the later end holds.
        self.loop.call_soon_threadsafe(
            lambda: setattr(link, "stalled_until", max(link.stalled_until, self.loop.time() + seconds)))

    def drop(self, name: str) -> int:
        """Reset every open connection of the link; how many there were."""
        link = self.links[name]

        async def reset() -> int:
            pairs = list(link.open)
            for pair in pairs:
                for writer in pair:
                    _reset(writer)
            link.dropped += len(pairs)
            return len(pairs)

        return self._call(reset())

    def calm(self, name: str) -> None:
        """No delay, no stall."""
        link = self.links[name]
        link.delay_s = 0.0
        self.loop.call_soon_threadsafe(lambda: setattr(link, "stalled_until", 0.0))

    def counts(self) -> dict[str, dict[str, int]]:
        return {n: {"connections": link.accepted, "dropped": link.dropped, "bytes": link.bytes}
                for n, link in self.links.items()}

    def stop(self) -> None:
        """Close every listener and connection, stop the loop, join the thread."""
        if not self.thread.is_alive():
            return

        async def close() -> None:
            for link in self.links.values():
                if link.server is not None:
                    link.server.close()
                for pair in list(link.open):
                    for writer in pair:
                        writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self._call(close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            if not self.thread.is_alive():
                self.loop.close()


class Proxied(Wiring):
    """The gateway's NATS links (``nats``: one proxy a node, the gateway listing only the
    proxies, its own connections to the nodes' client port refused, so that the addresses the
    nodes advertise cannot take it round them) and/or the shards' link to the gateway
    (``shards``: the shards dial a proxy) through one :class:`Proxy`."""

    NATS, SHARDS = "the gateway's NATS link", "the shards' link"

    def __init__(self, nats: bool, shards: bool) -> None:
        self.nats, self.shards = nats, shards
        self.proxy: Proxy | None = None
        self.names: dict[str, list[str]] = {self.NATS: [], self.SHARDS: []}

    def start(self, hosts: Hosts, nodes: list[harness.Node], gw_host: Host) -> None:
        self.proxy = Proxy(hosts.gateway_address)
        if self.nats:
            for node in nodes:
                name = f"gateway→{node.name}"
                self.proxy.add(name, node.host.address, harness.CLIENT_PORT)
                self.names[self.NATS].append(name)
            hosts.refuse(gw_host, [n.host for n in nodes], harness.CLIENT_PORT)
        if self.shards:
            self.proxy.add("shards→gateway", gw_host.address, harness.SHARD_PORT)
            self.names[self.SHARDS].append("shards→gateway")

    def gateway_urls(self, nodes: list[harness.Node]) -> list[str]:
        if not self.nats or self.proxy is None:
            return super().gateway_urls(nodes)
        return [f"nats://{self.proxy.address(name)}" for name in self.names[self.NATS]]

    def shard_target(self, gw_host: Host) -> str:
        if not self.shards or self.proxy is None:
            return super().shard_target(gw_host)
        return self.proxy.address("shards→gateway")

    def links(self) -> list[str]:
        """The proxied links, by what they carry."""
        return [what for what, names in self.names.items() if names]

    def open(self, what: str) -> int:
        """Connections open now through ``what``'s proxies."""
        assert self.proxy is not None
        return sum(len(self.proxy.links[name].open) for name in self.names[what])

    def each(self, what: str) -> list[str]:
        return self.names[what]

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()

    def notes(self) -> dict[str, object]:
        return {} if self.proxy is None else {"proxies": self.proxy.counts()}
