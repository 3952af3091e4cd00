"""Publishing one shard's frames to JetStream: in order, with a bounded window of
acknowledgements in flight, and without loss while NATS is away.

Each shard has one :class:`ShardPublisher` for the life of the gateway (it outlives a
connection, so a reconnect cannot overtake frames still buffered). Its queue is bounded:
when it is full, the reader awaiting :meth:`put` stops reading from the shard, which is
TCP back-pressure. Every message carries a ``Nats-Msg-Id``, so publishing one again after a
failure is de-duplicated by JetStream. The sending and the acknowledgements of all shards go
through the gateway's one :class:`~services.gateway.publishing.pipeline.PublishPipeline`.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections import deque
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import PubAck

from services.gateway.publishing import fast_ingest
from services.gateway.publishing.fast_ingest import Answer, FastBatch
from services.gateway.publishing.outgoing import FAILED, STORED, WAITING, InFlight, Outgoing
from services.gateway.publishing.pipeline import PublishPipeline, api_error

log = logging.getLogger("shardbus.gateway.publisher")

RETRY_PAUSE_S = 0.2
"""First pause before publishing a frame again after a failure (NATS away, no acknowledgement,
a transient answer); it doubles with each failure of the same frame, up to ``RETRY_PAUSE_MAX_S``."""

RETRY_PAUSE_MAX_S = 2.0
"""Longest pause between two resends of one frame (docs/gateway.md, "Frames")."""

FIRST_RESEND_TIMEOUT_S = 1.0
"""How long the first resend of a frame waits for JetStream's answer (at most the acknowledgement
timeout); each timeout of the same frame doubles it up to ``SHARDBUS_PUBLISH_ACK_TIMEOUT_S``. A
resend carries the frame's message id, so one that times out and is sent again is stored once:
a short first wait shortens recovery after an election (issue 36: 5 s steps before)."""

TRANSIENT_ERR_CODES = frozenset({10158, 10167})
"""JetStream error codes whose 4xx answer says nothing against the message: 10158 (409
"duplicate message id is in process": a leader still holds an earlier copy of it, uncommitted,
e.g. a minority leader during a partition) and 10167 (429 "too many requests")."""

HOLD_AFTER_S = 0.5
"""How long a shard's oldest frame in flight may go unanswered before the shard publishes nothing
newer until it is answered or recovered (at most half the acknowledgement timeout). JetStream can
drop frames in flight without a word — a leader change: 3–5 s with no leader on hosts — and store
those published once a new leader stands; held back, they go after the dropped ones, in order.
Far above an answer's usual wait (milliseconds), far below an election's (seconds)
(docs/gateway.md, "What a shard may rely on")."""

PLAIN_AFTER_TOO_MANY_S = 30.0
"""How long a shard publishes plainly after JetStream said it has as many fast-ingest batches
open as it allows (docs/gateway.md, "What a shard may rely on")."""

REFUSALS_BEFORE_DEAD_LETTER = 5
"""Times JetStream may refuse one message while NATS is up (not a timeout: an error answer)
before it is dead-lettered with the reason: one bad message must not wedge the shard's
publisher, and every later frame behind it."""

REASON_HEADER = "Shardbus-Reason"
"""Header of a dead letter saying why it could not be a frame (or could not be stored)."""

REASON_CHARS = 300
"""Longest reason header: headers count against NATS's max payload."""


def is_transient(error: Exception) -> bool:
    """True for a JetStream 4xx answer that is about the stream's state, not the message
    (:data:`TRANSIENT_ERR_CODES`; a 409 "... in process" named by its text when a server sends
    no error code)."""
    if not isinstance(error, nats.js.errors.APIError):
        return False
    if error.err_code in TRANSIENT_ERR_CODES or error.code == 429:
        return True
    return error.code == 409 and "in process" in (error.description or "")


def refuses_the_message(error: Exception) -> bool:
    """True when the error is about this message (too big, a bad subject, JetStream's 4xx but
    the transient ones), not about NATS being slow, away, electing a leader or still storing an
    earlier copy (retried for as long as it takes, so nothing is lost or reordered during a
    fault; docs/gateway.md, "Frames")."""
    if isinstance(error, (nats.errors.MaxPayloadError, nats.errors.BadSubjectError)):
        return True
    code = getattr(error, "code", None)
    return (isinstance(error, nats.js.errors.APIError) and isinstance(code, int) and 400 <= code < 500
            and not is_transient(error))


