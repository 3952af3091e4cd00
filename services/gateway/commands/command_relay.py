"""Carrying a command from NATS to the shard holding it, and the shard's answer back to the
caller with its status. The rules for a request's body and the line the shard receives are in
``command_plane.py``, the statuses of the shard's answers in ``reply_mapping.py``; the
subscription ``shard.<shard>.cmd.>`` that brings the commands is the link's (``connections.py``).

Lean by design (issue 15): a command costs no task, no future and no timer. Its request is
taken in the subscription's callback, its line queued for the shard, and an entry put in the
link's reqId map (``ShardLink.pending``: the caller's reply subject, the verb, the deadline).
The intake answers it (:meth:`CommandRelay.answer`, :meth:`CommandRelay.send`) in the turn it
parses the shard's answer line, without waiting for that line to reach JetStream as a frame.
One sweeper per gateway answers the entries whose time is up (504); a link that closes has its
entries answered at once (503); a link holding ``max_pending`` entries refuses more (503)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.gateway.commands import command_plane
from services.gateway.commands.command_plane import CommandRejected
from services.gateway.commands.reply_mapping import status_for
from services.gateway.counts import GatewayCounts
from services.gateway.publishing import nats_protocol
from services.gateway.shard_link.link import ShardLink, Waiting

log = logging.getLogger("shardbus.gateway")

UNSENT_LIMIT = 16 * 1024 * 1024
"""Bytes written to a shard and not yet taken by its socket beyond which its commands are
refused (503): a shard that stops reading must not make the gateway hold every command line a
flood of callers sends it."""

SWEEP_GRAIN_S = 0.005
"""Shortest pause of the deadline sweeper between two looks: commands whose time is up within
a few milliseconds of each other are answered in one go (a 504 comes at most this much late)."""


@dataclass(slots=True)
class Reply:
    """The reply to a command the shard answered: where to, and its bytes."""

    link: ShardLink
    waiting: Waiting
    data: bytes
    status: int


class CommandRelay:
    """Runs each command on the shard's link: one line out, the answer with its ``reqId`` awaited
    for ``timeout_s`` (then 504), and the caller's reply ``{"status", "body"}`` or, when the
    gateway answers by itself, ``{"status", "error"}``."""

    def __init__(self, nc: Client, timeout_s: float, max_pending: int = 1000,
                 counts: GatewayCounts | None = None, post: Callable[[bytes], None] | None = None) -> None:
        self.nc = nc
        self.post = post
        """Adds a protocol command to the publish pipeline's next write (None: replies go
        through ``Client.publish`` one by one)."""
        self.counts = counts or GatewayCounts()
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self._watched: dict[ShardLink, None] = {}
        """The links with commands waiting (an ordered set), which the sweeper looks at."""
        self._wake = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None

    async def take(self, link: ShardLink, msg: Msg) -> None:
        """A command ``msg`` brought for ``link``'s shard (the subscription's callback, in the
        subscription's own task): refused at once, or sent to the shard and put in the link's
        reqId map; the reply goes out from :meth:`answered`, the sweeper or :meth:`closed`."""
        verb = msg.subject[len(link.shard) + 11:]  # after "shard.<shard>.cmd."
        reply, headers = msg.reply, msg.headers
        try:
            body = command_plane.parse_body(verb, msg.data)
            command_plane.check_protocol(headers.get(command_plane.PROTOCOL_HEADER) if headers else None,
                                         link.hello.protocol)
            self._check_room(link)
        except CommandRejected as exc:
            if reply:
                await self._reply(link, reply, headers, verb, _error(exc.status, exc.sentence), exc.status)
            return
        req_id = command_plane.new_req_id()
        if reply:  # a command nobody waits for is sent all the same; nothing to answer
            loop = asyncio.get_running_loop()
            link.pending[req_id] = Waiting(reply, headers, verb, loop.time() + self.timeout_s)
            if link not in self._watched:
                self._watched[link] = None
                self._start_sweeping()
        if link.post(command_plane.command_line(verb, body, req_id)):
            self.counts.frame_out(verb)

    def _check_room(self, link: ShardLink) -> None:
        """503 when the link cannot take another command: closed, its reqId map full, or its
        shard not reading what the gateway writes."""
        if link.closed:
            raise CommandRejected(HTTPStatus.SERVICE_UNAVAILABLE,
                                  f"shard {link.shard} is not connected here any more; try again")
        if len(link.pending) >= self.max_pending:
            raise CommandRejected(HTTPStatus.SERVICE_UNAVAILABLE,
                                  f"shard {link.shard} already has {self.max_pending} commands waiting for "
                                  f"its answers (the gateway's limit, SHARDBUS_MAX_PENDING_COMMANDS); "
                                  f"try again once some are answered")
        if (unsent := link.unsent_bytes()) > UNSENT_LIMIT:
            raise CommandRejected(HTTPStatus.SERVICE_UNAVAILABLE,
                                  f"shard {link.shard} is not reading what the gateway writes to it "
                                  f"({unsent} bytes waiting); try again")

    def answer(self, link: ShardLink, body: dict[str, Any], line: bytes) -> Reply | None:
        """A line of ``link`` (parsed as ``body``): if its ``reqId`` is a command still waiting, it
        is the answer (taken out of the reqId map), and this is the caller's reply with its
        status, for :meth:`send`. A late answer (its command already had its 504) finds nobody
        waiting: None, dropped."""
        req_id = body.get("reqId")
        if type(req_id) is not str or (waiting := link.pending.pop(req_id, None)) is None:
            return None
        # The shard's line is the body verbatim: spliced in, not parsed and dumped again.
        status = status_for(waiting.verb, body)
        return Reply(link, waiting, b'{"status":%d,"body":%s}' % (status, line.strip()), status)

    async def send(self, reply: Reply) -> None:
        """Send the caller its reply (nats-py queues it for this turn's write to NATS)."""
        await self._reply(reply.link, reply.waiting.reply, reply.waiting.headers, reply.waiting.verb, reply.data,
                          reply.status, reply.waiting)

    def send_now(self, reply: Reply) -> bool:
        """:meth:`send` without a task switch, in the pipeline's next write with the turn's other
        replies and frames; False (nothing sent) when it must go through :meth:`send`."""
        waiting = reply.waiting
        if self.post is None or not self.nc.is_connected:
            return False
        command = nats_protocol.reply(waiting.reply, reply.data, waiting.headers, self.nc.max_payload)
        if command is None:
            return False
        self._count(reply.status, waiting)
        self.post(command)
        return True

    async def answered(self, link: ShardLink, body: dict[str, Any], line: bytes) -> None:
        """:meth:`answer` and :meth:`send` in one."""
        if (reply := self.answer(link, body, line)) is not None:
            await self.send(reply)

    async def closed(self, link: ShardLink, why: str) -> None:
        """``link`` closed: each command still waiting for its answer gets its 503 now."""
        waiting = list(link.pending.values())
        link.pending.clear()
        self._watched.pop(link, None)
        if waiting:
            data = _error(HTTPStatus.SERVICE_UNAVAILABLE, f"shard {link.shard} disconnected ({why}) before answering")
            for one in waiting:
                await self._reply(link, one.reply, one.headers, one.verb, data, HTTPStatus.SERVICE_UNAVAILABLE, one)

    async def stop(self) -> None:
        """Stop the sweeper (the gateway stops; its links are closed first)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    def _start_sweeping(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        self._wake.set()

    async def _sweep(self) -> None:
        """The one deadline sweeper: sleeps until the earliest deadline of the links' reqId maps
        (each map's first entry: the maps are in deadline order), answers the commands whose
        time is up with the 504, and waits for a command when none is waiting."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._watched:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                due = await self._expire(loop.time())
            except Exception:  # a bug must not stop the 504s of every later command
                log.exception("the command deadline sweeper failed")
                due = loop.time() + 1.0
            await asyncio.sleep(max(due - loop.time(), SWEEP_GRAIN_S))

    async def _expire(self, now: float) -> float:
        """Answer every command whose deadline is past; the next deadline."""
        due = now + self.timeout_s
        expired: list[tuple[ShardLink, Waiting]] = []
        for link in list(self._watched):
            pending = link.pending
            if link.closed and pending:  # closed without CommandRelay.closed: answered here
                await self.closed(link, link.closed_why or "the connection closed")
                continue
            gone = []
            for req_id, waiting in pending.items():
                if waiting.deadline > now:
                    due = min(due, waiting.deadline)
                    break
                gone.append(req_id)
            for req_id in gone:
                expired.append((link, pending.pop(req_id)))
            if not pending:
                self._watched.pop(link, None)
        for link, waiting in expired:
            data = _error(HTTPStatus.GATEWAY_TIMEOUT,
                          f"shard {link.shard} did not answer {waiting.verb} within {self.timeout_s} s")
            await self._reply(link, waiting.reply, waiting.headers, waiting.verb, data, HTTPStatus.GATEWAY_TIMEOUT,
                              waiting)
        return due

    def _count(self, status: int, waited: Waiting | None) -> None:
        # Counted (commands_total, command_duration_seconds): a waiting command's deadline is
        # its start plus the timeout, so no start time is kept.
        self.counts.replied(status, None if waited is None else
                            asyncio.get_running_loop().time() - (waited.deadline - self.timeout_s))

    async def _reply(self, link: ShardLink, reply: str, headers: dict[str, str] | None, verb: str,
                     data: bytes, status: int, waited: Waiting | None = None) -> None:
        self._count(status, waited)
        # What Msg.respond does (the request's headers go back with the reply), without a Msg.
        try:
            await self.nc.publish(reply, data, headers=headers)
        except Exception:  # noqa: BLE001 — the caller is gone or NATS is away: logged, nothing to retry
            log.warning("could not answer a command", extra={"shard": link.shard, "verb": verb})


def _error(status: int, error: str) -> bytes:
    """The gateway's own answer: ``{"status": N, "error": "…"}``."""
    return json.dumps({"status": status, "error": error}, ensure_ascii=False).encode()
