"""The boards' key-value I/O: one JetStream bucket per board, writes queued per shard (in
order, retried while NATS is away), board reads on ``shard.<shard>.board.<name>``, and news
added by the website (stored, announced, replayed after each hello)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from http import HTTPStatus
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig
from nats.js.kv import KeyValue

from services.gateway.boards.rules import BOARDS, bucket_name, fold, item_key
from shared import subjects
from shared.contracts import gateway as gateway_contract
from shared.delivery import is_direct, why_not_direct

log = logging.getLogger("shardbus.gateway.boards")


def direct(msg: Msg, pattern: str) -> bool:
    """Act on a message only if it was sent to the subscription ``pattern`` directly — not put
    there by a JetStream push consumer somebody pointed at it, nor asking for a reply on a ``$``
    subject (shared/delivery.py); anything else is logged and left unanswered."""
    if is_direct(msg.subject, pattern, msg.reply, msg.headers):
        return True
    log.warning("message refused", extra={"subject": msg.subject[:200], "subscription": pattern,
                                          "reason": why_not_direct(msg.subject, pattern, msg.reply, msg.headers)})
    return False

WRITE_QUEUE = 10_000
"""Board writes buffered per shard; when full the shard's reader waits (back-pressure)."""

RETRY_PAUSE_S = 0.2
"""Pause before a failed board write is tried again."""

READ_TIMEOUT_S = 5.0
"""Longest a board read waits for the bucket."""

SKIPPED_HEADERS = {"KV-Operation", "Nats-Marker-Reason"}
"""Headers of a deleted or purged key (the value itself is a plain put)."""

NEWS_ID = re.compile(r"[A-Za-z0-9]{1,64}")
"""A news item's id: it becomes a key token (``str.isalnum`` would also pass "é" or "٣")."""

SHARD_ID_RULE = f"the shard in the subject must match {subjects.SHARD_ID_PATTERN}"
"""The 400 of a board read or news item for a subject token that is no shard id."""

READ_BATCH = 256
"""Entries fetched per round trip when reading a board."""


