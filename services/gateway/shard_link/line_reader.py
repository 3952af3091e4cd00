"""A shard's lines after its hello, taken in the event loop's read callback.

Before, each connection had a task reading a line at a time (``StreamReader.readuntil``): every
frame cost a wake-up of that task, and with 1,000 shards at 20 frames/s those wake-ups were a
fifth of the gateway's CPU (py-spy, issue 26). Once the hello is checked, the connection's
transport is handed to :class:`ShardLines`, which splits what arrives into lines and takes each
at once (``FrameIntake.take_now``). When a line cannot be taken without waiting (its publisher
full: back-pressure; a command's answer to send) reading is paused until it is, so the shard's
order holds and its socket fills (TCP back-pressure), as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from services.gateway.counts import GatewayCounts
from services.gateway.shard_link.link import WRITE_HIGH_WATER, ShardLink
from services.gateway.shard_link.wire import LineTooLong

TakeNow = Callable[[ShardLink, bytes], Coroutine[Any, Any, None] | None]
"""Takes one line now; returns what is left to await, if anything (``FrameIntake.take_now``)."""


class ShardLines(asyncio.Protocol):
    """The protocol of a shard's connection after its hello. ``done`` ends with None when the
    shard closes, or with why the link ended (LineTooLong, ConnectionError, a bug's exception).

    The ``StreamReaderProtocol`` it replaces keeps serving the connection's ``StreamWriter``:
    its flow control (``drain``) and its end are passed on to it."""

    def __init__(self, link: ShardLink, take_now: TakeNow, cap: int, stream: asyncio.BaseProtocol,
                 transport: asyncio.Transport, counts: GatewayCounts | None = None) -> None:
        self.link, self.take_now, self.cap = link, take_now, cap
        self.counts = counts or GatewayCounts()
        self.stream, self.transport = stream, transport
        self.buf = bytearray()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rest: asyncio.Future[None] | None = None
        """What is left of taking a line, while it is awaited (reading is paused meanwhile)."""
        self._eof = False
        self._half_open = transport.get_extra_info("ssl_object") is None
        """Plain TCP may stay half-open after the shard's EOF; TLS closes with it (asyncio's SSL
        transport warns when asked otherwise)."""

    def start(self, buffered: bytes, eof: bool) -> None:
        """Take over the transport, with the bytes the hello's reader had already read."""
        self.transport.set_protocol(self)
        if not self.transport.is_reading():  # the hello's reader had paused it (its buffer full)
            self.transport.resume_reading()
        if buffered:
            self.data_received(buffered)
        if eof:
            self.eof_received()

    # Flow control and the end of the connection also reach the StreamWriter's protocol.
    def pause_writing(self) -> None:
        self.stream.pause_writing()

    def resume_writing(self) -> None:
        self.stream.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stream.connection_lost(exc)
        self._end(exc)

    def eof_received(self) -> bool:
        self._eof = True
        if self._rest is None:
            self._at_eof()
        return self._half_open  # half-open: the gateway closes it (Connections.handle)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self._rest is None:
            self._take_lines()

    def _take_lines(self) -> None:
        """Take the buffer's whole lines until one must wait (then reading is paused, and the
        rest waits in the buffer: whole lines, however many, are not a long line). The cap is
        on one line: the line being taken, or the unfinished one after the last newline
        (docs/gateway.md, "Wire"). Lines before an over-long one are all taken first."""
        buf, cap = self.buf, self.cap
        start = 0
        try:
            while not self.done.done():
                end = buf.find(b"\n", start)
                if end < 0:
                    if len(buf) - start > cap:  # unfinished, and already past the cap
                        raise LineTooLong(f"line longer than {cap} bytes")
                    break
                if end - start > cap:
                    raise LineTooLong(f"line longer than {cap} bytes")
                line = bytes(buf[start:end]).rstrip(b"\r")
                start = end + 1
                if self._take(line):
                    break
            del buf[:start]
        except Exception as exc:  # noqa: BLE001 — the link ends with it (Connections.handle says why)
            del buf[:start]
            self._end(exc)

    def _take(self, line: bytes) -> bool:
        """Take one line; True when what is left of it must be awaited first."""
        link = self.link
        link.last_line_at = time.time()
        link.line_no += 1
        if not line.strip():
            return False
        rest = self.take_now(link, line)
        if rest is None:
            if link.unsent_bytes() <= WRITE_HIGH_WATER:
                return False
            # The shard reads slower than its lines make the gateway write (a frame.ack each):
            # its next lines wait until it has read, rather than the link ending at UNREAD_MAX.
            rest = link.drained()
        self.transport.pause_reading()
        link.held = True
        link.reads_paused += 1
        self.counts.reads_paused += 1
        self._rest = asyncio.ensure_future(self._finish(rest))
        return True

    async def _finish(self, rest: Coroutine[Any, Any, None]) -> None:
        try:
            await rest
        except Exception as exc:  # noqa: BLE001 — the link ends with it
            self._end(exc)
            return
        finally:
            self._rest = None
            self.link.held, self.link.released_at = False, time.time()
        if self.done.done():
            return
        self.transport.resume_reading()
        self._take_lines()
        if self._eof and self._rest is None:
            self._at_eof()

    def _at_eof(self) -> None:
        """The shard closed its side: what is left unterminated is its last line."""
        if self.buf and not self.done.done():
            line, self.buf = bytes(self.buf).rstrip(b"\r"), bytearray()
            if self._take(line):
                return  # taken in full by _finish, which comes back here
        self._end(None)

    def _end(self, exc: Exception | None) -> None:
        if not self.done.done():
            if exc is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc)
                self.done.exception()  # retrieved: Connections.handle awaits it, or is gone
