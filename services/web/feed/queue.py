"""Bounds of the feed: one client's queue of events (bytes and messages), and the door's
budget of bytes asked from NATS and not yet received. Plain."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from services.web.feed.stream import FeedEvent

MIN_PULL_BYTES = 16 * 1024
"""The least share of the pull budget one request takes."""


class FeedQueue:
    """Events waiting for one client, bounded in messages and bytes. One event that is alone
    may exceed the byte cap (else it could never be sent)."""

    def __init__(self, max_bytes: int, max_messages: int) -> None:
        self.max_bytes, self.max_messages = max_bytes, max_messages
        self.items: deque[FeedEvent] = deque()
        self.bytes = 0
        self.peak_bytes = 0
        self.peak_messages = 0
        self._took = asyncio.Event()  # something left the queue
        self._put = asyncio.Event()  # something entered it
        self._woken = False
        self.taken_at = 0.0  # when something last left the queue
        self.notify: asyncio.Event | None = None  # also set when something leaves (a shared reader waits on it)

    def room(self) -> tuple[int, int]:
        """Messages and bytes that still fit."""
        return self.max_messages - len(self.items), self.max_bytes - self.bytes

    def fits(self, event: FeedEvent) -> bool:
        return not self.items or (len(self.items) < self.max_messages and self.bytes + event.size <= self.max_bytes)

    async def put(self, event: FeedEvent) -> None:
        """Add ``event`` once it fits."""
        while not self.fits(event):
            self._took.clear()
            await self._took.wait()
        self._add(event)

    def offer(self, event: FeedEvent) -> bool:
        """Add ``event`` if it fits now."""
        if not self.fits(event):
            return False
        self._add(event)
        return True

    def _add(self, event: FeedEvent) -> None:
        self.items.append(event)
        self.bytes += event.size
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        self.peak_messages = max(self.peak_messages, len(self.items))
        self._put.set()

    async def wait_room(self) -> None:
        """Until at least half of each cap is free (pulling a handful at a time costs more)."""
        while len(self.items) > self.max_messages // 2 or self.bytes > self.max_bytes // 2:
            self._took.clear()
            await self._took.wait()

    async def wait_empty(self) -> None:
        while self.items:
            self._took.clear()
            await self._took.wait()

    async def get(self) -> FeedEvent | None:
        """The oldest event, once there is one; None when :meth:`wake` was called meanwhile."""
        while not self.items:
            if self._woken:
                self._woken = False
                return None
            self._put.clear()
            await self._put.wait()
        event = self.items.popleft()
        self.bytes -= event.size
        self._taken()
        return event

    def wake(self) -> None:
        """Make a waiting :meth:`get` return None (time for a keep-alive)."""
        self._woken = True
        self._put.set()

    def take_ready(self, max_bytes: int) -> list[FeedEvent]:
        """More events already waiting, up to about ``max_bytes`` (one chunk of SSE)."""
        taken: list[FeedEvent] = []
        size = 0
        while self.items and size + self.items[0].size <= max_bytes:
            event = self.items.popleft()
            self.bytes -= event.size
            size += event.size
            taken.append(event)
        if taken:
            self._taken()
        return taken

    def _taken(self) -> None:
        self.taken_at = time.monotonic()
        self._took.set()
        if self.notify is not None:
            self.notify.set()


class PullBudget:
    """Bytes all of one door's readers may have asked NATS for and not yet received. NATS
    pushes what a pull asks for as fast as it can; a door pulling for many clients at once could
    exceed what the server buffers for one connection (``max_pending``, 64 MiB by default) and
    be cut off as a slow consumer. Each request takes at most its share (the budget over the
    readers, at least MIN_PULL_BYTES) and gives it back when it is over; readers ask for little
    while idle and more while their pulls fill up (reader.py), so idle clients hold little."""

    def __init__(self, total: int) -> None:
        self.total = self.free = total
        self.readers = 0
        self._freed = asyncio.Event()

    async def take(self, want: int) -> int:
        want = min(want, max(MIN_PULL_BYTES, self.total // max(1, self.readers)))
        least = min(want, MIN_PULL_BYTES)
        while self.free < least:
            self._freed.clear()
            await self._freed.wait()
        grant = min(want, self.free)
        self.free -= grant
        return grant

    def give(self, grant: int) -> None:
        self.free += grant
        self._freed.set()
