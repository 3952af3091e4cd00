"""The door's feed clients: the bookkeeping (:class:`FeedHub`, ``app.state.feed``: clients,
their queues, the drops), the start of a client's feed at its cursor, and the loop that writes
its events while watching that it keeps taking them. Plain: routes.py adapts it to WebSocket
and SSE.

Clients reading live with the same filter share one consumer (fanout.py); a client resuming
from further back, or detached from its group for being slow, reads with a consumer of its own.
A client that takes nothing for ``web_feed_stall_s`` while events wait is dropped with the
reason; one timer per client watches that (a timeout per write would cost a task each).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from services.web.feed.fanout import FeedGroup, Member
from services.web.feed.filter import FeedFilter, consumer_filters
from services.web.feed.queue import FeedQueue, PullBudget
from services.web.feed.reader import FeedReader
from services.web.feed.stream import FeedEvent, FeedStream
from services.web.settings import WebSettings
from shared import subjects
from shared.errors import ShardbusError

log = logging.getLogger("shardbus.web.feed")

KEEPALIVE_S = 15.0
"""An idle SSE stream gets a comment this often (proxies cut silent connections)."""

CLOSE_GRACE_S = 5.0
"""At least this long a dropped client gets to take the close (or SSE's ``event: dropped``)."""


class TooSlow(ShardbusError):
    """The client took nothing for too long while events waited."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


class FeedFull(ShardbusError):
    """The door serves as many feed clients as it may (503)."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


@dataclass
class FeedClient:
    """One connected feed client, as the door's bookkeeping shows it."""

    id: int
    transport: str
    queue: FeedQueue
    since: int = 0
    sent: int = 0
    last_seq: int = 0
    reader: FeedReader | None = None  # its own consumer (else it is in ``group``)
    group: FeedGroup | None = None
    member: Member | None = None
    dropped: str | None = None
    started: float = field(default_factory=time.monotonic)
    writing: float = 0.0  # when the write in progress began (0: none)
    wrote: float = 0.0  # when the last write ended
    in_flight: int = 0  # bytes of the write in progress

    @property
    def reading(self) -> FeedReader | None:
        """The reader filling its queue: its own, or its group's."""
        return self.reader or (self.group.reader if self.group else None)


class FeedHub:
    """Every feed client of one door, the feed stream, and the limits."""

    def __init__(self, nc: Any, settings: WebSettings) -> None:
        self.nc, self.settings = nc, settings
        self.stream = FeedStream(nc, settings)
        self.budget = PullBudget(settings.web_feed_pull_bytes)
        self.clients: dict[int, FeedClient] = {}
        self.dropped: deque[FeedClient] = deque(maxlen=100)
        self.drops = 0
        """Clients dropped since the door started (its metrics)."""
        self.stopping = asyncio.Event()
        self.groups: dict[FeedFilter, FeedGroup] = {}
        """The shared consumers, by filter (fanout.py)."""
        self._ids = itertools.count(1)

    def admit(self, transport: str) -> FeedClient:
        """A new client; FeedFull beyond ``web_feed_max_clients``."""
        limit = self.settings.web_feed_max_clients
        if len(self.clients) >= limit:
            raise FeedFull(f"too many feed clients ({limit} connected); try again later")
        client = FeedClient(next(self._ids), transport, FeedQueue(self.settings.web_feed_queue_bytes,
                                                                  self.settings.web_feed_queue_messages))
        self.clients[client.id] = client
        return client

    def release(self, client: FeedClient) -> None:
        self.clients.pop(client.id, None)
        self._leave(client)

    def _leave(self, client: FeedClient) -> None:
        group, member, client.group, client.member = client.group, client.member, None, None
        if group is None or member is None:
            return
        group.leave(member)
        self.close_if_empty(group)

    def close_if_empty(self, group: FeedGroup) -> None:
        """A group nobody follows any longer ends: its reader deletes its consumer as it ends."""
        if not group.members:
            self.groups = {k: g for k, g in self.groups.items() if g is not group}
            group.task.cancel()

    def stop(self) -> None:
        """End every feed (the door is stopping): WebSocket close 1001, SSE ``event: dropped``."""
        self.stopping.set()

    async def open(self, client: FeedClient, wanted: FeedFilter, since: int | None) -> dict[str, Any]:
        """Start ``client``'s reader after ``since`` (None: from now); returns the hello event."""
        await self.stream.ensure()
        first, last = await self.stream.bounds()
        if since is None or since > last:  # a cursor beyond the stream is from an older stream
            start, gap = last + 1, since is not None
        elif since + 1 < first:  # expired (max age or size) before the client came back
            start, gap = first, True
        else:
            start, gap = since + 1, False
        version = self.nc.connected_server_version
        many = (version.major, version.minor) >= (2, 10)
        filters = consumer_filters(wanted.subjects(self.stream.bucket_of, subjects.LEDGER_EVENTS_WILDCARD), many)
        accept: Callable[[FeedEvent], bool] = lambda e: wanted.matches(e.type, e.shard, e.kind, e.board)  # noqa: E731
        group = self.groups.get(wanted)
        if group is not None and group.task.done():  # its reader failed: its members were told so
            del self.groups[wanted]
            group = None
        if group is None and start == last + 1:  # live: the first of its filter makes the shared consumer
            group = self.groups[wanted] = FeedGroup(
                self.nc, self.stream, filters, start, accept, self.budget, self.settings.web_feed_queue_bytes,
                self.settings.web_feed_queue_messages, self.settings.web_feed_stall_s)
        if group is not None and (start == last + 1 or group.reader.next_seq <= start):
            # A live client's "now" is where the group is; a resuming one joins if the group is not past it.
            client.group, client.member = group, group.join(client.queue, start)
            start = client.member.start
            last = max(last, start - 1)
        else:  # from further back than the group: a consumer of its own
            client.reader = FeedReader(self.nc, self.stream, filters, start, accept, client.queue, self.budget)
        client.since = client.last_seq = start - 1
        return {"seq": start - 1, "type": "hello", "first": first, "last": last, "gap": gap,
                "filter": wanted.describe()}

    async def serve(self, client: FeedClient, send: Callable[[list[FeedEvent]], Awaitable[None]],
                    keepalive: Callable[[], Awaitable[None]] | None, gone: Callable[[], Coroutine[Any, Any, None]],
                    chunk_bytes: int = 0) -> str | None:
        """Stream to the client until it goes (None) or is dropped (the reason)."""
        # shape: one client's three tasks (read, pump, watchdog) share its state, and the outcome reads
        # them together: whole, the drop reasons sit beside what causes them.
        assert client.reader is not None or client.member is not None
        stall = self.settings.web_feed_stall_s

        async def read() -> None:
            if (group := client.group) is not None and client.member is not None:
                resume = await group.follow(client.member)  # detached: on with a consumer of its own
                self._leave(client)
                client.reader = FeedReader(self.nc, self.stream, group.reader.filters, resume, group.reader.accept,
                                           client.queue, self.budget)
            assert client.reader is not None
            await client.reader.run()

        async def pump() -> None:
            while True:
                event = await client.queue.get()
                batch = [] if event is None else [event, *client.queue.take_ready(chunk_bytes)] if chunk_bytes \
                    else [event]
                client.in_flight, client.writing = sum(e.size for e in batch), time.monotonic()
                await (send(batch) if batch else keepalive() if keepalive else asyncio.sleep(0))
                client.writing, client.wrote = 0.0, time.monotonic()
                if batch:
                    client.sent += len(batch)
                    client.last_seq = batch[-1].seq

        async def watchdog() -> None:
            # One timer per client rather than a timeout per write (a task each, in asyncio).
            while True:
                await asyncio.sleep(min(stall / 4, 2.5))
                now = time.monotonic()
                if client.writing and now - client.writing > stall:
                    queued = client.queue.bytes + client.in_flight
                    raise TooSlow(f"too slow: {_size(queued)} queued, none taken for {stall:g} s; "
                                  f"resume with since={client.last_seq}")
                if keepalive and not client.writing and now - client.wrote > KEEPALIVE_S:
                    client.queue.wake()

        client.wrote = time.monotonic()
        tasks = [asyncio.create_task(read()), asyncio.create_task(pump()),
                 asyncio.create_task(watchdog()), asyncio.create_task(gone()),
                 asyncio.create_task(self.stopping.wait())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await _stop(tasks)
        reader, watched = (None if t.cancelled() else t.exception() for t in (tasks[0], tasks[2]))
        if isinstance(watched, TooSlow):
            client.dropped = str(watched)
        elif self.stopping.is_set():
            client.dropped = "the door is stopping; resume with since=" + str(client.last_seq)
        elif isinstance(reader, Exception) and not isinstance(reader, asyncio.CancelledError):
            log.error("feed reader failed", exc_info=reader, extra={"client": client.id})
            client.dropped = "the feed failed; resume with since=" + str(client.last_seq)
        if client.dropped:
            self.dropped.append(client)
            self.drops += 1
            log.info("feed client dropped", extra={"client": client.id, "transport": client.transport,
                                                   "reason": client.dropped, "sent": client.sent})
        return client.dropped

    def close_grace_s(self) -> float:
        """How long a dropped client gets to take its close (it waits for room like any write)."""
        return max(self.settings.web_feed_stall_s, CLOSE_GRACE_S)


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 1024 * 1024 else f"{n / 1024:.0f} KiB"


async def _stop(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again any that swallowed it (nats-py's
    flush does), so that no task outlives its client."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
