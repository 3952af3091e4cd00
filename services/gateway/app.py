"""Gateway wiring: the NATS broker, the JetStream stream, and the TCP listener for shards."""

from __future__ import annotations

import asyncio
import json
import logging

from faststream import FastStream
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError

from services.gateway.settings import GatewaySettings
from services.gateway.wire import HelloRefused, LineTooLong, check_hello, read_line
from shared import logs, subjects
from shared.broker import add_health, make_app, make_broker

log = logging.getLogger("shardbus.gateway")


def create_app(settings: GatewaySettings | None = None) -> FastStream:
    """The gateway as a FastStream app: run it with ``shardbus run gateway``."""
    settings = settings or GatewaySettings()
    logs.register_secret(settings.shard_token.get_secret_value())
    broker = make_broker(settings, "gateway")
    app = make_app(broker, "gateway")
    state: dict[str, asyncio.AbstractServer] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        js = broker.connection.jetstream()
        try:
            first = await asyncio.wait_for(read_line(reader, settings.max_line_bytes),
                                           settings.hello_timeout_s)
            if first is None:
                return
            hello = check_hello(first, settings.shard_token.get_secret_value())
            log.info("shard connected", extra={"shard": hello.shard, "peer": str(peer)})
            await js.publish(subjects.frame(hello.shard, "server.hello"), first)
            while (line := await read_line(reader, settings.max_line_bytes)) is not None:
                kind = json.loads(line).get("kind")
                await js.publish(subjects.frame(hello.shard, kind), line)
        except HelloRefused as exc:
            log.warning("hello refused", extra={"peer": str(peer), "reason": str(exc)})
        except (LineTooLong, TimeoutError, ConnectionError) as exc:
            log.warning("connection closed", extra={"peer": str(peer), "reason": str(exc)})
        finally:
            writer.close()

    @app.after_startup
    async def start_listener() -> None:
        js = broker.connection.jetstream()
        config = StreamConfig(name=settings.frames_stream, subjects=[subjects.FRAMES_WILDCARD])
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)
        server = await asyncio.start_server(handle, settings.shard_host, settings.shard_port,
                                            limit=settings.max_line_bytes + 1)
        state["server"] = server
        host, port = server.sockets[0].getsockname()[:2]
        log.info("listening for shards", extra={"addr": f"{host}:{port}"})

    @app.on_shutdown
    async def stop_listener() -> None:
        if server := state.pop("server", None):
            server.close()

    def details() -> dict[str, object]:
        server = state.get("server")
        if server is None or not server.sockets:
            return {}
        host, port = server.sockets[0].getsockname()[:2]
        return {"shard_addr": f"{host}:{port}"}

    add_health(app, broker, "gateway", settings, details)
    return app
