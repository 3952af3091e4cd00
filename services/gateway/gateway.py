"""One gateway replica, its parts wired together, and :func:`serve`, which runs it: the
listener shards dial and everything it needs (``app.py`` and the tests both use it).

Plain asyncio and nats-py (no FastStream): ``app.py`` wires this into the service."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from nats.aio.client import Client

from services.gateway.boards.store import BoardStore
from services.gateway.commands.command_relay import CommandRelay
from services.gateway.counts import GatewayCounts
from services.gateway.intake import FrameIntake
from services.gateway.publishing.pipeline import PublishPipeline
from services.gateway.publishing.publisher import ShardPublisher
from services.gateway.publishing.streams import declare_streams
from services.gateway.settings import GatewaySettings
from services.gateway.shard_link.connections import Connections
from services.gateway.shard_link.handshake import TLSHandoff
from services.gateway.shard_link.link import ShardLink
from shared.nats_calls import HEADER_ROOM  # headers' room under max_payload (Nats-Msg-Id, Shardbus-Reason)
from shared.tls import ReloadingServerContext

log = logging.getLogger("shardbus.gateway")

class Gateway:
    """Every shard link of this replica (``connections``), what their lines become (``intake``,
    which holds the shards' publishers), the command relay and the boards."""

    def __init__(self, nc: Client, settings: GatewaySettings) -> None:
        self.nc, self.settings = nc, settings
        self.js = nc.jetstream()
        self.links: dict[str, ShardLink] = {}
        self.boards = BoardStore(nc, settings.board_bucket_prefix, settings.jetstream_replicas)
        self._tasks: set[asyncio.Future[None]] = set()
        self.counts = GatewayCounts()
        """What the gateway counted since it started (its metrics: ``metrics.py``)."""
        self.line_cap = min(settings.max_line_bytes, nc.max_payload - HEADER_ROOM)
        """The longest line accepted: a line plus the headers the gateway adds always fits in
        one NATS message (the server's max_payload, from its INFO)."""
        if self.line_cap < settings.max_line_bytes:
            log.info("line cap lowered to fit NATS's max_payload",
                     extra={"max_line_bytes": settings.max_line_bytes, "line_cap": self.line_cap,
                            "max_payload": nc.max_payload})
        self.pipeline = PublishPipeline(nc, settings.publish_ack_timeout_s)
        """Every frame's publish and acknowledgement, and the commands' replies, in one write a pass."""
        self.commands = CommandRelay(nc, settings.command_timeout_s, settings.max_pending_commands, self.counts,
                                     self.pipeline.post)
        self.intake = FrameIntake(nc, self.js, settings, self.boards, self.links, self.commands, self._spawn,
                                  self.counts, self.pipeline)
        self.tls = (ReloadingServerContext(settings.shard_tls_cert, settings.shard_tls_key, settings.shard_tls_ca,
                                           what="shard listener") if settings.shard_tls_cert else None)
        """The shard listener's TLS (docs/gateway.md, "TLS"), None for plain TCP: a bad file stops the start."""
        self.connections = Connections(nc, settings, self.line_cap, self.links, self.intake,
                                       self.commands, self._spawn, self.counts, self.tls)

    @property
    def publishers(self) -> dict[str, ShardPublisher]:
        """Each shard's publisher (they outlive connections)."""
        return self.intake.publishers

    async def start(self) -> None:
        """Declare the streams and the boards' buckets, and answer board reads and news."""
        self.pipeline.fast_ingest = await declare_streams(self.nc, self.js, self.settings)
        await self.pipeline.start()
        await self.boards.declare()
        await self.boards.serve()

    def reload_tls(self) -> bool:
        """Load the listener's certificate, key and CA again (SIGHUP): the next connections get them."""
        return self.tls.reload("SIGHUP") if self.tls is not None else False

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        return {"status": HTTPStatus.OK, "shards": shards}

    async def stop(self) -> None:
        """Close every link, then let buffered frames reach JetStream."""
        await self.connections.detach_all("gateway stopping")
        await self.commands.stop()
        await self.intake.stop()
        await self.boards.stop()
        for task in list(self._tasks):
            task.cancel()


@dataclass
class Serving:
    """A gateway, and the listener shards dial it on."""

    gateway: Gateway
    server: asyncio.Server

    @property
    def addr(self) -> tuple[str, int] | None:
        """Host and port the listener is bound to (None once it is closed)."""
        if not self.server.sockets:
            return None
        host, port = self.server.sockets[0].getsockname()[:2]
        return host, port


@asynccontextmanager
async def serve(nc: Client, settings: GatewaySettings) -> AsyncIterator[Serving]:
    """Run a gateway on ``nc``: its streams, buckets and board plane, then the listener shards
    dial (``shard_host``:``shard_port``, 0 picks a free port). On leaving, the listener closes,
    then every link, and buffered frames are given their moment to reach JetStream."""
    gateway = Gateway(nc, settings)
    server: asyncio.Server | None = None
    try:
        await gateway.start()
        if gateway.tls is not None:  # each accepted socket handed to the gateway's own handshake (handshake.py)
            connections = gateway.connections
            server = await asyncio.get_running_loop().create_server(
                lambda: TLSHandoff(connections.take_tls), settings.shard_host, settings.shard_port)
        else:
            server = await asyncio.start_server(gateway.connections.handle, settings.shard_host,
                                                settings.shard_port, limit=gateway.line_cap + 1)
        host, port = server.sockets[0].getsockname()[:2]
        log.info("listening for shards", extra={"addr": f"{host}:{port}", "tls": gateway.tls is not None,
                                                "client_certificates": bool(settings.shard_tls_ca)})
        yield Serving(gateway, server)
    finally:
        if server is not None:
            server.close()
        await gateway.stop()
