"""What a shard's lines become. Its hello and every later line go to JetStream through the
shard's publisher: a frame, or a dead letter with the reason. A board frame also goes to the
boards, an answer to the command waiting for it (its caller's reply sent before the line is
queued for JetStream); a hello replays the shard's news."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext

from services.gateway.boards.rules import RULES_BY_KIND, Op, RosterAssembler, board_ops
from services.gateway.boards.store import BoardStore
from services.gateway.commands.command_relay import CommandRelay, Reply
from services.gateway.counts import BOARD_UNUSABLE, GatewayCounts, reason_label
from services.gateway.publishing.outgoing import Outgoing
from services.gateway.publishing.pipeline import PublishPipeline
from services.gateway.publishing.publisher import REASON_CHARS, REASON_HEADER, ShardPublisher
from services.gateway.settings import GatewaySettings
from services.gateway.shard_link.link import ShardLink
from services.gateway.shard_link.wire import DeadLetter, sort_line
from shared import subjects

log = logging.getLogger("shardbus.gateway")

PONG = "gateway.pong"
"""The shard's answer to a ping: a sign of life, not forwarded as a frame."""

CHUNKED_KINDS = frozenset({"guild.roster"})
"""Kinds whose ``seq`` numbers the chunks of one roster, not the shard's frame sequence."""

Spawn = Callable[[Coroutine[Any, Any, None]], None]
"""Runs a coroutine in the background, as a task the gateway cancels when it stops."""


