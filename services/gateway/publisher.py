"""Publishing one shard's frames to JetStream: in order, with a bounded window of
acknowledgements in flight, and without loss while NATS is away.

Each shard has one :class:`ShardPublisher` for the life of the gateway (it outlives a
connection, so a reconnect cannot overtake frames still buffered). Its queue is bounded:
when it is full, the reader awaiting :meth:`put` stops reading from the shard, which is
TCP back-pressure. Every message carries a ``Nats-Msg-Id``, so publishing one again after a
failure is de-duplicated by JetStream.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import nats.errors
import nats.js.api
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

log = logging.getLogger("shardbus.gateway.publisher")

RETRY_PAUSE_S = 0.2
"""Pause before publishing a frame again after a failure (NATS away, no acknowledgement)."""

REFUSALS_BEFORE_DEAD_LETTER = 5
"""Times JetStream may refuse one message while NATS is up (not a timeout: an error answer)
before it is dead-lettered with the reason: one bad message must not wedge the shard's
publisher, and every later frame behind it."""

REASON_HEADER = "Shardbus-Reason"
"""Header of a dead letter saying why it could not be a frame (or could not be stored)."""

REASON_CHARS = 300
"""Longest reason header: headers count against NATS's max payload."""


def refuses_the_message(error: Exception) -> bool:
    """True when the error is about this message (too big, a bad subject, JetStream's 4xx),
    not about NATS being slow, away or electing a leader (retried for as long as it takes,
    so nothing is lost or reordered during a fault)."""
    if isinstance(error, (nats.errors.MaxPayloadError, nats.errors.BadSubjectError)):
        return True
    code = getattr(error, "code", None)
    return isinstance(error, nats.js.errors.APIError) and isinstance(code, int) and 400 <= code < 500



CONNECTED_POLL_S = 0.05
"""How often a publisher looks whether NATS is back."""

NO_RESPONDERS = "503"
"""The status header of NATS's "no responders": no stream takes the subject."""


class AckInbox:
    """JetStream's acknowledgements of every publisher of one gateway, on one subscription:
    each message's reply subject is the inbox's prefix and a counter, and its acknowledgement
    completes the message's future (with None; an error answer with its ``APIError``).

    What ``JetStreamContext.publish_async`` does, for less: it draws random bytes (a system call)
    for each message's reply subject and builds a ``PubAck`` dataclass from each
    acknowledgement, which a publisher never reads (a fifth of the gateway's CPU per frame,
    py-spy, issue 15). No cap of its own on the messages waiting for their acknowledgement:
    each shard's publisher has its window (``SHARDBUS_PUBLISH_WINDOW``). ``publish_async``'s
    cap of 4,000 for the whole gateway was what held 1,000 shards × 20 frames/s back
    (bench/gateway.py: frame p99 6-12 s with it, 0.3 s without; the gateway's CPU half idle)."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = ""
        self._sub: Subscription | None = None
        self._starting = asyncio.Lock()
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._numbers = itertools.count(1)

    async def start(self) -> None:
        """Subscribe to the inbox (done by the first :meth:`publish` if not before)."""
        async with self._starting:
            if self._sub is None:
                prefix = f"{self.nc.new_inbox()}."
                self._sub = await self.nc.subscribe(f"{prefix}*", cb=self._on_ack)
                self.prefix = prefix

    def waiting(self) -> int:
        """Messages published and not acknowledged (nor forgotten) yet."""
        return len(self._waiting)

    async def publish(self, subject: str, data: bytes, headers: dict[str, str]) -> tuple[str, asyncio.Future[None]]:
        """Publish one message to JetStream; its token (for :meth:`forget`) and the future its
        acknowledgement completes."""
        if self._sub is None:
            await self.start()
        token = f"{next(self._numbers):x}"
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        try:
            await self.nc.publish(subject, data, reply=self.prefix + token, headers=headers)
        except BaseException:
            self.forget(token)
            raise
        return token, future

    def forget(self, token: str | None) -> None:
        """Stop waiting for the acknowledgement of ``token`` (it is published again, or the
        publisher stops); one that still comes is dropped."""
        if token is not None and (future := self._waiting.pop(token, None)) is not None:
            future.cancel()

    async def _on_ack(self, msg: Msg) -> None:
        future = self._waiting.pop(msg.subject[len(self.prefix):], None)
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get(nats.js.api.Header.STATUS) == NO_RESPONDERS:
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            answer = json.loads(msg.data)
            error = answer.get("error") if isinstance(answer, dict) else "not a JSON object"
            if error is None:
                future.set_result(None)
                return
            if isinstance(error, dict) and "code" in error:
                nats.js.errors.APIError.from_error(error)  # raises the error's class
            raise nats.js.errors.APIError(description=str(error)[:REASON_CHARS])
        except Exception as exc:  # noqa: BLE001 — the message is published again: the acknowledger decides
            future.set_exception(exc)


@dataclass
class Outgoing:
    """One message to JetStream: subject, exact bytes, de-duplication id, extra headers,
    and the shard's ``seq`` to acknowledge once it is stored (if it had one)."""

    subject: str
    data: bytes
    msg_id: str
    headers: dict[str, str] = field(default_factory=dict)
    ack_seq: int | None = None


