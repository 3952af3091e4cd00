"""Gateway wiring: the NATS broker, the JetStream streams, the TCP listener for shards,
the status subject and the boards."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker

from services.gateway import asyncapi_schema as doc
from services.gateway.links import Gateway
from services.gateway.settings import GatewaySettings
from shared import logs, subjects
from shared.broker import add_health, make_app, make_broker

log = logging.getLogger("shardbus.gateway")


def create_app(settings: GatewaySettings | None = None) -> FastStream:
    """The gateway as a FastStream app: run it with ``shardbus run gateway``."""
    settings = settings or GatewaySettings()
    logs.register_secret(settings.shard_token.get_secret_value())
    for token in settings.shard_tokens.values():
        logs.register_secret(token.get_secret_value())
    broker = make_broker(settings, "gateway")
    app = make_app(broker, "gateway")
    state: dict[str, Any] = {}

    # No queue group: every replica answers with the shards it holds (use a request that
    # gathers several replies to see them all).
    @broker.subscriber(subjects.GATEWAY_STATUS)
    async def status() -> dict[str, Any]:
        gateway: Gateway | None = state.get("gateway")
        return gateway.status() if gateway else {"status": 503, "error": "gateway is starting"}

    @app.after_startup
    async def start_listener() -> None:
        gateway = Gateway(broker.connection, settings)
        await gateway.start()
        state["gateway"] = gateway
        server = await asyncio.start_server(gateway.handle, settings.shard_host, settings.shard_port,
                                            limit=gateway.line_cap + 1)
        state["server"] = server
        host, port = server.sockets[0].getsockname()[:2]
        log.info("listening for shards", extra={"addr": f"{host}:{port}"})

    @app.on_shutdown
    async def stop_listener() -> None:
        if server := state.pop("server", None):
            server.close()
        if gateway := state.get("gateway"):
            await gateway.stop()

    def details() -> dict[str, object]:
        server = state.get("server")
        if server is None or not server.sockets:
            return {}
        host, port = server.sockets[0].getsockname()[:2]
        gateway: Gateway | None = state.get("gateway")
        return {"shard_addr": f"{host}:{port}", "shards": sorted(gateway.links) if gateway else []}

    add_health(app, broker, "gateway", settings, details)
    document_shard_plane(app, broker, settings)
    return app


def document_shard_plane(app: FastStream, broker: NatsBroker, settings: GatewaySettings) -> None:
    """Put the subjects websites use into the AsyncAPI document (``make docs``).

    They are declared on a broker of their own that is only added to the document, never to
    the app: it is never connected or started, so declaring them subscribes to nothing. At
    runtime ``links.py`` subscribes to a shard's commands only while that shard is connected,
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
