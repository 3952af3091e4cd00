"""Web door wiring: a FastStream app (health, ``shardbus.ping``, the NATS connection the routes
use) that serves the FastAPI app with uvicorn on a socket its replicas share."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import uvicorn
import uvloop
from faststream import FastStream

from services.web import metrics
from services.web.http_app import PROTOCOL_VERSION, build_http_app
from services.web.http_wire import DoorHttp
from services.web.settings import WebSettings
from services.web.uvicorn_internals import QuietServer, ask_to_stop
from shared.broker import make_app, make_broker
from shared.health import add_health
from shared.metrics import serve_metrics

log = logging.getLogger("shardbus.web")

LOOP_FACTORY = uvloop.new_event_loop
"""``shardbus run web`` runs the door on uvloop (measured in bench/web.py, docs/performance.md)."""

STOP_GRACE_S = 4.0
"""How long open HTTP requests and feeds get to finish when the door stops."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket that other replicas on this host may bind too (SO_REUSEPORT:
    the kernel spreads connections over them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and without it every response waited out the client's delayed ACK (44 ms measured).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def create_app(settings: WebSettings | None = None) -> FastStream:
    """The door as a FastStream app: run it with ``shardbus run web``."""
    settings = settings or WebSettings()
    # uvicorn's own INFO lines ("Started server process", "Shutting down") repeat what the door
    # logs once in its own words; its warnings (a malformed request) still show.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    broker = make_broker(settings, "web")
    app = make_app(broker, "web")
    http = build_http_app(settings)
    requests = metrics.RequestCounts()
    http.add_middleware(metrics.RequestMeter, counts=requests)
    serve_metrics(app, broker, "web", settings, metrics.collector(requests, lambda: getattr(http.state, "feed", None)))
    state: dict[str, Any] = {}
    add_health(app, broker, "web", settings,
               details=lambda: {"url": state.get("url"), "protocol": PROTOCOL_VERSION})

    @app.after_startup
    async def serve_http() -> None:
        http.state.nc = broker.connection
        sock = listen_socket(settings.web_host, settings.web_port)
        host, port = sock.getsockname()[:2]
        scheme = "https" if settings.web_tls_cert else "http"
        state["url"] = f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}"
        config = uvicorn.Config(http, log_config=None, access_log=False, lifespan="off", http=DoorHttp,
                                # uvicorn annotates this int, but only passes it to asyncio.wait_for (seconds, a float)
                                timeout_graceful_shutdown=STOP_GRACE_S,  # type: ignore[arg-type]
                                ws_max_size=1024 * 1024,
                                ws_ping_interval=20.0, ws_ping_timeout=20.0,
                                # Feed events are small JSON: compressing each one cost a third of
                                # the feed's CPU for little (bench/web_feed.py, docs/performance.md).
                                ws_per_message_deflate=False,
                                # HTTPS when given a certificate (docs/security.md, "TLS"); the
                                # console's cookie is Secure then (request.url.scheme).
                                ssl_certfile=settings.web_tls_cert or None, ssl_keyfile=settings.web_tls_key or None)
        server = QuietServer(config)
        state["server"] = server
        state["task"] = asyncio.create_task(server.serve(sockets=[sock]))
        log.info("web door listening", extra={"url": state["url"], "protocol": PROTOCOL_VERSION})

    @app.on_shutdown
    async def stop_http() -> None:
        server: QuietServer | None = state.get("server")
        if server is None:
            return
        if (hub := getattr(http.state, "feed", None)) is not None:
            hub.stop()  # feeds end first, with a reason (WebSocket 1001, SSE "dropped"): not cut at the grace's end
        ask_to_stop(server)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(state["task"], STOP_GRACE_S + 2)

    return app
