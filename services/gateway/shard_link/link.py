"""One shard's accepted connection: what the gateway knows of it, the lines it writes to it
(batched per turn of the event loop), and the commands waiting for its answers (its reqId map;
``command_relay.py`` fills it, answers and expires it)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from nats.aio.subscription import Subscription

from services.gateway.boards.rules import RosterAssembler
from services.gateway.shard_link.wire import Hello

WRITE_HIGH_WATER = 1024 * 1024
"""Bytes waiting for a slow shard beyond which a sender waits for them to drain."""

UNREAD_MAX = 64 * 1024 * 1024
"""Bytes written to a shard and not taken by its socket beyond which the gateway ends the link:
what it writes unasked (``frame.ack`` for every stored frame, pings, news) cannot be refused or
wait, so a shard that sends and never reads would otherwise grow the gateway's memory without
bound. (Commands are refused well before this: ``command_relay.UNSENT_LIMIT``.)"""


@dataclass(slots=True)
class Waiting:
    """A command sent to the shard and not answered yet: where its caller waits for the reply
    (the request's reply subject, and its headers, which a reply carries back as
    ``Msg.respond`` does), the verb (its answer's status depends on it) and, in the event
    loop's clock, when its time is up (then 504)."""

    reply: str
    headers: dict[str, str] | None
    verb: str
    deadline: float


@dataclass(eq=False)
class ShardLink:
    """One shard's accepted connection."""

    hello: Hello
    writer: asyncio.StreamWriter
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    connected_at: float = field(default_factory=time.time)
    last_line_at: float = field(default_factory=time.time)
    held: bool = False
    """True while the gateway holds the shard's lines (reading paused: back-pressure). The
    shard is not silent then, it is not being heard: the silence watchdog waits."""
    released_at: float = 0.0
    """When the gateway last stopped holding the shard's lines (``time.time()``)."""
    reads_paused: int = 0
    """Times the gateway held the shard's lines (logged when the link ends)."""
    line_no: int = 0
    frames: int = 0
    dead_letters: int = 0
    pending: dict[str, Waiting] = field(default_factory=dict)
    """reqId → the command waiting for the shard's answer. In the order sent, which is the
    order of their deadlines (every command has the same timeout): the relay's sweeper reads
    only the front."""
    subscriptions: list[Subscription] = field(default_factory=list)
    outbox: list[bytes] = field(default_factory=list)
    rosters: RosterAssembler = field(default_factory=RosterAssembler)
    closed: bool = False
    closed_why: str = ""
    """Why the link was closed (the 503 of the commands that were waiting says it)."""
    ending: str | None = None
    """Why the gateway is ending this link, when it is the one ending it."""

    @property
    def shard(self) -> str:
        return self.hello.shard

    def silent_for(self, now: float) -> float:
        """Seconds the shard has been silent, for the watchdog: none while the gateway holds its
        lines, and counted again from when it let go of them (docs/gateway.md, "Wire")."""
        if self.held:
            return 0.0
        return now - max(self.last_line_at, self.released_at)

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

    async def drained(self) -> None:
        """Wait until the shard has read what waits for it (to the transport's low-water mark)."""
        await self.writer.drain()

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
            if (unread := self.writer.transport.get_write_buffer_size()) > UNREAD_MAX:
                # Logged once, as "shard disconnected" with this reason (connections.py).
                self.ending = f"the shard does not read what the gateway writes ({unread} bytes waiting)"
                self.writer.transport.abort()

    def unsent_bytes(self) -> int:
        """Bytes written to the shard and not yet taken by its socket (this turn's lines aside)."""
        return self.writer.transport.get_write_buffer_size()

    def close(self, why: str) -> None:
        """Close the connection. The commands still waiting are the relay's to answer (503:
        ``CommandRelay.closed``, which ``Connections.detach`` calls at once)."""
        if self.closed:
            return
        self.closed = True
        self.closed_why = why
        self.writer.close()
