"""The shard links: accepting TCP connections, the hello, reading lines into frames and
dead letters, heartbeats, and carrying commands from NATS to the shard holding them.

Plain asyncio and nats-py (no FastStream): ``app.py`` wires this into the service. The
command subscription ``shard.<shard>.cmd.>`` exists only while the shard is connected, so
only the replica holding the shard answers, and a shard with no connection anywhere gives
the caller NATS's immediate "no responders" — the 503 of the command plane.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError

from services.gateway import command_plane
from services.gateway.board_store import BoardStore, direct, news_line
from services.gateway.boards import RosterAssembler, board_ops
from services.gateway.command_plane import CommandRejected
from services.gateway.publisher import Outgoing, ShardPublisher
from services.gateway.reply_mapping import status_for
from services.gateway.settings import GatewaySettings
from services.gateway.wire import DeadLetter, Hello, HelloRefused, LineTooLong, check_hello, \
    read_line, sort_line
from shared import subjects

log = logging.getLogger("shardbus.gateway")

PONG = "gateway.pong"
"""The shard's answer to a ping: a sign of life, not forwarded as a frame."""

CHUNKED_KINDS = frozenset({"guild.roster"})
"""Kinds whose ``seq`` numbers the chunks of one roster, not the shard's frame sequence."""

REASON_HEADER = "Shardbus-Reason"
"""Header of a dead letter saying why the line could not be a frame."""

HEADER_ROOM = 4096
"""Bytes of a NATS message kept for headers (Nats-Msg-Id, Shardbus-Reason): the server's
max_payload counts headers and body together, and a publish over it closes the connection."""

REASON_CHARS = 300
"""Longest Shardbus-Reason header."""

WRITE_HIGH_WATER = 1024 * 1024
"""Bytes waiting for a slow shard beyond which a sender waits for them to drain."""


@dataclass
class ShardLink:
    """One shard's accepted connection."""

    hello: Hello
    writer: asyncio.StreamWriter
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    connected_at: float = field(default_factory=time.time)
    last_line_at: float = field(default_factory=time.time)
    line_no: int = 0
    frames: int = 0
    dead_letters: int = 0
    pending: dict[str, asyncio.Future] = field(default_factory=dict)
    subscriptions: list[Subscription] = field(default_factory=list)
    outbox: list[bytes] = field(default_factory=list)
    rosters: RosterAssembler = field(default_factory=RosterAssembler)
    closed: bool = False
    ending: str | None = None
    """Why the gateway is ending this link, when it is the one ending it."""

    @property
    def shard(self) -> str:
        return self.hello.shard

    async def send(self, line: bytes) -> None:
        """Write one line to the shard (a closed link swallows it).

        Lines sent in one turn of the event loop go out in one write (one system call)."""
        if not self.post(line):
            return
        if self.writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            try:
                await self.writer.drain()
            except ConnectionError:
                pass

    def post(self, line: bytes) -> bool:
        """Queue one line for this turn's write; False when the link is closed."""
        if self.closed or self.writer.is_closing():
            return False
        if not self.outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self.outbox.append(line)
        return True

    def _flush(self) -> None:
        lines, self.outbox = self.outbox, []
        if lines and not self.closed and not self.writer.is_closing():
            self.writer.write(b"".join(lines))

    def close(self, why: str) -> None:
        """Close the connection; commands still waiting get a 503."""
        if self.closed:
            return
        self.closed = True
        for future in self.pending.values():
            if not future.done():
                future.set_exception(CommandRejected(503, f"shard {self.shard} disconnected ({why}) "
                                                          "before answering"))
        self.writer.close()