class BoardStore:
    """Every board of every shard, as key-value buckets."""

    def __init__(self, nc: Client, prefix: str, replicas: int = 1) -> None:
        self.nc, self.js, self.prefix = nc, nc.jetstream(), prefix
        self.replicas = replicas
        self.buckets: dict[str, KeyValue] = {}
        self.queues: dict[str, asyncio.Queue[tuple[str, str, str, Any]]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.subscriptions: list[Subscription] = []

    async def declare(self) -> None:
        """Create (or open) one bucket per board."""
        for board in BOARDS:
            name = bucket_name(self.prefix, board)
            try:
                self.buckets[board] = await self.js.key_value(name)
            except Exception:  # noqa: BLE001 — not there (or unreadable): creating it says which
                config = KeyValueConfig(bucket=name, history=1, replicas=self.replicas)
                self.buckets[board] = await self.js.create_key_value(config)

    async def serve(self) -> None:
        """Answer board reads and news additions (queue groups: any replica will do)."""
        self.subscriptions.append(await self.nc.subscribe(subjects.BOARD_WILDCARD, queue=gateway_contract.BOARDS_QUEUE,
                                                          cb=self._on_board_read))
        self.subscriptions.append(await self.nc.subscribe(subjects.NEWS_ADD_WILDCARD, queue=gateway_contract.NEWS_QUEUE,
                                                          cb=self._on_news_add))

    async def stop(self) -> None:
        for sub in self.subscriptions:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 — NATS away: the subscriptions go with the connection
                pass
        for task in self.tasks.values():
            task.cancel()

    # --- writes -----------------------------------------------------------------------

    async def write(self, shard: str, ops: list[tuple[str, str, str, Any]]) -> None:
        """Queue writes of ``shard`` (in order); waits while that shard's queue is full."""
        if not ops:
            return
        queue = self._queue(shard)
        for op in ops:
            await queue.put(op)

    def write_nowait(self, shard: str, ops: list[tuple[str, str, str, Any]]) -> bool:
        """Queue all of ``ops`` now if the shard's queue has room for all of them; False (and
        nothing queued) when it has not, for :meth:`write`."""
        if not ops:
            return True
        queue = self._queue(shard)
        if queue.maxsize - queue.qsize() < len(ops):
            return False
        for op in ops:
            queue.put_nowait(op)
        return True

    def _queue(self, shard: str) -> asyncio.Queue[tuple[str, str, str, Any]]:
        if shard not in self.queues:
            self.queues[shard] = asyncio.Queue(maxsize=WRITE_QUEUE)
            self.tasks[shard] = asyncio.create_task(self._writer(self.queues[shard]))
        return self.queues[shard]

    async def _writer(self, queue: asyncio.Queue[tuple[str, str, str, Any]]) -> None:
        while True:
            action, board, key, value = await queue.get()
            while True:
                try:
                    if action == "put":
                        await self.buckets[board].put(key, json.dumps(value, ensure_ascii=False).encode())
                    else:
                        await self.buckets[board].delete(key)
                    break
                except Exception as exc:  # noqa: BLE001 — whatever failed, the write is retried until it lands
                    log.warning("board write failed; retrying", extra={"board": board, "reason": repr(exc)})
                    await asyncio.sleep(RETRY_PAUSE_S)

    def pending(self, shard: str) -> int:
        """Board writes of ``shard`` not yet done."""
        queue = self.queues.get(shard)
        return queue.qsize() if queue else 0

    # --- reads ------------------------------------------------------------------------

    async def read(self, shard: str, board: str) -> list[dict[str, Any]]:
        """A whole board of ``shard``, in board order."""
        return fold(board, await self.latest(board, shard))

    async def latest(self, board: str, shard: str) -> dict[str, Any]:
        """The live entries of ``shard`` on ``board``: key (without the shard) → value.

        Not ``KeyValue.watch``: its end-of-initial-values marker races the first delivery
        (nats-py checks the consumer's pending count after the server may already have sent
        the entry), so a read could come back empty. A pull consumer sends nothing until
        asked, so the pending count it reports on creation is the snapshot's size; exactly
        that many distinct messages are read. Not each message's own pending count: while a
        key is being rewritten NATS 2.9 keeps counting the new writes (the read would chase
        them), and it may deliver one message twice (counted once here). A key rewritten
        meanwhile arrives in its newer version (the bucket keeps one per key, so the older
        one is gone), never missing."""
        name = bucket_name(self.prefix, board)
        stream, prefix = f"KV_{name}", f"$KV.{name}."
        consumer = uuid.uuid4().hex
        config = ConsumerConfig(name=consumer, filter_subject=f"{prefix}{shard}.>",
                                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE,
                                inactive_threshold=READ_TIMEOUT_S * 4, mem_storage=True)
        info = await self.js.add_consumer(stream, config=config)
        entries: dict[str, Any] = {}
        try:
            if remaining := info.num_pending or 0:
                sub = await self.js.pull_subscribe_bind(stream=stream, name=consumer)
                try:
                    await _take_snapshot(sub, remaining, len(prefix) + len(shard) + 1, entries)
                finally:
                    await sub.unsubscribe()
        finally:
            try:
                await self.js.delete_consumer(stream, consumer)
            except Exception:  # noqa: BLE001 — it lapses on its own after inactive_threshold
                pass
        return entries

    async def _on_board_read(self, msg: Msg) -> None:
        if not direct(msg, subjects.BOARD_WILDCARD):
            return
        _, shard, _, board = msg.subject.split(".", 3)
        if not subjects.is_shard_id(shard):  # it becomes a consumer's filter subject
            reply: dict[str, Any] = {"status": HTTPStatus.BAD_REQUEST, "error": SHARD_ID_RULE}
        elif board not in self.buckets:
            reply = {"status": HTTPStatus.NOT_FOUND,
                     "error": f"no board named {board!r}; boards: {', '.join(sorted(self.buckets))}"}
        else:
            try:
                reply = {"status": HTTPStatus.OK, "items": await self.read(shard, board)}
            except Exception as exc:  # noqa: BLE001 — whatever the cause, the caller gets a 503 to retry on
                log.warning("board read failed", extra={"board": board, "reason": repr(exc)})
                reply = {"status": HTTPStatus.SERVICE_UNAVAILABLE,
                         "error": f"board {board} could not be read now; try again"}
        await msg.respond(json.dumps(reply, ensure_ascii=False).encode())

    # --- news -------------------------------------------------------------------------

    async def _on_news_add(self, msg: Msg) -> None:
        if not direct(msg, subjects.NEWS_ADD_WILDCARD):
            return
        shard = msg.subject.split(".")[1]
        try:
            item = json.loads(msg.data or b"{}")
        except (ValueError, RecursionError):
            item = None
        news_id = item.get("id") if isinstance(item, dict) else None
        if not subjects.is_shard_id(shard):  # it becomes a key token
            reply: dict[str, Any] = {"status": HTTPStatus.BAD_REQUEST, "error": SHARD_ID_RULE}
        elif not isinstance(item, dict):
            reply = {"status": HTTPStatus.BAD_REQUEST, "error": "body must be a JSON object"}
        elif isinstance(news_id, bool) or not isinstance(news_id, (int, str)) \
                or not NEWS_ID.fullmatch(str(news_id)):
            reply = {"status": HTTPStatus.BAD_REQUEST,
                     "error": "id is required: 1-64 ASCII letters and digits naming the news item"}
        else:
            await self.buckets["news"].put(item_key(shard, str(news_id), "item"),
                                           json.dumps(item, ensure_ascii=False).encode())
            await self.nc.publish(subjects.news_announce(shard), json.dumps(item).encode())
            reply = {"status": HTTPStatus.OK, "item": item}
        await msg.respond(json.dumps(reply, ensure_ascii=False).encode())

    async def news_lines(self, shard: str, announce: bool) -> list[bytes]:
        """Every stored news item of ``shard`` as lines for the shard."""
        return [news_line(item, announce) for item in await self.read(shard, "news")]


def news_line(item: dict[str, Any], announce: bool) -> bytes:
    """One news item as the line the shard receives: ``news.add``, which the seed's shard
    understands and treats as idempotent by id (docs/gateway.md, "News")."""
    return json.dumps({**item, "kind": "news.add", "announce": announce},
                      ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


async def _take_snapshot(sub: Any, remaining: int, key_at: int, entries: dict[str, Any]) -> None:
    """Fetch ``remaining`` distinct messages of a board's snapshot into ``entries`` (key, from
    character ``key_at`` of the subject, → value): a newer version of a key wins, a delete or
    purge removes it, a message delivered twice (NATS 2.9, while keys change) counts once."""
    newest: dict[str, int] = {}  # key → stream sequence of the version in ``entries``
    seen: set[int] = set()
    while remaining > 0:
        for msg in await sub.fetch(min(remaining, READ_BATCH), timeout=READ_TIMEOUT_S):
            seq = msg.metadata.sequence.stream
            if seq in seen:
                continue
            seen.add(seq)
            remaining -= 1
            key = msg.subject[key_at:]
            if seq < newest.get(key, 0):
                continue
            newest[key] = seq
            if msg.data and not set(msg.headers or {}) & SKIPPED_HEADERS:
                entries[key] = json.loads(msg.data)
            else:  # deleted or purged (maybe after the snapshot began)
                entries.pop(key, None)
