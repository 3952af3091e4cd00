"""One shard's accepted connection: what the gateway knows of it, the lines it writes to it
(batched per turn of the event loop), and the commands waiting for its answers."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from nats.aio.subscription import Subscription

from services.gateway.boards import RosterAssembler
from services.gateway.command_plane import CommandRejected
from services.gateway.wire import Hello

WRITE_HIGH_WATER = 1024 * 1024
"""Bytes waiting for a slow shard beyond which a sender waits for them to drain."""

Answer = tuple[dict[str, Any], bytes]
"""A shard's answer to a command: the parsed line and the line itself, verbatim."""


@dataclass
class ShardLink:
    """One shard's accepted connection."""

    hello: Hello
    writer: asyncio.StreamWriter
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    connected_at: float = field(default_factory=time.time)
    last_line_at: float = field(default_factory=time.time)
    line_no: int = 0
    frames: int = 0
    dead_letters: int = 0
    pending: dict[str, asyncio.Future[Answer]] = field(default_factory=dict)
    subscriptions: list[Subscription] = field(default_factory=list)
    outbox: list[bytes] = field(default_factory=list)
    rosters: RosterAssembler = field(default_factory=RosterAssembler)
    closed: bool = False
    ending: str | None = None
    """Why the gateway is ending this link, when it is the one ending it."""

    @property
    def shard(self) -> str:
        return self.hello.shard

    async def send(self, line: bytes) -> None:
        """Write one line to the shard (a closed link swallows it).

        Lines sent in one turn of the event loop go out in one write (one system call)."""
        if not self.post(line):
            return
        if self.writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            try:
                await self.writer.drain()
            except ConnectionError:
                pass

    def post(self, line: bytes) -> bool:
        """Queue one line for this turn's write; False when the link is closed."""
        if self.closed or self.writer.is_closing():
            return False
        if not self.outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self.outbox.append(line)
        return True

    def _flush(self) -> None:
        lines, self.outbox = self.outbox, []
        if lines and not self.closed and not self.writer.is_closing():
            self.writer.write(b"".join(lines))

    def answered(self, body: dict[str, Any], line: bytes) -> None:
        """A line carrying the ``reqId`` of a command still waiting is its answer."""
        req_id = body.get("reqId")
        if isinstance(req_id, str) and (future := self.pending.get(req_id)) and not future.done():
            future.set_result((body, line))

    def close(self, why: str) -> None:
        """Close the connection; commands still waiting get a 503."""
        if self.closed:
            return
        self.closed = True
        for future in self.pending.values():
            if not future.done():
                future.set_exception(CommandRejected(HTTPStatus.SERVICE_UNAVAILABLE,
                                                     f"shard {self.shard} disconnected ({why}) before answering"))
        self.writer.close()
