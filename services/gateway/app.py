"""Gateway wiring: the NATS broker, the gateway served on its connection (``gateway.serve``:
the JetStream streams, the boards, the TCP listener for shards), the status subject, health
and the AsyncAPI declarations."""

from __future__ import annotations

import asyncio
import gc
import signal
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import uvloop
from faststream import FastStream
from faststream.nats import NatsBroker

from services.gateway import asyncapi_schema as doc
from services.gateway import metrics
from services.gateway.gateway import Gateway, Serving, serve
from services.gateway.settings import GatewaySettings
from shared import logs, subjects
from shared.broker import make_app, make_broker
from shared.health import add_health
from shared.metrics import serve_metrics

LOOP_FACTORY = uvloop.new_event_loop
"""``shardbus run gateway`` runs on uvloop: with many shards every frame is its own turn of the
event loop, and uvloop's turns cost less (bench/gateway.py, docs/performance.md)."""


GC_THRESHOLDS = (10_000, 10, 100)
"""The collector's thresholds while the gateway serves (Python's defaults: 700, 10, 10)."""


@dataclass
class _Running:
    """The gateway while the app runs: :func:`serve` is entered after startup, left on shutdown."""

    stack: AsyncExitStack = field(default_factory=AsyncExitStack)
    gateway: Gateway | None = None
    """Set once serving; kept through the shutdown (``gateway.status`` answers until the end)."""
    serving: Serving | None = None
    """Set once serving; dropped as the shutdown begins (health stops naming the address)."""


def create_app(settings: GatewaySettings | None = None) -> FastStream:
    """The gateway as a FastStream app: run it with ``shardbus run gateway``."""
    settings = settings or GatewaySettings()
    logs.register_secret(settings.shard_token.get_secret_value())
    for token in settings.shard_tokens.values():
        logs.register_secret(token.get_secret_value())
    broker = make_broker(settings, "gateway")
    app = make_app(broker, "gateway")
    running = _Running()

    # No queue group: every replica answers with the shards it holds (use a request that
    # gathers several replies to see them all).
    @broker.subscriber(subjects.GATEWAY_STATUS)
    async def status() -> dict[str, Any]:
        gateway = running.gateway
        return gateway.status() if gateway else {"status": HTTPStatus.SERVICE_UNAVAILABLE,
                                                  "error": "gateway is starting"}

    @app.after_startup
    async def start_listener() -> None:
        running.stack = AsyncExitStack()
        serving = await running.stack.enter_async_context(serve(broker.connection, settings))
        running.gateway, running.serving = serving.gateway, serving
        if serving.gateway.tls is not None:  # a renewed certificate, without a restart (docs/gateway.md, "TLS")
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, serving.gateway.reload_tls)
        # Everything loaded so far (modules, FastStream, pydantic: most of the heap) lives as long
        # as the process: out of the collector's sight, a full collection no longer walks it.
        # And full collections are made rarer: each walks every shard's connection, buffers and
        # frames in flight (125-340 ms with 1,000 shards at 20 frames/s, every 1-2 s, each
        # collecting nothing; 80-90 ms every 2.6 s under 10,000 commands/s), stalling every
        # shard and command meanwhile. The gateway's garbage is freed by reference counting.
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)

    @app.on_shutdown
    async def stop_listener() -> None:
        running.serving = None
        await running.stack.aclose()

    def details() -> dict[str, object]:
        serving = running.serving
        addr = serving.addr if serving else None
        if serving is None or addr is None:
            return {}
        return {"shard_addr": f"{addr[0]}:{addr[1]}", "shards": sorted(serving.gateway.links)}

    add_health(app, broker, "gateway", settings, details)
    serve_metrics(app, broker, "gateway", settings, metrics.collector(lambda: running.gateway))
    document_shard_plane(app, broker, settings)
    return app


def document_shard_plane(app: FastStream, broker: NatsBroker, settings: GatewaySettings) -> None:
    """Put the subjects websites use into the AsyncAPI document (``make docs``).

    They are declared on a broker of their own that is only added to the document, never to
    the app: it is never connected or started, so declaring them subscribes to nothing. At
    runtime ``connections.py`` subscribes to a shard's commands only while that shard is connected,
    and ``board_store.py`` to board reads and news (docs/gateway.md)."""
    plane = NatsBroker(settings.nats_servers())  # same server as ``broker``: one server entry

    plane.publisher(subjects.frame("{shard}", "{kind}"), schema=doc.Frame,
                    title="shard.{shard}.frame.{kind}:Frame",
                    description="Every line a shard sends, verbatim, in arrival order (JetStream stream "
                                "SHARD_FRAMES; Nats-Msg-Id set). kind is the frame's kind.")
    plane.publisher(subjects.deadletter("{shard}"), schema=doc.DeadLetter,
                    title="shard.{shard}.deadletter:DeadLetter",
                    description="Lines that could not be frames, and board frames whose id is unusable, "
                                "verbatim (JetStream stream SHARD_DEADLETTER); header Shardbus-Reason says why.")

    @plane.subscriber(subjects.command("{shard}", "{verb}"),
                      description="Request/reply: a command to the shard, answered by the gateway replica "
                                  "holding its connection (none: NATS no responders, the 503). The shard "
                                  "receives the body with kind = verb and a fresh reqId.")
    async def command(body: doc.CommandRequest) -> None: ...

    @plane.subscriber(subjects.board("{shard}", "{name}"),
                      description="Request/reply (any replica): a whole board — guilds, market, houses, "
                                  "champions or news; the body is ignored. The buckets BOARD_<NAME> are "
                                  "there to watch.")
    async def board() -> None: ...

    @plane.subscriber(subjects.news_add("{shard}"),
                      description="Request/reply (any replica): add or replace a news item; the shard gets "
                                  "it as news.add (announce true now, false when replayed after a hello).")
    async def news_add(item: doc.NewsItem) -> None: ...

    app.schema = doc.RequestReplyAsyncAPI(broker, plane, replies={
        subjects.command("{shard}", "{verb}"): doc.CommandReply,
        subjects.board("{shard}", "{name}"): doc.BoardReply,
        subjects.news_add("{shard}"): doc.NewsReply,
    })
