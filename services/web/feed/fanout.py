"""Feed clients with the same filter share one consumer: a :class:`FeedGroup` runs one
:class:`FeedReader` whose queue is the group (:class:`GroupQueue`), and each event it reads is
offered to every member's own bounded queue, in the door's process. Plain.

The group pulls only what every member has room for, so an offer always fits. A member that
takes nothing for ``DETACH_S`` while the group waits for its room is *detached*: it leaves the
group at the sequence it has reached and reads on with a consumer of its own (hub.py), paced by
its own reading, where the drop-on-slow rule takes it as before. The others wait at most that
long for one slow client, and never lose an event to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from services.web.feed.queue import FeedQueue, PullBudget
from services.web.feed.reader import FeedReader
from services.web.feed.stream import FeedEvent, FeedStream

DETACH_S = 0.5
"""Longest the group waits for a member that takes nothing (capped at a quarter of the stall
time, so a slow client is detached long before it could be dropped for being slow)."""


class Member:
    """One client in a group: its queue, the first sequence it wants, and the sequence it
    reads on from when detached (set once: the group has left it)."""

    def __init__(self, queue: FeedQueue, start: int) -> None:
        self.queue, self.start = queue, start
        self.detached: asyncio.Future[int] = asyncio.get_running_loop().create_future()


class GroupQueue:
    """The queue interface FeedReader fills, over every member's queue."""

    def __init__(self, max_bytes: int, max_messages: int, detach_s: float) -> None:
        self.max_bytes, self.max_messages, self.detach_s = max_bytes, max_messages, detach_s
        self.members: list[Member] = []
        self.took = asyncio.Event()  # a member's queue gave something up (set by FeedQueue)
        self.next_seq: Callable[[], int] = lambda: 0

    def room(self) -> tuple[int, int]:
        rooms = [m.queue.room() for m in self.members]
        return (min(r[0] for r in rooms), min(r[1] for r in rooms)) if rooms else (self.max_messages, self.max_bytes)

    async def put(self, event: FeedEvent) -> None:
        # No await before every member has it: a member joining meanwhile sees a whole event or none.
        for member in list(self.members):
            if event.seq >= member.start and not member.queue.offer(event):
                self.detach(member, event.seq)  # cannot happen while pulls fit every member; safe if it does

    async def wait_room(self) -> None:
        await self._wait(lambda q: len(q.items) > q.max_messages // 2 or q.bytes > q.max_bytes // 2)

    async def wait_empty(self) -> None:
        await self._wait(lambda q: bool(q.items))

    async def _wait(self, short: Callable[[FeedQueue], bool]) -> None:
        """Until no member is ``short`` of room; a member taking nothing for ``detach_s``
        meanwhile is detached."""
        began = time.monotonic()
        while lacking := [m for m in self.members if short(m.queue)]:
            now = time.monotonic()
            for member in lacking:
                if now - max(began, member.queue.taken_at) >= self.detach_s:
                    self.detach(member, self.next_seq())
            if any(m in self.members for m in lacking):
                self.took.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.detach_s / 4):
                        await self.took.wait()

    def detach(self, member: Member, at: int) -> None:
        if member in self.members:
            self.members.remove(member)
            member.queue.notify = None
            member.detached.set_result(max(at, member.start))


class FeedGroup:
    """One shared consumer for the clients of one filter."""

    def __init__(self, nc: Any, stream: FeedStream, filters: list[str], start: int,
                 accept: Callable[[FeedEvent], bool], budget: PullBudget, max_bytes: int, max_messages: int,
                 stall_s: float) -> None:
        self.queue = GroupQueue(max_bytes, max_messages, min(DETACH_S, stall_s / 4))
        self.reader = FeedReader(nc, stream, filters, start, accept, self.queue, budget)  # type: ignore[arg-type]
        self.queue.next_seq = lambda: self.reader.next_seq
        self.task = asyncio.create_task(self.reader.run())

    @property
    def members(self) -> list[Member]:
        return self.queue.members

    def join(self, queue: FeedQueue, start: int) -> Member:
        """A member from ``start`` on (or from where the group is, if it is further on)."""
        member = Member(queue, max(start, self.reader.next_seq))
        queue.notify = self.queue.took
        self.queue.members.append(member)
        return member

    async def follow(self, member: Member) -> int:
        """Until ``member`` is detached: the sequence it reads on from. Raises what ended the
        group's reader (the feed failed)."""
        done: list[asyncio.Future[Any]] = [member.detached, self.task]
        await asyncio.wait(done, return_when=asyncio.FIRST_COMPLETED)
        if member.detached.done():
            return member.detached.result()
        if not self.task.cancelled() and (exc := self.task.exception()) is not None:
            raise exc
        raise RuntimeError("the feed's shared reader ended")

    def leave(self, member: Member) -> None:
        if member in self.queue.members:
            self.queue.members.remove(member)
            member.queue.notify = None
