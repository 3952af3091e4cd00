"""uvicorn's HTTP protocol with its writes coalesced: what one connection writes during one pass
of the event loop goes to the socket in one send.

uvicorn writes a response's head and its body separately, and the door's sockets have
TCP_NODELAY (app.py), so every response cost two sends on the door and two packets, often two
wake-ups, on the client; a WebSocket feed client's batch of events cost a send each
(profiled: docs/performance.md, "Web door"). The bytes on the wire are the same.

uvicorn's protocol class is reached through its fence, services/web/uvicorn_internals.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.web import uvicorn_internals


class CoalescingTransport:
    """A transport whose writes wait for the end of the loop's current pass, then go as one;
    everything else is the wrapped transport's (flow control included: it sees the bytes when
    they are sent)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending = []
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()  # what was written before the close is sent, as by the transport itself
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


DoorHttp = uvicorn_internals.http_protocol(CoalescingTransport)
"""uvicorn's httptools protocol on a :class:`CoalescingTransport` (a WebSocket upgrade keeps it:
uvicorn hands the same transport on)."""
