"""Carrying a command from NATS to the shard holding it, and the shard's answer back to the
caller with its status. The rules for a request's body and the line the shard receives are in
``command_plane.py``, the statuses of the shard's answers in ``reply_mapping.py``; the
subscription ``shard.<shard>.cmd.>`` that brings the commands is the link's (``connections.py``)."""

from __future__ import annotations

import asyncio
import json
import logging
from http import HTTPStatus

from nats.aio.msg import Msg

from services.gateway import command_plane
from services.gateway.command_plane import CommandRejected
from services.gateway.link import Answer, ShardLink
from services.gateway.reply_mapping import status_for

log = logging.getLogger("shardbus.gateway")


class CommandRelay:
    """Runs each command on the shard's link: one line out, the answer with its ``reqId`` awaited
    for ``timeout_s`` (then 504), and the caller's reply ``{"status", "body"}`` or, when the
    gateway answers by itself, ``{"status", "error"}``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def answer(self, link: ShardLink, msg: Msg) -> None:
        """Run the command ``msg`` brought and reply to its caller."""
        verb = msg.subject[len(f"shard.{link.shard}.cmd."):]
        try:
            status, line = await self.run(link, verb, msg.data, (msg.headers or {}).get(
                command_plane.PROTOCOL_HEADER))
            # The shard's line is the body verbatim: spliced in, not parsed and dumped again.
            data = b'{"status":%d,"body":%s}' % (status, line.strip())
        except CommandRejected as exc:
            data = json.dumps({"status": exc.status, "error": exc.error}, ensure_ascii=False).encode()
        if msg.reply:
            try:
                await msg.respond(data)
            except Exception:  # noqa: BLE001 — the caller is gone or NATS is away: logged, nothing to retry
                log.warning("could not answer a command", extra={"shard": link.shard, "verb": verb})

    async def run(self, link: ShardLink, verb: str, payload: bytes,
                  expected_protocol: str | None) -> tuple[HTTPStatus, bytes]:
        """Send the command to the shard; the status its answer maps to and the answer's line.
        CommandRejected for the gateway's own answers."""
        body = command_plane.parse_body(verb, payload)
        command_plane.check_protocol(expected_protocol, link.hello.protocol)
        if link.closed:
            raise CommandRejected(HTTPStatus.SERVICE_UNAVAILABLE,
                                  f"shard {link.shard} is not connected here any more; try again")
        req_id = command_plane.new_req_id()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        link.pending[req_id] = future
        # A timer on the future rather than asyncio.wait_for, which costs a task per command.
        timer = loop.call_later(self.timeout_s, _expire, future)
        try:
            await link.send(command_plane.command_line(verb, body, req_id))
            try:
                answer, line = await future
            except TimeoutError:
                raise CommandRejected(HTTPStatus.GATEWAY_TIMEOUT, f"shard {link.shard} did not answer {verb} "
                                                                  f"within {self.timeout_s} s") from None
        finally:
            timer.cancel()
            link.pending.pop(req_id, None)  # a late answer now finds nobody waiting: dropped
        return status_for(verb, answer), line


def _expire(future: asyncio.Future[Answer]) -> None:
    """A command's time is up: its caller gets the 504."""
    if not future.done():
        future.set_exception(TimeoutError())
