"""The ledger's hot subjects served straight on nats-py (issue 15, ADR 5).

Reserve, record, confirm, fail and the give-back outcomes are most of what the ledger does
under load, and FastStream's per-message machinery cost more CPU than their SQL did. Here each
is a plain queue subscription in the ``ledger`` group whose callback reads the message and
starts a task; the task does what the FastStream path does, in the same words: refuse a message
not sent directly (shared/delivery.py), read the body (shared/request_body.py), validate it
with the contract's request model (400 naming the fields, as ``body.<field>``), act, and answer
with the same envelope and the same error mapping (shared/error_replies.py :func:`error_reply`).

Bounded: at most ``pending_max`` requests of one subject are being answered at once; one more
is answered 503 at once (``BUSY``), never queued without end. Stopping unsubscribes first, then
lets the requests under way finish (``STOP_GRACE_S``). Counts per subject are in
:attr:`Dispatcher.stats` (the ledger's health reply carries them)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel, ValidationError

from shared import replies
from shared.broker import STOP_GRACE_S
from shared.delivery import is_direct, why_not_direct
from shared.error_replies import ErrorHandler, error_reply
from shared.middlewares import DirectOnly
from shared.request_body import read_body

log = logging.getLogger("shardbus.ledger.dispatcher")

JSON_HEADERS = {"content-type": "application/json"}
"""The reply's headers, as FastStream sends a JSON reply."""

BUSY = "the ledger has {n} requests of {subject} under way; retry shortly"
"""The 503 of a request over a subject's ``pending_max``."""


def encode(reply: dict[str, Any] | bytes) -> bytes:
    """A reply as compact UTF-8 JSON (an already encoded one as it is)."""
    if isinstance(reply, bytes):
        return reply
    return json.dumps(reply, separators=(",", ":"), ensure_ascii=False).encode()


Handler = Callable[[Any], Awaitable[dict[str, Any] | bytes]]
"""A subject's handler on either request path (``app.answering`` makes it; FastStream or this
dispatcher calls it, ``request_paths.SERVED`` says which): the validated request in, the whole
reply out."""


@dataclass(frozen=True)
class HotSubject:
    """One subject served here: its request model and its handler."""

    subject: str
    request: type[BaseModel]
    action: Handler


@dataclass
class SubjectStats:
    """One subject's counts since the ledger started."""

    requests: int = 0
    errors: int = 0
    """Replies with a status of 400 or more."""
    busy: int = 0
    """Requests answered 503 because ``pending_max`` were under way."""
    refused: int = 0
    """Messages not sent directly: neither handled nor answered."""
    under_way: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Dispatcher:
    """Serves ``hot`` on ``nc`` in queue group ``queue``; ``errors`` maps exceptions to replies."""

    hot: list[HotSubject]
    queue: str
    errors: dict[type[Exception], ErrorHandler]
    pending_max: int = 4096
    stats: dict[str, SubjectStats] = field(default_factory=dict)
    _refusals: DirectOnly = field(default_factory=lambda: DirectOnly("ledger"))
    """Logs refusals as the FastStream path does: at most a line per subject every 10 s."""
    replies: dict[tuple[str, int], int] = field(default_factory=dict)
    """Replies sent, by subject and status (the ledger's metrics)."""
    _nc: Client | None = None
    _subs: list[Subscription] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self, nc: Client) -> None:
        """Subscribe every hot subject."""
        self._nc = nc
        for hot in self.hot:
            self.stats[hot.subject] = SubjectStats()
            self._subs.append(await nc.subscribe(hot.subject, queue=self.queue, cb=self._callback(hot)))

    def _callback(self, hot: HotSubject) -> Callable[[Msg], Awaitable[None]]:
        stats = self.stats[hot.subject]

        async def on_message(msg: Msg) -> None:
            # nats-py awaits this callback before the subscription's next message: it only starts
            # the work, so one slow statement never holds up the requests behind it.
            if not is_direct(msg.subject, hot.subject, msg.reply, msg.headers):
                stats.refused += 1
                self._refusals.refused(hot.subject, why_not_direct(msg.subject, hot.subject, msg.reply, msg.headers),
                                       msg.subject)
                return
            stats.requests += 1
            if stats.under_way >= self.pending_max:
                stats.busy += 1
                stats.errors += 1
                await self._respond(msg, replies.fail(HTTPStatus.SERVICE_UNAVAILABLE,
                                                      BUSY.format(n=stats.under_way, subject=hot.subject)))
                return
            stats.under_way += 1
            task = asyncio.create_task(self._answer(hot, stats, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return on_message

    async def _answer(self, hot: HotSubject, stats: SubjectStats, msg: Msg) -> None:
        try:
            try:
                body = hot.request.model_validate(read_body(msg.data))
            except ValidationError as exc:
                reply: dict[str, Any] | bytes = replies.fail(
                    replies.BAD_REQUEST, replies.describe_validation_error(exc, within=("body",)))
            else:
                try:
                    reply = await hot.action(body)
                except Exception as exc:  # noqa: BLE001 - every failure is answered, as FastStream's middleware does
                    reply = error_reply(self.errors, exc)
            if isinstance(reply, dict) and reply.get("status", 200) >= HTTPStatus.BAD_REQUEST:
                stats.errors += 1
            await self._respond(msg, reply)
        finally:
            stats.under_way -= 1

    async def _respond(self, msg: Msg, reply: dict[str, Any] | bytes) -> None:
        key = (msg.subject, int(reply.get("status", HTTPStatus.OK)) if isinstance(reply, dict) else HTTPStatus.OK)
        self.replies[key] = self.replies.get(key, 0) + 1
        if not msg.reply or self._nc is None:
            return
        try:
            await self._nc.publish(msg.reply, encode(reply), headers=JSON_HEADERS)
        except Exception as exc:  # noqa: BLE001 - the caller is gone or NATS is away; nothing to retry
            log.warning("could not answer a request", extra={"subject": msg.subject, "reason": type(exc).__name__})

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Unsubscribe, then let the requests under way finish (at most ``grace_s``)."""
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # noqa: BLE001 - the connection is closing anyway
                log.debug("unsubscribe failed", extra={"subject": sub.subject, "reason": type(exc).__name__})
        self._subs.clear()
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