class FrameIntake:
    """Every shard's lines in: one :class:`ShardPublisher` per shard (created on first use; it
    outlives connections, so a reconnect cannot overtake frames still buffered), acknowledging
    a frame's ``seq`` on the shard's link once JetStream holds it."""

    def __init__(self, nc: Client, js: JetStreamContext, settings: GatewaySettings, boards: BoardStore,
                 links: Mapping[str, ShardLink], commands: CommandRelay, spawn: Spawn,
                 counts: GatewayCounts | None = None, pipeline: PublishPipeline | None = None) -> None:
        self.nc, self.js, self.settings, self.boards = nc, js, settings, boards
        self.links = links
        self.commands = commands
        self.spawn = spawn
        self.counts = counts or GatewayCounts()
        self.publishers: dict[str, ShardPublisher] = {}
        self.pipeline = pipeline or PublishPipeline(nc, settings.publish_ack_timeout_s)
        """Sends every shard's queued frames and takes their acknowledgements (one task, one inbox)."""

    def publisher(self, shard: str) -> ShardPublisher:
        """The shard's publisher (created on first use; it outlives connections)."""
        if shard not in self.publishers:
            pub = ShardPublisher(self.pipeline, self.js, window=self.settings.publish_window,
                                 buffer=self.settings.buffer_frames, buffer_bytes=self.settings.buffer_bytes,
                                 dead_letter_subject=subjects.deadletter(shard),
                                 on_stored=functools.partial(self._acknowledge, shard))
            pub.start()
            self.publishers[shard] = pub
        return self.publishers[shard]

    def _acknowledge(self, shard: str, item: Outgoing) -> None:
        link = self.links.get(shard)
        if item.ack_seq is None or link is None:
            return
        if link.post(b'{"kind":"frame.ack","seq":%d}\n' % item.ack_seq):
            self.counts.frames_out["frame.ack"] += 1

    async def take_hello(self, link: ShardLink, first: bytes) -> None:
        """The hello that opened the link: forwarded without its token (a secret never goes into
        the stream), and the stored news replayed."""
        data = without_token(json.loads(first))
        self.counts.frame_in("server.hello")
        await self.publisher(link.shard).put(
            Outgoing(subjects.frame(link.shard, "server.hello"), data, f"{link.shard}.{link.epoch}.0"))
        self.spawn(self._replay_news(link))

    async def take(self, link: ShardLink, line: bytes) -> None:
        """One later line of the link (not blank)."""
        if (rest := self.take_now(link, line)) is not None:
            await rest

    def take_now(self, link: ShardLink, line: bytes) -> Coroutine[Any, Any, None] | None:
        """:meth:`take` without a task switch when nothing has to wait (the common frame: its
        publisher has room, its board writes fit their queue, no command waits for it): None
        when the line is taken, else what is left of taking it, to be awaited before the
        shard's next line (so the shard's order holds)."""
        shard = link.shard
        item = sort_line(line)
        msg_id = f"{shard}.{link.epoch}.{link.line_no}"
        if isinstance(item, DeadLetter):
            link.dead_letters += 1
            self.counts.dead_letter(reason_label(item.reason))
            log.warning("dead letter", extra={"shard": shard, "reason": item.reason, "line_no": link.line_no})
            return self._put(shard, Outgoing(subjects.deadletter(shard), line, msg_id,
                                             {REASON_HEADER: item.reason[:REASON_CHARS]}))
        self.counts.frame_in(item.kind)
        if item.kind == PONG:
            return None
        if item.kind == "server.hello":
            # A hello on an open link is the shard starting over: partial rosters dropped, news
            # replayed (docs/gateway.md, "Frames"). It is forwarded like the first one,
            # without its token: a secret never goes into the stream.
            line = without_token(item.body)
            link.rosters = RosterAssembler()
            self.spawn(self._replay_news(link))
        reply = self.commands.answer(link, item.body, line) if link.pending else None
        seq = item.body.get("seq")
        ack_seq = None
        if type(seq) is int and item.kind not in CHUNKED_KINDS:
            msg_id, ack_seq = f"{shard}.seq.{seq}", seq
        link.frames += 1
        frame = Outgoing(subjects.frame(shard, item.kind), line, msg_id, ack_seq=ack_seq)
        publisher = self.publisher(shard)
        if not publisher.has_room(frame) or (reply is not None and not self.commands.send_now(reply)):
            return self._take_rest(link, item.kind, item.body, line, msg_id, frame, reply)
        # A reply (sent now) and its frame go out in the pipeline's next write: one system call.
        publisher.put_nowait(frame)
        if item.kind not in RULES_BY_KIND:
            return None  # most frames: no board
        return self._board(link, item.kind, item.body, line, msg_id)

    async def _take_rest(self, link: ShardLink, kind: str, body: dict[str, Any], line: bytes, msg_id: str,
                         frame: Outgoing, reply: Reply | None) -> None:
        publisher = self.publisher(link.shard)
        if reply is None:
            await publisher.put(frame)
        elif publisher.has_room(frame):
            # The caller's reply is sent now, in this turn; the frame is only queued first so that
            # the pipeline's next pass adds it to the same write to NATS (one system call, not two).
            publisher.put_nowait(frame)
            await self.commands.send(reply)
        else:  # the publisher is full (back-pressure): the reply does not wait for it
            await self.commands.send(reply)
            await publisher.put(frame)
        if (rest := self._board(link, kind, body, line, msg_id)) is not None:
            await rest

    def _board(self, link: ShardLink, kind: str, body: dict[str, Any], line: bytes,
               msg_id: str) -> Coroutine[Any, Any, None] | None:
        """What a frame does to the boards (and the dead letter when a board cannot use it);
        None when done without waiting."""
        shard = link.shard
        evicted = link.rosters.evicted
        ops, problem = board_ops(shard, kind, body, link.rosters, len(line))
        if link.rosters.evicted != evicted:
            log.warning("partial rosters discarded: the shard's unfinished rosters held too much",
                        extra={"shard": shard, "discarded": link.rosters.evicted - evicted,
                               "held_bytes": link.rosters.held_bytes})
        letter = None
        if problem is not None:
            # Forwarded as a frame all the same; the board could not use it, and says why.
            link.dead_letters += 1
            self.counts.dead_letter(BOARD_UNUSABLE)
            log.warning("dead letter", extra={"shard": shard, "reason": problem, "line_no": link.line_no})
            letter = Outgoing(subjects.deadletter(shard), line, f"{msg_id}.board",
                              {REASON_HEADER: problem[:REASON_CHARS]})
        if (letter is None or self.publisher(shard).has_room(letter)) and self.boards.write_nowait(shard, ops):
            if letter is not None:
                self.publisher(shard).put_nowait(letter)
            return None
        return self._board_later(shard, letter, ops)

    async def _board_later(self, shard: str, letter: Outgoing | None, ops: list[Op]) -> None:
        if letter is not None:
            await self.publisher(shard).put(letter)
        await self.boards.write(shard, ops)

    def _put(self, shard: str, item: Outgoing) -> Coroutine[Any, Any, None] | None:
        publisher = self.publisher(shard)
        if publisher.has_room(item):
            publisher.put_nowait(item)
            return None
        return publisher.put(item)

    async def _replay_news(self, link: ShardLink) -> None:
        """After each hello, the stored news again, marked not to be announced."""
        try:
            lines = await self.boards.news_lines(link.shard, announce=False)
        except Exception as exc:  # noqa: BLE001 — the bucket unreadable now: the next hello replays it
            log.warning("news not replayed", extra={"shard": link.shard, "reason": repr(exc)})
            return
        for line in lines:
            await link.send(line)
        self.counts.frame_out("news.add", len(lines))

    async def stop(self) -> None:
        """Let buffered frames reach JetStream, then stop every publisher."""
        await asyncio.gather(*(pub.stop() for pub in self.publishers.values()))
        await self.pipeline.stop()


def without_token(hello: dict[str, Any]) -> bytes:
    """A hello as it is forwarded: every field but ``token``."""
    return json.dumps({k: v for k, v in hello.items() if k != "token"}, ensure_ascii=False,
                      separators=(",", ":")).encode()
