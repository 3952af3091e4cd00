"""Every shard's frames to JetStream through one pipeline per gateway: one sender task, one
acknowledgement subscription, one watchdog.

Before, each shard had a sender and an acknowledger task of its own, and each frame a future,
a window semaphore and a timeout: with 1,000 shards at 20 frames/s that machinery, not the
frames, was what used the gateway's core (py-spy, docs/performance.md, issue 26). Now a shard's
:class:`~services.gateway.publishing.publisher.ShardPublisher` only holds its queue and its frames in
flight; this pipeline publishes what every ready shard has queued in one pass per turn of the
event loop (nats-py's flusher makes that one write to NATS), takes each acknowledgement where it
lands (a counter-numbered reply subject under one inbox), and looks once every
``WATCH_EVERY_S`` for a shard whose oldest frame in flight waits past the acknowledgement timeout.
Order, de-duplication and the no-loss rule stay the shard publisher's: a frame whose
acknowledgement fails or never comes sends that shard (only) into its in-order recovery.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any, Protocol

import nats.js.api
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.gateway.publishing import fast_ingest
from services.gateway.publishing.fast_ingest import Answer, FastBatch
from services.gateway.publishing.nats_protocol import hpub, pub
from services.gateway.publishing.outgoing import InFlight
from shared import natspy_internals
from shared.nats_calls import HEADER_ROOM  # headers' room under max_payload (Nats-Msg-Id, Shardbus-Reason)

log = logging.getLogger("shardbus.gateway.publisher")

CONNECTED_POLL_S = 0.05
"""How often the sender looks whether NATS is back."""

NO_RESPONDERS = "503"
"""The status header of NATS's "no responders": no stream takes the subject."""

WATCH_EVERY_S = 0.5
"""How often the watchdog looks for acknowledgements overdue (at most this late)."""

ERROR_CHARS = 300
"""Longest error text kept from an acknowledgement that is not JSON."""


class ShardPublisher(Protocol):
    """What the pipeline asks of a shard's publisher (``publisher.ShardPublisher``)."""

    async def send_queued(self) -> int: ...

    def acknowledged(self, entry: InFlight, error: Exception | None) -> None: ...

    def check_overdue(self, sent_before: float, connection: int) -> None: ...

    def batch_answered(self, batch_id: str, seq: int, answer: Answer | Exception) -> None: ...


