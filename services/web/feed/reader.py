"""One feed client's read side: an ordered pull consumer on the feed stream that fills the
client's queue (queue.py) only while it has room. Plain (no FastAPI, no FastStream).

Pull, not push: the door asks NATS for at most what the client's queue can take, within the
door's pull budget, so a client that falls behind (or replays a day) is paced by its own reading
and never grows the door's memory, and NATS never has more on its way to the door than the
budget. The consumer is ephemeral, acknowledges nothing, and is *ordered* by this code: every
delivery's consumer sequence must follow the last, else (a lost message, a lost consumer, NATS
reconnected) a new consumer starts at the next stream sequence. Nothing is missed or repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.web.feed.queue import MIN_PULL_BYTES, FeedQueue, PullBudget
from services.web.feed.stream import API_TIMEOUT_S, STREAM_NOT_FOUND, FeedEvent, FeedStream, FeedUnavailable

log = logging.getLogger("shardbus.web.feed")

PULL_EXPIRES_S = 12.0
"""How long one pull request waits on the server for events (and holds its share of the
door's pull budget)."""

HEARTBEAT_S = 2.0
"""The server's heartbeat while a pull request waits; two missed = the request is lost."""

SIZE_MARGIN = 8
"""Bytes added to each delivery's size as the server counts it (see :func:`wire_size`)."""

CONSUMER_IDLE_S = 120.0
"""The server deletes a consumer nobody pulled from for this long (a door that died)."""

FILTER_NOT_SUBSET = 10093
"""JetStream's error code: a consumer filter outside the stream's subjects."""

RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Pauses between attempts to (re)create a consumer."""


class FeedReader:
    """Fills ``queue`` with the events from stream sequence ``start`` on that ``accept`` lets
    through, asking NATS to filter by ``filters`` (``[]``: no filter) and pulling within
    ``budget``. Run :meth:`run` as a task; cancel it to stop (its consumer is deleted)."""

    def __init__(self, nc: Client, stream: FeedStream, filters: list[str], start: int,
                 accept: Callable[[FeedEvent], bool], queue: FeedQueue, budget: PullBudget) -> None:
        self.nc, self.stream, self.filters, self.budget = nc, stream, filters, budget
        self.next_seq = max(1, start)
        self.accept, self.queue = accept, queue
        self.consumer: str | None = None
        self.consumer_seq = 0
        self.created = 0  # consumers made (a reset makes another): for tests and logs
        self._stale = True  # make a (new) consumer before the next pull
        self._oversize = False
        self._inbox = nc.new_inbox()
        self._sub: Any = None
        self._done = asyncio.Event()  # the current pull request is over
        self._outstanding = self._asked = 0  # deliveries the current request may still bring, asked
        self._bytes_left = 0  # of its max_bytes, as counted here
        self._filled = False  # the last request ended full (not idle)
        self._want = MIN_PULL_BYTES  # bytes the next request asks for (grows while it fills up)
        self._heard = 0.0  # when the server last sent anything (heartbeats included)
        self._waiting = False  # a delivery waits for room in the queue
        self._reconnects = 0

    async def run(self) -> None:
        # Deliveries are handled in the subscription's callback (nats-py's next_msg costs a
        # task and a uuid per message); this loop only asks for more and watches the requests.
        limit_bytes = self.queue.max_bytes + self.budget.total + self.nc.max_payload
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_message, pending_bytes_limit=limit_bytes,
                                            pending_msgs_limit=self.queue.max_messages * 2 + 64)
        self.budget.readers += 1
        try:
            while True:
                with contextlib.suppress(FeedUnavailable):  # a source stream that appeared since
                    await self.stream.ensure()  # (at most every SOURCE_CHECK_S; else nothing)
                if self._stale:
                    await self._create()
                if self._oversize:
                    await self.queue.wait_empty()
                else:
                    await self.queue.wait_room()
                # An event larger than the room is asked for alone, without max_bytes: it may
                # exceed its grant by that one event.
                want = self.nc.max_payload if self._oversize else min(self.queue.room()[1], self._want)
                grant = await self.budget.take(want)
                try:
                    if await self._request(grant):
                        await self._until_done()
                finally:
                    self.budget.give(grant)
                # Slow start: a pull that filled up asks for more next time, one that waited idle
                # for its expiry for the least (an idle client holds little of the budget).
                self._want = min(self._want * 4, self.queue.max_bytes) if self._filled else MIN_PULL_BYTES
        finally:
            self.budget.readers -= 1
            await asyncio.shield(self._close())

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()
        await self._delete(self.consumer)

    async def _delete(self, name: str | None) -> None:
        if name is None:
            return
        with contextlib.suppress(Exception):  # else it lapses after CONSUMER_IDLE_S
            await self.nc.request(f"$JS.API.CONSUMER.DELETE.{self.stream.name}.{name}", b"", timeout=2.0)

    async def _create(self) -> None:
        """A fresh consumer starting at ``next_seq``, the old one deleted first (its heartbeats
        would read as the new one's); retried until it exists."""
        old, self.consumer = self.consumer, None
        await self._delete(old)
        attempt = 0
        while True:
            name = uuid.uuid4().hex
            config: dict[str, Any] = {
                "name": name, "deliver_policy": "by_start_sequence", "opt_start_seq": self.next_seq,
                "ack_policy": "none", "inactive_threshold": int(CONSUMER_IDLE_S * 1e9),
                "mem_storage": True, "num_replicas": 1}
            # Not the form naming the filter in the API subject: a filter with wildcards would make
            # a subject nobody may publish to.
            api = f"$JS.API.CONSUMER.CREATE.{self.stream.name}.{name}"
            if len(self.filters) == 1:
                config["filter_subject"] = self.filters[0]
            elif self.filters:
                config["filter_subjects"] = self.filters
            self._reconnects = self.nc.stats["reconnects"]
            try:
                payload = json.dumps({"stream_name": self.stream.name, "config": config}).encode()
                msg = await self.nc.request(api, payload, timeout=API_TIMEOUT_S)
                honour_cancel()
                reply = json.loads(msg.data)
                error = reply.get("error") if isinstance(reply, dict) else {"description": "not an object"}
                if not error:
                    self.consumer, self.consumer_seq, self._stale = name, 0, False
                    self.created += 1
                    return
                if error.get("err_code") == STREAM_NOT_FOUND:  # deleted under us: make it again
                    await self.stream.ensure(force=True)
                if error.get("err_code") == FILTER_NOT_SUBSET and self.filters:
                    # NATS 2.9 wants a filter within the subjects of the sources that exist now
                    # (a board's bucket may not yet): no filter, then; the match here decides.
                    self.filters = []
                    continue
                reason = str(error.get("description"))
            except Exception as exc:  # noqa: BLE001 — NATS away, no answer: try again
                reason = type(exc).__name__
            log.warning("feed consumer not created; retrying", extra={"stream": self.stream.name, "reason": reason})
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
            attempt += 1

    def _reset(self, why: str) -> None:
        """Start again at ``next_seq`` with a new consumer."""
        log.debug("feed consumer reset", extra={"consumer": self.consumer, "next_seq": self.next_seq, "reason": why})
        self._stale = True
        self._done.set()

    async def _request(self, grant: int) -> bool:
        """Ask for what the queue has room for, within ``grant`` bytes (one event, whatever its
        size, when the next is larger than the room); False when NATS is away."""
        request: dict[str, Any] = {"batch": max(1, self.queue.room()[0]), "expires": int(PULL_EXPIRES_S * 1e9),
                                   "idle_heartbeat": int(HEARTBEAT_S * 1e9)}
        if self._oversize:
            request["batch"] = 1
        else:
            request["max_bytes"] = max(grant, 1024)
        self._bytes_left = request.get("max_bytes", 0)
        self._outstanding = self._asked = request["batch"]
        self._filled = False
        self._heard = time.monotonic()
        self._done.clear()
        try:
            await self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{self.stream.name}.{self.consumer}",
                                  json.dumps(request).encode(), reply=self._inbox)
            honour_cancel()
            return True
        except Exception:  # noqa: BLE001 — NATS away: make a consumer again once it is back
            self._stale = True
            await asyncio.sleep(RETRY_S[-1])
            return False

    async def _until_done(self) -> None:
        """Until the request is fulfilled or ended by the server, or lost: no heartbeat, or NATS
        reconnected meanwhile (what was on its way is gone, and the consumer counts it sent)."""
        while not self._done.is_set():
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation
            # that arrives as the event is set, and this loop would then outlive its client.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEARTBEAT_S * 2):
                    await self._done.wait()
            if self._done.is_set() or self._waiting:
                continue
            with contextlib.suppress(FeedUnavailable):
                await self.stream.ensure()
            if self.nc.stats["reconnects"] != self._reconnects:
                self._reset("NATS reconnected")
            elif time.monotonic() - self._heard > HEARTBEAT_S * 2 + 1:
                self._reset("no heartbeat")

    async def _on_message(self, msg: Msg) -> None:
        self._heard = time.monotonic()
        status = msg.headers.get("Status") if msg.headers else None
        if status:
            headers = msg.headers or {}
            code = int(status) if status.isdigit() else 0  # JetStream's statuses are HTTP's numbers
            if code == HTTPStatus.CONTINUE:
                # A heartbeat names the last consumer sequence sent: beyond ours, some were lost.
                last = headers.get("Nats-Last-Consumer", "")
                if last.isdigit() and int(last) > self.consumer_seq and not self._stale:
                    self._reset(f"heartbeat says {last} sent, {self.consumer_seq} came")
                return
            description = headers.get("Description", "")
            if code == HTTPStatus.CONFLICT and "MaxBytes" in description.replace(" ", ""):
                self._filled = True
                # None came: the next event is larger than the room; ask for it alone.
                self._oversize = self._oversize or self._outstanding == self._asked
            elif (code == HTTPStatus.CONFLICT and "Deleted" in description) or code == HTTPStatus.SERVICE_UNAVAILABLE:
                self._stale = True
            self._done.set()  # 408 expired, 409 done or refused, 404: ask again
            return
        meta = delivery(msg.reply)
        if meta is None or meta[0] != self.consumer or self._stale:
            return  # not a delivery, or late from a consumer being replaced
        _, seq, consumer_seq, ts_ns = meta
        if consumer_seq != self.consumer_seq + 1:
            self._reset(f"delivery {consumer_seq} after {self.consumer_seq}")  # a gap: start again at next_seq
            return
        self.consumer_seq = consumer_seq
        self._outstanding -= 1
        # The server ends a request whose max_bytes it used up exactly without a word: count
        # as it does (a little more, never less) to know.
        self._bytes_left -= wire_size(msg)
        if seq >= self.next_seq:
            event = self.stream.event(seq, msg.subject, msg.headers, msg.data, ts_ns)
            self.next_seq = seq + 1
            self._oversize = False
            if event is not None and self.accept(event):
                self._waiting = True  # a full queue is not a lost request
                try:
                    await self.queue.put(event)
                finally:
                    self._waiting = False
                    self._heard = time.monotonic()
        if self._outstanding <= 0 or (self._asked > 1 and self._bytes_left <= 0):
            self._filled = True
            self._done.set()


def honour_cancel() -> None:
    """Raise the current task's cancellation if a callee swallowed it: nats-py's publish and
    request may (its ``_flush_pending`` catches CancelledError), and a reader that missed its
    cancellation would outlive its client."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def wire_size(msg: Msg) -> int:
    """What the server counts of a delivery against a pull's max_bytes (subject, reply,
    headers as sent, payload), plus a margin: headers are rebuilt from their parsed form."""
    size = len(msg.subject) + len(msg.reply) + len(msg.data) + SIZE_MARGIN
    if msg.headers:
        size += 12 + sum(len(str(k)) + len(str(v)) + 4 for k, v in msg.headers.items())  # NATS/1.0, k: v
    return size


def delivery(reply: str | None) -> tuple[str, int, int, int] | None:
    """(consumer, stream sequence, consumer sequence, timestamp ns) from a delivery's reply
    subject, ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` (or the
    newer form with a domain and an account hash after ``$JS.ACK``); None for anything else."""
    if not reply or not reply.startswith("$JS.ACK."):
        return None
    tokens = reply.split(".")
    at = 2 if len(tokens) == 9 else 4 if len(tokens) >= 12 else -1
    if at < 0:
        return None
    try:
        return tokens[at + 1], int(tokens[at + 3]), int(tokens[at + 4]), int(tokens[at + 5])
    except ValueError:
        return None