class ShardPublisher:
    """An ordered, windowed, loss-free publisher for one shard's messages.

    A sender sends each queued message as soon as a window slot is free (through the
    gateway's :class:`AckInbox`); an acknowledger
    awaits the acknowledgements in order. When one does not come (NATS away, an error), the
    acknowledger stops the sender (the lock) and publishes every unacknowledged message
    again, one at a time, in order; JetStream drops the ones it already holds."""

    def __init__(self, nc: Client, js: JetStreamContext, *, window: int, ack_timeout_s: float,
                 buffer: int, on_stored: Callable[[Outgoing], None], buffer_bytes: int = 64 * 1024 * 1024,
                 dead_letter_subject: str | None = None, acks: AckInbox | None = None) -> None:
        self.nc, self.js = nc, js
        self.acks = acks or AckInbox(nc)
        self.ack_timeout_s = ack_timeout_s
        self.queue: asyncio.Queue[Outgoing] = asyncio.Queue()
        self.buffer = buffer
        self.buffer_bytes = buffer_bytes
        self.dead_letter_subject = dead_letter_subject
        self.held_bytes = 0
        """Bytes put and not yet stored (queued, held or in flight): bounded by ``buffer_bytes``."""
        self.most_held_bytes = 0
        self.dead_lettered = 0
        self._room = asyncio.Event()
        self.on_stored = on_stored
        self.published = 0
        self.retries = 0
        self._in_flight: deque[tuple[Outgoing, str | None, asyncio.Future[None]]] = deque()
        self._slots = asyncio.Semaphore(window)
        self._lock = asyncio.Lock()
        self._flying = asyncio.Event()
        self._holding = 0
        self._tasks: list[asyncio.Task[None]] = []

    def has_room(self, item: Outgoing) -> bool:
        """True when :meth:`put` of ``item`` would queue it at once, without waiting."""
        return not (self.queue.qsize() >= self.buffer
                    or (self.held_bytes and self.held_bytes + len(item.data) > self.buffer_bytes))

    async def put(self, item: Outgoing) -> None:
        """Queue a message; once the buffer is full — by count, or by bytes held — waits
        (back-pressure) until it is half empty again, so reading and publishing go in batches
        rather than one by one. A single message larger than the byte bound still goes alone."""
        size = len(item.data)
        if not self.has_room(item):
            while self.queue.qsize() > self.buffer // 2 or (self.held_bytes and
                                                             self.held_bytes + size > self.buffer_bytes // 2):
                self._room.clear()
                await self._room.wait()
        self.held_bytes += size
        self.most_held_bytes = max(self.most_held_bytes, self.held_bytes)
        self.queue.put_nowait(item)

    def _release(self, item: Outgoing) -> None:
        self.held_bytes -= len(item.data)
        if self.queue.qsize() <= self.buffer // 2 and self.held_bytes <= self.buffer_bytes // 2:
            self._room.set()
        if self.held_bytes == 0 and self.most_held_bytes > self.buffer_bytes // 2:
            self.most_held_bytes = 0
            _give_memory_back()

    def pending(self) -> int:
        """Messages not yet stored by JetStream (buffered or in flight)."""
        return self.queue.qsize() + self._holding + len(self._in_flight)

    def start(self) -> None:
        """Start publishing in the background."""
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._acknowledge())]
            for task in self._tasks:
                task.add_done_callback(_log_crash)

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Give buffered messages a moment to reach JetStream, then stop."""
        deadline = asyncio.get_running_loop().time() + drain_timeout_s
        # Polled: pending() counts three places (queue, hand-over, in flight); no one event says all are empty.
        while self.pending() and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if self.pending():
            log.warning("stopped with frames unpublished", extra={"pending": self.pending()})
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for _, token, future in self._in_flight:
            self.acks.forget(token)
            future.cancel()

    async def _connected(self) -> None:
        # Issue nothing while NATS is away: nats-py would buffer it and could send it after
        # an earlier message that is about to be published again (out of order).
        # Polled: nats-py has no "connected again" event, and its callbacks are the broker's.
        while not self.nc.is_connected:  # noqa: ASYNC110
            await asyncio.sleep(CONNECTED_POLL_S)

    def _headers(self, item: Outgoing) -> dict[str, str]:
        return {"Nats-Msg-Id": item.msg_id, **item.headers}

    async def _send(self) -> None:
        while True:
            item = await self.queue.get()
            if self.queue.qsize() <= self.buffer // 2 and self.held_bytes <= self.buffer_bytes // 2:
                self._room.set()
            self._holding = 1
            await self._slots.acquire()
            async with self._lock:
                await self._connected()
                token: str | None = None
                try:
                    token, future = await self.acks.publish(item.subject, item.data, self._headers(item))
                except Exception:  # noqa: BLE001 — NATS went away between the check and the send
                    future = _failed_future()
                self._in_flight.append((item, token, future))
                self._holding = 0
                self._flying.set()

    async def _acknowledge(self) -> None:
        while True:
            while not self._in_flight:
                self._flying.clear()
                await self._flying.wait()
            item, _, future = self._in_flight[0]
            try:
                if not future.done():  # acks that already came are taken without a pause
                    await asyncio.wait_for(future, self.ack_timeout_s)
                future.result()
            except Exception as exc:  # noqa: BLE001 — no ack in time, or an error ack: published again
                async with self._lock:
                    await self._republish_in_order(exc)
                continue
            self._in_flight.popleft()
            self._slots.release()
            self._stored(item)

    async def _republish_in_order(self, exc: Exception) -> None:
        """Publish every unacknowledged message again, one at a time, in order."""
        log.warning("JetStream did not acknowledge; publishing again in order",
                    extra={"reason": repr(exc), "count": len(self._in_flight)})
        for _, token, future in self._in_flight:
            self.acks.forget(token)
            future.cancel()
        while self._in_flight:
            item, _, _ = self._in_flight[0]
            refusals = 0
            while True:
                await self._connected()
                try:
                    await self.js.publish(item.subject, item.data, timeout=self.ack_timeout_s,
                                          headers=self._headers(item))
                    break
                except Exception as error:  # noqa: BLE001 — retried; refused ones are dead-lettered
                    self.retries += 1
                    log.debug("publish failed, retrying", extra={"reason": repr(error)})
                    if refuses_the_message(error):
                        refusals += 1
                        if refusals >= REFUSALS_BEFORE_DEAD_LETTER:
                            await self._dead_letter(item, error)
                            break
                await asyncio.sleep(RETRY_PAUSE_S)
            self._in_flight.popleft()
            self._slots.release()
            self._stored(item)

    async def _dead_letter(self, item: Outgoing, error: Exception) -> None:
        """Keep a message JetStream keeps refusing on the dead-letter subject, with why."""
        reason = f"JetStream refused it {REFUSALS_BEFORE_DEAD_LETTER} times: {error!r}"[:REASON_CHARS]
        log.error("a message JetStream keeps refusing was dead-lettered",
                  extra={"subject": item.subject, "reason": reason, "bytes": len(item.data)})
        if self.dead_letter_subject is None or item.subject == self.dead_letter_subject:
            return  # a refused dead letter: the log line above is all that can be kept
        room = max(0, self.nc.max_payload - 4096)
        headers = {"Nats-Msg-Id": f"{item.msg_id}.refused", REASON_HEADER: reason,
                   "Shardbus-Subject": item.subject[:REASON_CHARS]}
        if len(item.data) > room:
            headers["Shardbus-Truncated"] = str(len(item.data))
        try:
            await self.js.publish(self.dead_letter_subject, item.data[:room], timeout=self.ack_timeout_s,
                                  headers=headers)
            self.dead_lettered += 1
        except Exception as again:  # noqa: BLE001 — the log line is all that can be kept
            log.error("the dead letter was refused too", extra={"reason": repr(again)})

    def _stored(self, item: Outgoing) -> None:
        self._release(item)
        self.published += 1
        try:
            self.on_stored(item)
        except Exception:  # an acknowledgement to a closed shard must not stop publishing
            log.exception("on_stored failed")


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("publisher stopped", exc_info=task.exception())


def _give_memory_back() -> None:
    """After a large backlog drains, hand freed heap pages back to the system (glibc keeps
    them otherwise, and a gateway that once buffered 300 MB would keep that RSS)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _failed_future() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_exception(ConnectionError("NATS connection lost while publishing"))
    future.exception()  # mark retrieved: the retry path handles it
    return future