class PublishPipeline:
    """The gateway's one sender, acknowledgement inbox and watchdog for all shard publishers."""

    def __init__(self, nc: Client, ack_timeout_s: float) -> None:
        self.nc = nc
        self.ack_timeout_s = ack_timeout_s
        self.prefix = ""
        self.fast_ingest = False
        """Frames go to their stream in fast-ingest batches (it allows them: ``streams.py``); dead
        letters, with headers of their own, are published plainly."""
        self._batches: dict[str, ShardPublisher] = {}
        """Open fast-ingest batches by id: whose answers they are."""
        self._sub: Subscription | None = None
        self._ready: dict[ShardPublisher, None] = {}
        """Publishers with frames queued and room in their window, in the order they became so."""
        self._wake = asyncio.Event()
        self._waiting: dict[str, tuple[ShardPublisher, InFlight]] = {}
        self._numbers = itertools.count(1)
        self._publishers: set[ShardPublisher] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._batch: list[bytes] = []
        """Protocol commands of this pass (frames' HPUB, replies), not yet handed to nats-py."""
        self._batch_connection = 0
        """The connection to NATS the batch's first command was made for."""
        self._previous_disconnected_cb: Any = None
        self._on_disconnected: Any = None
        self.batches = 0
        """Sender passes that published something (``published / batches``: frames per pass)."""
        self.published = 0

    async def start(self) -> None:
        """Subscribe to the inbox and start the sender and the watchdog (once)."""
        if self._sub is not None:
            return
        prefix = f"{self.nc.new_inbox()}."
        self._sub = await self.nc.subscribe(f"{prefix}>", cb=self._on_ack)
        # nats-py calls its disconnected callback once the old connection is closed and before
        # it reconnects (and flushes what it holds): chained here, whoever set it is still called.
        previous = self._previous_disconnected_cb = natspy_internals.disconnected_callback(self.nc)

        async def on_disconnected() -> None:
            self._forget_unsent()
            if previous is not None:
                await previous()

        self._on_disconnected = on_disconnected
        natspy_internals.set_disconnected_callback(self.nc, on_disconnected)
        self.prefix = prefix
        self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._watch())]
        for task in self._tasks:
            task.add_done_callback(_log_crash)

    async def stop(self) -> None:
        """Stop the sender and the watchdog, and the inbox subscription."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._sub is not None and natspy_internals.disconnected_callback(self.nc) is self._on_disconnected:
            natspy_internals.set_disconnected_callback(self.nc, self._previous_disconnected_cb)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # noqa: BLE001 — NATS away or closed: the subscription goes with it
                pass
            self._sub = None

    def join(self, publisher: ShardPublisher) -> None:
        """Watch ``publisher``'s frames in flight from now on."""
        self._publishers.add(publisher)

    def leave(self, publisher: ShardPublisher) -> None:
        self._publishers.discard(publisher)
        self._ready.pop(publisher, None)

    async def connected(self) -> None:
        """Return once NATS is connected. Polled: nats-py has no "connected again" event."""
        while not self.nc.is_connected:  # noqa: ASYNC110
            await asyncio.sleep(CONNECTED_POLL_S)

    def connection(self) -> int:
        """Which connection to NATS this is: nats-py's count of reconnects (raised before it
        counts as connected again)."""
        return int(self.nc.stats["reconnects"])

    def waiting(self) -> int:
        """Frames published and not acknowledged (nor forgotten) yet."""
        return len(self._waiting)

    def ready(self, publisher: ShardPublisher) -> None:
        """``publisher`` has frames to send: the sender takes them in its next pass."""
        self._ready[publisher] = None
        self._wake.set()

    def forget(self, token: str | None) -> None:
        """Stop waiting for the acknowledgement of ``token``; one that still comes is dropped."""
        if token is not None:
            self._waiting.pop(token, None)

    def end_batch(self, batch: FastBatch, *, tell_the_server: bool = False) -> None:
        """``batch`` takes no more messages: its answers still to come are dropped. Told, the
        server ends it too (a message it does not store), so that it stops counting against the
        stream's open batches; the answer is not awaited (a batch it forgot answers an error)."""
        batch.ended = True
        self._batches.pop(batch.id, None)
        if tell_the_server and batch.open and batch.subject and self.nc.is_connected:
            self._add(pub(batch.subject, self.prefix + fast_ingest.end_tail(batch), b""))
            self._wake.set()

    async def publish(self, publisher: ShardPublisher, entry: InFlight) -> None:
        """Publish one frame with a reply subject of the inbox: its token kept on ``entry`` or,
        in a fast-ingest batch, the batch's reply subject for its sequence. Raises what nats-py
        raises; the caller marks the frame failed."""
        if entry.batch is None:
            token = f"{next(self._numbers):x}"
            entry.token = token
            self._waiting[token] = (publisher, entry)
            reply = self.prefix + token
        else:
            token = None
            self._batches[entry.batch.id] = publisher
            reply = self.prefix + fast_ingest.reply_tail(entry.batch, entry.batch_seq)
        item = entry.item
        nc = self.nc
        try:
            if not nc.is_connected:
                # Never into nats-py's reconnect buffer: it is sent before anything else once NATS
                # is back, so a frame in it would be stored ahead of earlier ones lost with the old
                # connection. The frame's recovery publishes it, in order, once NATS is back.
                raise ConnectionError("NATS is not connected")
            if item.headers or len(item.data) > nc.max_payload - HEADER_ROOM:
                await self.flush()  # what this pass queued goes first: the order holds
                await nc.publish(item.subject, item.data, reply=reply,
                                 headers={"Nats-Msg-Id": item.msg_id, **(item.headers or {})})
            else:
                self._add(hpub(item.subject, reply, item.msg_id, item.data))
        except BaseException:
            self.forget(token)
            raise

    def _forget_unsent(self) -> None:
        """NATS is gone: what nats-py still holds for the dead connection is dropped (its
        frames are in their shards' windows and go again, in order, once NATS is back; a
        command reply in it was for a caller who will time out). Kept, it would be sent first
        on the new connection, ahead of earlier frames that died in the old one's socket."""
        natspy_internals.drop_unsent(self.nc)

    def post(self, command: bytes) -> None:
        """Add a protocol command (a command's reply: ``nats_protocol.reply``) to the next pass's
        write, without a task switch: the replies of a turn go out in one write with its frames."""
        self._add(command)
        self._wake.set()

    def _add(self, command: bytes) -> None:
        if not self._batch:
            self._batch_connection = self.connection()
        self._batch.append(command)

    async def flush(self) -> None:
        """Hand what :meth:`publish` queued to nats-py as one command, and its flusher the
        write (once per pass). Joined here: nats-py's ``writelines`` of many small commands
        cost more than the join (uvloop, py-spy)."""
        if self._batch:
            batch, self._batch = self._batch, []
            if not self.nc.is_connected or self.connection() != self._batch_connection:
                return  # NATS went away meanwhile: its frames' recovery sends them (see publish)
            await natspy_internals.write_commands(self.nc, b"".join(batch))

    async def _send(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Nothing issued while NATS is away: nats-py would buffer it and could send it after
            # an earlier frame that a recovery is about to publish again (out of order).
            await self.connected()
            ready, self._ready = self._ready, {}
            sent = 0
            for publisher in ready:
                sent += await publisher.send_queued()
            await self.flush()
            if sent:
                self.batches += 1
                self.published += sent

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(WATCH_EVERY_S, self.ack_timeout_s / 4))
            late = loop.time() - self.ack_timeout_s
            connection = self.connection()
            for publisher in list(self._publishers):
                publisher.check_overdue(late, connection)

    async def _on_ack(self, msg: Msg) -> None:
        tail = msg.subject[len(self.prefix):]
        if tail.endswith(fast_ingest.SUFFIX):
            self._on_batch_answer(tail, msg)
            return
        got = self._waiting.pop(tail, None)
        if got is None:
            return
        publisher, entry = got
        publisher.acknowledged(entry, _ack_error(msg))

    def _on_batch_answer(self, tail: str, msg: Msg) -> None:
        parsed = fast_ingest.parse_reply_tail(tail)
        publisher = self._batches.get(parsed[0]) if parsed else None
        if parsed is None or publisher is None:
            return  # a batch that ended: its messages were recovered, or are being
        answer: Answer | Exception
        if _no_responders(msg):
            answer = nats.js.errors.NoStreamResponseError()
        else:
            try:
                answer = fast_ingest.parse_answer(msg.data)
            except ValueError as exc:  # json's errors are ValueErrors too
                answer = exc
        publisher.batch_answered(parsed[0], parsed[1], answer)


