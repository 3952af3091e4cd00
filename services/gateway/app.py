"""Gateway wiring: the NATS broker, the JetStream streams, the TCP listener for shards,
the status subject and the boards."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from faststream import FastStream

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
                                            limit=settings.max_line_bytes + 1)
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
    return app