def describe(error: BaseException) -> str:
    """An error as a log line or a reason header needs it: its type and, for JetStream's answers,
    the status code, the error code and the description (``repr`` of nats-py's ``APIError``
    shows none of them: "APIError()")."""
    if isinstance(error, nats.js.errors.APIError):
        return (f"{type(error).__name__} code={error.code} err_code={error.err_code}: "
                f"{error.description or 'no description'}")
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


_WAIT_FOR_THE_LAST_BATCH = FastBatch("", ended=True)
"""What :meth:`ShardPublisher._batch_for` says while messages of an ended or idle batch are in
flight: nothing more goes until they are answered or recovered."""


class ShardPublisher:
    """An ordered, windowed, loss-free publisher for one shard's messages.

    The gateway's :class:`~services.gateway.publishing.pipeline.PublishPipeline` sends what is queued as
    soon as the window has room and hands back each acknowledgement; frames are taken off the
    window in order, each once JetStream holds it. When one's acknowledgement fails or does not
    come within the timeout, the shard publishes every frame of its window again, one at a
    time, in order (its recovery; the pipeline sends nothing of this shard meanwhile); JetStream
    drops the ones it already holds."""

    def __init__(self, pipeline: PublishPipeline, js: JetStreamContext, *, window: int, buffer: int,
                 on_stored: Callable[[Outgoing], None], buffer_bytes: int = 64 * 1024 * 1024,
                 dead_letter_subject: str | None = None) -> None:
        self.pipeline, self.js = pipeline, js
        self.nc = pipeline.nc
        self.ack_timeout_s = pipeline.ack_timeout_s
        self.window = window
        self.queue: deque[Outgoing] = deque()
        self.buffer = buffer
        self.buffer_bytes = buffer_bytes
        self.dead_letter_subject = dead_letter_subject
        self.held_bytes = 0
        """Bytes put and not yet stored (queued or in flight): bounded by ``buffer_bytes``."""
        self.most_held_bytes = 0
        self.dead_lettered = 0
        self.given_up = 0
        """Messages taken off the window without JetStream storing them (refused, dead-lettered):
        never acknowledged to the shard."""
        self._room = asyncio.Event()
        self.on_stored = on_stored
        self.published = 0
        self.retries = 0
        self.stored_out_of_order = 0
        """Frames JetStream stored only after a later frame of this shard: a leader change dropped
        them in flight while it stored what followed (docs/gateway.md, "What a shard may rely on")."""
        self._in_flight: deque[InFlight] = deque()
        self.hold_after_s = min(HOLD_AFTER_S, self.ack_timeout_s / 2)
        self._overtaken: InFlight | None = None
        """A frame in flight that JetStream stored a later frame ahead of (its answer not come):
        it was dropped, or is stored later; the shard publishes nothing newer until it leaves."""
        self._recovery: asyncio.Task[None] | None = None
        self._stopped = False
        self._batch: FastBatch | None = None
        """The fast-ingest batch this shard's frames go in (``pipeline.fast_ingest``), None before
        the first or after one ended."""
        self._plain_until = 0.0
        self.batches_cut = 0
        """Fast-ingest batches JetStream ended before the shard did (a gap, a refusal, a batch it
        forgot): what was in flight after the cut was published again, in order."""

    def has_room(self, item: Outgoing) -> bool:
        """True when :meth:`put` of ``item`` would queue it at once, without waiting."""
        return not (len(self.queue) >= self.buffer
                    or (self.held_bytes and self.held_bytes + len(item.data) > self.buffer_bytes))

    async def put(self, item: Outgoing) -> None:
        """Queue a message; once the buffer is full — by count, or by bytes held — waits
        (back-pressure) until it is half empty again, so reading and publishing go in batches
        rather than one by one. A single message larger than the byte bound still goes alone."""
        size = len(item.data)
        if not self.has_room(item):
            while len(self.queue) > self.buffer // 2 or (self.held_bytes and
                                                         self.held_bytes + size > self.buffer_bytes // 2):
                self._room.clear()
                await self._room.wait()
        self.put_nowait(item)

    def put_nowait(self, item: Outgoing) -> None:
        """Queue a message now, room or not: for a caller that checked :meth:`has_room` (or a
        ``put`` whose wait is over)."""
        self.held_bytes += len(item.data)
        if self.held_bytes > self.most_held_bytes:
            self.most_held_bytes = self.held_bytes
        self.queue.append(item)
        if len(self._in_flight) < self.window and self._recovery is None and not self._stopped:
            self.pipeline.ready(self)

    def _release(self, item: Outgoing) -> None:
        self.held_bytes -= len(item.data)
        self._maybe_room()
        if self.held_bytes == 0 and self.most_held_bytes > self.buffer_bytes // 2:
            self.most_held_bytes = 0
            _give_memory_back()

    def _maybe_room(self) -> None:
        if len(self.queue) <= self.buffer // 2 and self.held_bytes <= self.buffer_bytes // 2:
            self._room.set()

    def pending(self) -> int:
        """Messages not yet stored by JetStream (buffered or in flight)."""
        return len(self.queue) + len(self._in_flight)

    def start(self) -> None:
        """Join the pipeline (its watchdog looks at this shard's frames in flight)."""
        self.pipeline.join(self)

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Give buffered messages a moment to reach JetStream, then stop."""
        deadline = asyncio.get_running_loop().time() + drain_timeout_s
        # Polled: the queue, the window and a recovery all count; no one event says all are empty.
        while self.pending() and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if self.pending():
            log.warning("stopped with frames unpublished", extra={"pending": self.pending()})
        self._stopped = True
        self._end_batch(tell_the_server=not self._in_flight)
        self.pipeline.leave(self)
        if self._recovery is not None:
            self._recovery.cancel()
            await asyncio.gather(self._recovery, return_exceptions=True)
        for entry in self._in_flight:
            self.pipeline.forget(entry.token)

    async def send_queued(self) -> int:
        """Publish queued frames while the window has room (the pipeline's sender calls this);
        how many."""
        sent = 0
        now = asyncio.get_running_loop().time()
        connection = self.pipeline.connection()
        if self._lost_with_a_connection(connection) or self.held_back(now):
            return 0
        while self.queue and len(self._in_flight) < self.window and self._recovery is None and not self._stopped:
            batch = self._batch_for(self.queue[0], now)
            if batch is not None and (batch.ended or (batch.last_seq and not batch.open)):
                break  # the batch's first answer, or the recovery of the one that ended, comes first
            entry = InFlight(self.queue.popleft(), now, connection)
            if batch is not None:
                batch.last_seq += 1
                batch.last_sent_at, batch.subject = now, entry.item.subject
                entry.batch, entry.batch_seq = batch, batch.last_seq
            self._in_flight.append(entry)
            sent += 1
            try:
                await self.pipeline.publish(self, entry)
            except Exception as exc:  # noqa: BLE001 — NATS went away between the check and the send
                self.acknowledged(entry, exc)
        self._maybe_room()
        return sent

    def _batch_for(self, item: Outgoing, now: float) -> FastBatch | None:
        """The fast-ingest batch ``item`` goes in (None: published plainly). A new batch starts
        only when no message of another is in flight: JetStream keeps the order within a batch
        only, so the next one starts behind everything the last one held. An ended batch that
        still has messages in flight is returned ended: nothing goes until they are recovered."""
        if not self.pipeline.fast_ingest or item.headers or now < self._plain_until:
            return None
        batch = self._batch
        if batch is not None and batch.usable(now):
            return batch
        if any(entry.batch is not None for entry in self._in_flight):
            return _WAIT_FOR_THE_LAST_BATCH
        self._end_batch(tell_the_server=True)
        self._batch = FastBatch.new()
        return self._batch

    def _end_batch(self, *, tell_the_server: bool = False) -> None:
        if self._batch is not None:
            self.pipeline.end_batch(self._batch, tell_the_server=tell_the_server)
            self._batch = None

    def batch_answered(self, batch_id: str, seq: int, answer: Answer | Exception) -> None:
        """JetStream's answer on the reply subject of message ``seq`` of a fast-ingest batch."""
        batch = self._batch
        if batch is None or batch.id != batch_id or self._recovery is not None:
            return
        if isinstance(answer, Answer) and answer.kind == "ack":
            if not batch.open:
                batch.open = True
                if self.queue and not self._stopped:
                    self.pipeline.ready(self)
            self._settle_batch(batch, answer.seq, None)
        elif isinstance(answer, Answer) and answer.kind == "stored":
            # A server that does not know batches stored this message plainly: frames go plainly
            # from now on (its order is then the hold's, as on any such server).
            self.pipeline.fast_ingest = False
            for entry in self._in_flight:
                if entry.batch is batch and entry.batch_seq == seq and entry.state == WAITING:
                    self._settle(entry, None)
        else:
            self._cut(batch, seq, answer)
        self._advance()

    def _cut(self, batch: FastBatch, seq: int, answer: Answer | Exception) -> None:
        """JetStream ended ``batch`` (or its answer is not understood): what it says it stored is
        stored, the rest of the batch in flight is published again, in order, by the recovery."""
        stored_up_to = answer.seq if isinstance(answer, Answer) and answer.kind == "end" else 0
        error = _cut_error(answer)
        if isinstance(answer, Answer) and answer.kind == "refused" and answer.error:
            if answer.error.get("err_code") == fast_ingest.DISABLED:
                self.pipeline.fast_ingest = False
            elif answer.error.get("err_code") == fast_ingest.TOO_MANY:
                self._plain_until = asyncio.get_running_loop().time() + PLAIN_AFTER_TOO_MANY_S
        self._end_batch()
        self.batches_cut += 1
        subject = next((entry.item.subject for entry in self._in_flight if entry.batch is batch), None)
        log.warning("JetStream ended a fast-ingest batch; the frames after the cut are published again in order",
                    extra={"reason": describe(error), "subject": subject, "batch_seq": seq,
                           "stored_up_to": stored_up_to})
        self._settle_batch(batch, stored_up_to, None)
        self._settle_batch(batch, None, error)

    def _settle_batch(self, batch: FastBatch, up_to: int | None, error: Exception | None) -> None:
        """Settle the waiting messages of ``batch`` up to batch sequence ``up_to`` (None: all)."""
        for entry in self._in_flight:
            if entry.batch is not batch:
                continue
            if up_to is not None and entry.batch_seq > up_to:
                break  # in the window in batch order: the rest is later
            if entry.state == WAITING:
                self._settle(entry, error)

    def held_back(self, now: float) -> bool:
        """True while the oldest frame in flight is unanswered and either a later one was stored
        ahead of it or it has waited ``hold_after_s``: what is published now could be stored
        ahead of it (a leader change that dropped it), so nothing newer goes until it is answered
        or recovered. Its answer or its recovery makes the shard ready again."""
        if not self._in_flight:
            return False
        front = self._in_flight[0]
        return front.state == WAITING and (front is self._overtaken or now - front.sent_at > self.hold_after_s)

    def acknowledged(self, entry: InFlight, error: Exception | None) -> None:
        """JetStream's answer for ``entry`` (None: stored): frames leave the window in order."""
        if entry.state != WAITING:
            return
        self._settle(entry, error)
        self._advance()

    def _settle(self, entry: InFlight, error: Exception | None) -> None:
        entry.state, entry.error = (STORED, None) if error is None else (FAILED, error)
        window = self._in_flight
        if error is None and window and window[0] is not entry and window[0].state == WAITING:
            self._overtaken = window[0]

    def _advance(self) -> None:
        """Take settled frames off the front of the window, in order; the first failed one starts
        the recovery."""
        if self._recovery is not None:
            return  # the recovery publishes the whole window again and takes it off itself
        window = self._in_flight
        while window and window[0].state != WAITING:
            front = window[0]
            if front.state == FAILED:
                self._recover(front.error or ConnectionError("not stored"))
                return
            window.popleft()
            self._stored(front.item)
        if self.queue and not self._stopped:
            self.pipeline.ready(self)

    def check_overdue(self, sent_before: float, connection: int) -> None:
        """Recover when the oldest frame in flight was sent before ``sent_before`` and is still
        not acknowledged, or on a connection to NATS since lost (the pipeline's watchdog)."""
        if self._lost_with_a_connection(connection):
            return
        if self._in_flight and self._recovery is None and self._in_flight[0].sent_at < sent_before:
            self._recover(TimeoutError(f"no acknowledgement within {self.ack_timeout_s} s"))

    def _lost_with_a_connection(self, connection: int) -> bool:
        """Frames still in flight from before NATS reconnected may have died with the old
        connection (written to its socket, never read): they are published again, in order,
        before any later frame, or a later frame would be stored ahead of them. (The
        acknowledgement timeout alone came too late: the sender had already published newer
        frames on the new connection; tests/gateway/test_pipeline.py.) True when recovering."""
        if self._recovery is not None:
            return True
        if self._in_flight and self._in_flight[0].connection != connection:
            self._recover(ConnectionError("NATS reconnected; frames in flight on the old connection are sent again"))
            return True
        return False

    def _recover(self, exc: Exception) -> None:
        self._end_batch()
        for entry in self._in_flight:
            self.pipeline.forget(entry.token)
        self._recovery = asyncio.create_task(self._recover_in_order(exc))
        self._recovery.add_done_callback(_log_crash)

    async def _recover_in_order(self, exc: Exception) -> None:
        try:
            await self._republish_in_order(exc)
        finally:
            self._recovery = None
            if self.queue and not self._stopped:
                self.pipeline.ready(self)

    def _headers(self, item: Outgoing) -> dict[str, str]:
        return {"Nats-Msg-Id": item.msg_id, **(item.headers or {})}

    async def _republish_in_order(self, exc: Exception) -> None:
        """Publish every unacknowledged message again, one at a time, in order.

        A frame leaves the window acknowledged to the shard (``frame.ack``) only once JetStream
        answered that it holds it. A transient failure (NATS away, a timeout, no responders, a
        409 "duplicate message id is in process") is retried with the same message id, with
        back-off, until it is stored: it is never counted as a refusal. Only a message JetStream
        refuses for itself is dead-lettered after ``REFUSALS_BEFORE_DEAD_LETTER`` refusals, and
        it is then *not* acknowledged (docs/gateway.md, "Frames"; ADR 0013)."""
        log.warning("JetStream did not acknowledge; publishing again in order",
                    extra={"reason": describe(exc), "count": len(self._in_flight)})
        # Frames before the last one JetStream said it stored, and stored only now (not as a
        # duplicate), land after it: the order broke and cannot be mended, so it is told.
        ahead = max((k for k, entry in enumerate(self._in_flight) if entry.state == STORED), default=-1)
        behind: list[Outgoing] = []
        while self._in_flight:
            item = self._in_flight[0].item
            answer = await self._resend_until_settled(item)
            self._in_flight.popleft()
            if answer is None:
                self._given_up(item)
                continue
            if ahead > 0 and not answer.duplicate:
                behind.append(item)
            ahead -= 1
            self._stored(item)
        if behind:
            self.stored_out_of_order += len(behind)
            log.error("frames stored after later frames of their shard: a leader change dropped them in flight",
                      extra={"subject": behind[0].subject, "count": len(behind),
                             "seq": behind[0].ack_seq, "reason": describe(exc)})

    async def _resend_until_settled(self, item: Outgoing) -> PubAck | None:
        """Publish ``item`` again until JetStream holds it (its answer, ``duplicate`` when it held
        it already) or has refused it ``REFUSALS_BEFORE_DEAD_LETTER`` times in a row and it was
        dead-lettered (None)."""
        refusals = 0
        pause = RETRY_PAUSE_S
        timeout = min(FIRST_RESEND_TIMEOUT_S, self.ack_timeout_s)
        while True:
            await self.pipeline.connected()
            try:
                return await self.js.publish(item.subject, item.data, timeout=timeout, headers=self._headers(item))
            except Exception as error:  # noqa: BLE001 — retried; refused ones are dead-lettered
                self.retries += 1
                log.debug("publish failed, retrying", extra={"reason": describe(error)})
                if refuses_the_message(error):
                    refusals += 1
                    if refusals >= REFUSALS_BEFORE_DEAD_LETTER:
                        await self._dead_letter(item, error)
                        return None
                else:
                    refusals = 0  # refusals count in a row: a transient answer between starts over
                    if isinstance(error, (TimeoutError, nats.errors.TimeoutError)):
                        timeout = min(timeout * 2, self.ack_timeout_s)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSE_MAX_S)

    async def _dead_letter(self, item: Outgoing, error: Exception) -> None:
        """Keep a message JetStream keeps refusing on the dead-letter subject, with why; the log
        says whether the dead letter itself was stored (and JetStream's answer when it was not)."""
        reason = f"JetStream refused it {REFUSALS_BEFORE_DEAD_LETTER} times: {describe(error)}"[:REASON_CHARS]
        log.error("a message JetStream keeps refusing is dead-lettered and not acknowledged",
                  extra={"subject": item.subject, "reason": reason, "bytes": len(item.data),
                         "seq": item.ack_seq})
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
            what = ("the dead letter was refused too" if refuses_the_message(again)
                    else "the dead letter was not stored: JetStream did not take it")
            log.error(what, extra={"subject": item.subject, "reason": describe(again)})

    def _given_up(self, item: Outgoing) -> None:
        """A message that left the window without being stored: its room is given back, and it is
        not acknowledged (a shard keeps it and resends it after a reconnect)."""
        self._release(item)
        self.given_up += 1

    def _stored(self, item: Outgoing) -> None:
        self._release(item)
        self.published += 1
        try:
            self.on_stored(item)
        except Exception:  # an acknowledgement to a closed shard must not stop publishing
            log.exception("on_stored failed")


def _cut_error(answer: Answer | Exception) -> Exception:
    """Why a batch's messages after a cut were not stored, as the recovery logs it."""
    if isinstance(answer, Exception):
        return answer
    if answer.error:
        return api_error(answer.error)
    return ConnectionError(f"the fast-ingest batch was cut ({answer.kind} at {answer.seq})")


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