def _no_responders(msg: Msg) -> bool:
    return msg.headers is not None and msg.headers.get(nats.js.api.Header.STATUS) == NO_RESPONDERS


def _ack_error(msg: Msg) -> Exception | None:
    """None for JetStream's "stored" answer, else the error it means."""
    if _no_responders(msg):
        return nats.js.errors.NoStreamResponseError()
    data = msg.data
    if data.startswith(b'{"stream":') and b'"error"' not in data:
        return None  # the common answer, {"stream":…,"seq":…}, without a JSON parse
    try:
        answer = json.loads(data)
    except ValueError as exc:  # the frame is published again: its recovery decides
        return exc
    error = answer.get("error") if isinstance(answer, dict) else "not a JSON object"
    return None if error is None else api_error(error)


def api_error(error: object) -> Exception:
    """The exception nats-py raises for JetStream's error object ``error`` (its class by status
    code: BadRequestError, ServiceUnavailableError…), or an APIError describing what came."""
    try:
        if isinstance(error, dict) and "code" in error:
            nats.js.errors.APIError.from_error(error)  # raises the error's class
        return nats.js.errors.APIError(description=str(error)[:ERROR_CHARS])
    except Exception as exc:  # noqa: BLE001 — from_error raises what it builds (or a TypeError)
        return exc


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("publish pipeline stopped", exc_info=task.exception())
