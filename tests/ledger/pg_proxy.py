"""A TCP proxy between the ledger and a real PostgreSQL, for outage tests that need the
socket's timing under control (it runs on the test's event loop).

It forwards every byte both ways, and can:

- hold a closing server side (``hold_close``): when PostgreSQL closes a connection (a backend
  terminated, a server stopping), the proxy forwards everything the server sent — its FATAL
  message included — but keeps the client's side open until :meth:`release`. The client then
  sees the server's last message without the socket's end, as through a slow network or a
  load balancer. That is the window in which asyncpg meets a connection that died
  mid-protocol and raises ``InternalClientError``: deterministic here, a 1-in-N race without;
- reset connections (``reset_new``; :meth:`reset_all`): close the client's side with a TCP RST,
  so the client reads ``ECONNRESET``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct


class PgProxy:
    """``127.0.0.1:<port>`` → ``upstream``; :meth:`url` rewrites a database URL to pass through it."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.hold_close = False
        self.reset_new = False
        self.server_closed = asyncio.Event()
        self._released = asyncio.Event()
        self._server: asyncio.base_events.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    async def start(self) -> PgProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, database_url: str) -> str:
        """``database_url`` with its host and port replaced by the proxy's."""
        from sqlalchemy.engine import make_url

        return make_url(database_url).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def release(self) -> None:
        """Let every held client side close."""
        self._released.set()

    def reset_all(self) -> None:
        """Reset (RST) every client connection now."""
        for writer in list(self._clients):
            _reset(writer)

    async def close(self) -> None:
        self.release()
        if self._server is not None:
            self._server.close()
        self.reset_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.reset_new:
            _reset(client_w)
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(client_w)
            return
        self._clients.add(client_w)
        up = asyncio.ensure_future(self._pipe(client_r, server_w, hold=False))
        down = asyncio.ensure_future(self._pipe(server_r, client_w, hold=True))
        self._tasks.update((up, down))
        try:
            await asyncio.gather(up, down, return_exceptions=True)
        finally:
            self._tasks.difference_update((up, down))
            self._clients.discard(client_w)
            for writer in (client_w, server_w):
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, hold: bool) -> None:
        """Copy ``reader`` to ``writer``; at ``reader``'s end close ``writer`` (after a hold, if
        this is the server's side and ``hold_close`` is set)."""
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        if hold:
            self.server_closed.set()
            if self.hold_close:
                await self._released.wait()
        with contextlib.suppress(Exception):
            writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST instead of a FIN (SO_LINGER 0)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