class Gateway:
    """Every shard link of this replica, their publishers, and the command plane."""

    def __init__(self, nc: Client, settings: GatewaySettings) -> None:
        self.nc, self.settings = nc, settings
        self.js = nc.jetstream()
        self.links: dict[str, ShardLink] = {}
        self.publishers: dict[str, ShardPublisher] = {}
        self.boards = BoardStore(nc, settings.board_bucket_prefix, settings.jetstream_replicas)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.line_cap = min(settings.max_line_bytes, nc.max_payload - HEADER_ROOM)
        """The longest line accepted: a line plus the headers the gateway adds always fits in
        one NATS message (the server's max_payload, from its INFO)."""
        if self.line_cap < settings.max_line_bytes:
            log.info("line cap lowered to fit NATS's max_payload",
                        extra={"max_line_bytes": settings.max_line_bytes, "line_cap": self.line_cap,
                               "max_payload": nc.max_payload})

    async def start(self) -> None:
        """Declare the streams and the boards' buckets, and answer board reads and news."""
        await self.declare_streams()
        await self.boards.declare()
        await self.boards.serve()

    async def declare_streams(self) -> None:
        """Create (or update) the frames and dead-letter streams, de-duplicating by message id."""
        window = self.settings.duplicate_window_s
        for name, subject in ((self.settings.frames_stream, subjects.FRAMES_WILDCARD),
                              (self.settings.deadletter_stream, subjects.DEADLETTER_WILDCARD)):
            config = StreamConfig(name=name, subjects=[subject], duplicate_window=window,
                                  num_replicas=self.settings.jetstream_replicas)
            try:
                await self.js.add_stream(config)
            except BadRequestError:
                await self.js.update_stream(config)
        # nats-py sets up publish_async's reply subscription on first use, unguarded: two
        # shards publishing at once could each set it up and lose the other's acks.
        if not self.js._async_reply_prefix:
            await self.js._init_async_reply()

    # --- tokens -----------------------------------------------------------------------

    def token_for(self, shard: str) -> str:
        """The token ``shard`` must present: its own if configured, else the common one."""
        own = self.settings.shard_tokens.get(shard)
        return (own or self.settings.shard_token).get_secret_value()

    # --- publishing -------------------------------------------------------------------

    def publisher(self, shard: str) -> ShardPublisher:
        """The shard's publisher (created on first use; it outlives connections)."""
        if shard not in self.publishers:
            pub = ShardPublisher(self.nc, self.js, window=self.settings.publish_window,
                                 ack_timeout_s=self.settings.publish_ack_timeout_s,
                                 buffer=self.settings.buffer_frames, buffer_bytes=self.settings.buffer_bytes,
                                 dead_letter_subject=subjects.deadletter(shard),
                                 on_stored=lambda item, s=shard: self._acknowledge(s, item))
            pub.start()
            self.publishers[shard] = pub
        return self.publishers[shard]

    def _acknowledge(self, shard: str, item: Outgoing) -> None:
        link = self.links.get(shard)
        if item.ack_seq is None or link is None:
            return
        link.post(b'{"kind":"frame.ack","seq":%d}\n' % item.ack_seq)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- connections ------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One TCP connection from hello to close."""
        peer = str(writer.get_extra_info("peername"))
        link: ShardLink | None = None
        why = "the shard closed the connection"
        try:
            first = await asyncio.wait_for(read_line(reader, self.line_cap),
                                           self.settings.hello_timeout_s)
            if first is None:
                return
            hello = check_hello(first, self.token_for)
            link = await self._attach(hello, writer, first, peer)
            await self._read_frames(link, reader)
        except HelloRefused as exc:
            log.warning("hello refused", extra={"peer": peer, "reason": str(exc)})
            await _tell_refused(writer, str(exc))
        except (LineTooLong, TimeoutError, ConnectionError) as exc:
            why = str(exc) or type(exc).__name__
            if link is None:  # a link's end is logged once, as "shard disconnected"
                log.warning("connection closed", extra={"peer": peer, "reason": why})
        except Exception as exc:
            why = f"the gateway failed: {exc!r}"
            log.exception("connection failed", extra={"peer": peer})
        finally:
            if link is not None:
                await self._detach(link, link.ending or why)
            writer.close()

    async def _attach(self, hello: Hello, writer: asyncio.StreamWriter, first: bytes,
                      peer: str) -> ShardLink:
        old = self.links.get(hello.shard)
        if old is not None:
            log.info("shard reconnected; closing its old connection", extra={"shard": hello.shard})
            await self._detach(old, "replaced by a new connection")
        link = ShardLink(hello, writer)
        self.links[hello.shard] = link

        commands, announcements = subjects.command_wildcard(hello.shard), subjects.news_announce(hello.shard)

        async def on_command(msg: Msg) -> None:
            # Each command in its own task: nats-py runs a subscription's callbacks one by one.
            if direct(msg, commands):
                self._spawn(self._command(link, msg))

        async def on_news(msg: Msg) -> None:
            if direct(msg, announcements):
                self._spawn(link.send(news_line(json.loads(msg.data), announce=True)))

        link.subscriptions = [await self.nc.subscribe(commands, cb=on_command),
                              await self.nc.subscribe(announcements, cb=on_news)]
        try:  # the server knows the subscriptions before the shard counts as connected
            await self.nc.flush(timeout=2)
        except Exception:
            log.warning("NATS did not confirm the command subscription", extra={"shard": hello.shard})
        log.info("shard connected", extra={"shard": hello.shard, "protocol": hello.protocol, "peer": peer})
        # The hello is forwarded without its token: a secret never goes into the stream.
        data = _without_token(json.loads(first))
        await self.publisher(hello.shard).put(
            Outgoing(subjects.frame(hello.shard, "server.hello"), data, f"{hello.shard}.{link.epoch}.0"))
        self._spawn(self._replay_news(link))
        self._spawn(self._ping(link))
        return link

    async def _detach(self, link: ShardLink, why: str) -> None:
        # Closed first: a command arriving until the unsubscription lands gets a 503 at once.
        if not link.closed:
            log.info("shard disconnected", extra={"shard": link.shard, "reason": why, "frames": link.frames,
                                                  "deadLetters": link.dead_letters,
                                                  "connectedForS": round(time.time() - link.connected_at, 3)})
        link.close(why)
        subscriptions, link.subscriptions = link.subscriptions, []
        try:
            for sub in subscriptions:
                await sub.unsubscribe()
            if subscriptions:
                await self.nc.flush(timeout=2)
        except Exception:  # NATS away: the subscriptions go with the connection
            pass
        if self.links.get(link.shard) is link:
            del self.links[link.shard]

    async def _replay_news(self, link: ShardLink) -> None:
        """After each hello, the stored news again, marked not to be announced."""
        try:
            lines = await self.boards.news_lines(link.shard, announce=False)
        except Exception as exc:
            log.warning("news not replayed", extra={"shard": link.shard, "reason": repr(exc)})
            return
        for line in lines:
            await link.send(line)

    async def _ping(self, link: ShardLink) -> None:
        """Ping every so often, and disconnect a shard silent past the timeout.

        A watchdog rather than a timeout around each read: that would cost a task per line."""
        ping = json.dumps({"kind": "gateway.ping"}).encode() + b"\n"
        timeout = self.settings.silence_timeout_s
        next_ping = time.monotonic() + self.settings.ping_every_s
        while not link.closed:
            await asyncio.sleep(min(self.settings.ping_every_s, timeout) / 4)
            if time.time() - link.last_line_at > timeout:
                link.ending = f"silent for {timeout} s"  # logged once, as "shard disconnected"
                link.writer.transport.abort()
                return
            if time.monotonic() >= next_ping:
                next_ping += self.settings.ping_every_s
                await link.send(ping)

    async def _read_frames(self, link: ShardLink, reader: asyncio.StreamReader) -> None:
        cap = self.line_cap
        while not link.closed:
            line = await read_line(reader, cap)
            if line is None:
                return
            link.last_line_at = time.time()
            link.line_no += 1
            if not line.strip():
                continue
            await self._take(link, line)

    async def _take(self, link: ShardLink, line: bytes) -> None:
        shard = link.shard
        item = sort_line(line)
        msg_id = f"{shard}.{link.epoch}.{link.line_no}"
        if isinstance(item, DeadLetter):
            link.dead_letters += 1
            log.warning("dead letter", extra={"shard": shard, "reason": item.reason, "line_no": link.line_no})
            await self.publisher(shard).put(Outgoing(subjects.deadletter(shard), line, msg_id,
                                                     {REASON_HEADER: item.reason[:REASON_CHARS]}))
            return
        if item.kind == PONG:
            return
        if item.kind == "server.hello":
            # A hello on an open link: the seed's sidecar takes it as the shard starting over
            # (S004:295-298: partial rosters dropped, news replayed). It is forwarded like the
            # first one, without its token: a secret never goes into the stream.
            line = _without_token(item.body)
            link.rosters = RosterAssembler()
            self._spawn(self._replay_news(link))
        req_id = item.body.get("reqId")
        if isinstance(req_id, str) and (future := link.pending.get(req_id)) and not future.done():
            future.set_result((item.body, line))
        seq = item.body.get("seq")
        ack_seq = None
        if type(seq) is int and item.kind not in CHUNKED_KINDS:
            msg_id, ack_seq = f"{shard}.seq.{seq}", seq
        link.frames += 1
        await self.publisher(shard).put(Outgoing(subjects.frame(shard, item.kind), line, msg_id,
                                                 ack_seq=ack_seq))
        ops, problem = board_ops(shard, item.kind, item.body, link.rosters)
        if problem is not None:
            # Forwarded as a frame all the same; the board could not use it, and says why.
            link.dead_letters += 1
            log.warning("dead letter", extra={"shard": shard, "reason": problem, "line_no": link.line_no})
            await self.publisher(shard).put(Outgoing(subjects.deadletter(shard), line, f"{msg_id}.board",
                                                     {REASON_HEADER: problem[:REASON_CHARS]}))
        await self.boards.write(shard, ops)

    # --- commands ---------------------------------------------------------------------

    async def _command(self, link: ShardLink, msg: Msg) -> None:
        verb = msg.subject[len(f"shard.{link.shard}.cmd."):]
        try:
            status, line = await self.run_command(link, verb, msg.data, (msg.headers or {}).get(
                command_plane.PROTOCOL_HEADER))
            # The shard's line is the body verbatim: spliced in, not parsed and dumped again.
            data = b'{"status":%d,"body":%s}' % (status, line.strip())
        except CommandRejected as exc:
            data = json.dumps({"status": exc.status, "error": exc.error}, ensure_ascii=False).encode()
        if msg.reply:
            try:
                await msg.respond(data)
            except Exception:
                log.warning("could not answer a command", extra={"shard": link.shard, "verb": verb})

    async def run_command(self, link: ShardLink, verb: str, payload: bytes,
                          expected_protocol: str | None) -> tuple[int, bytes]:
        """Send the command to the shard; the status its answer maps to and the answer's line.
        CommandRejected for the gateway's own answers."""
        body = command_plane.parse_body(verb, payload)
        command_plane.check_protocol(expected_protocol, link.hello.protocol)
        if link.closed:
            raise CommandRejected(503, f"shard {link.shard} is not connected here any more; try again")
        req_id = command_plane.new_req_id()
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        link.pending[req_id] = future
        # A timer on the future rather than asyncio.wait_for, which costs a task per command.
        timer = loop.call_later(self.settings.command_timeout_s, _expire, future)
        try:
            await link.send(command_plane.command_line(verb, body, req_id))
            try:
                answer, line = await future
            except TimeoutError:
                raise CommandRejected(504, f"shard {link.shard} did not answer {verb} within "
                                           f"{self.settings.command_timeout_s} s") from None
        finally:
            timer.cancel()
            link.pending.pop(req_id, None)  # a late answer now finds nobody waiting: dropped
        return status_for(verb, answer), line

    # --- status -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What ``gateway.status`` answers: each connected shard and its last line."""
        now = time.time()
        shards = []
        for shard, link in sorted(self.links.items()):
            pub = self.publishers.get(shard)
            shards.append({"shard": shard, "protocol": link.hello.protocol,
                           "connectedAt": round(link.connected_at * 1000),
                           "lastLineAt": round(link.last_line_at * 1000),
                           "silentForS": round(now - link.last_line_at, 3),
                           "frames": link.frames, "deadLetters": link.dead_letters,
                           "unpublished": pub.pending() if pub else 0,
                           "boardWritesPending": self.boards.pending(shard)})
        return {"status": 200, "shards": shards}

    async def stop(self) -> None:
        """Close every link, then let buffered frames reach JetStream."""
        for link in list(self.links.values()):
            await self._detach(link, "gateway stopping")
        await asyncio.gather(*(pub.stop() for pub in self.publishers.values()))
        await self.boards.stop()
        for task in list(self._tasks):
            task.cancel()


def _without_token(hello: dict[str, Any]) -> bytes:
    """A hello as it is forwarded: every field but ``token``."""
    return json.dumps({k: v for k, v in hello.items() if k != "token"}, ensure_ascii=False,
                      separators=(",", ":")).encode()


HELLO_REFUSED = "gateway.hello.refused"
"""The one line a refused shard gets before the gateway closes: why (never the token)."""


async def _tell_refused(writer: asyncio.StreamWriter, reason: str) -> None:
    """Say why the hello was refused, on one line, before closing (best effort)."""
    try:
        writer.write(json.dumps({"kind": HELLO_REFUSED, "reason": reason}).encode() + b"\n")
        await asyncio.wait_for(writer.drain(), 1.0)
    except (ConnectionError, TimeoutError):
        pass


def _expire(future: asyncio.Future) -> None:
    """A command's time is up: its caller gets the 504."""
    if not future.done():
        future.set_exception(TimeoutError())
