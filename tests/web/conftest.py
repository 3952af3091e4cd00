"""Web door fixtures: the door served by uvicorn on a free port in the test's own event loop,
over real HTTP, with a real NATS behind it (and, for the sidecar routes, an in-process gateway
and shard simulators from tests/gateway)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import nats
import pytest
import uvicorn

from services.web.app import listen_socket
from services.web.http_app import build_http_app
from services.web.http_wire import DoorHttp
from services.web.settings import WebSettings
from services.web.uvicorn_internals import QuietServer, ask_to_stop
from tests.gateway.conftest import gateway, shard_sims, start_gateway  # noqa: F401 — fixtures

WEBSITE_TOKEN = "web-test-website-token-4821"
OPERATOR_TOKEN = "web-test-operator-token-9317"
MODULE_TOKENS = {"events": "web-test-module-events-2604", "quests": "web-test-module-quests-7730"}


@dataclass
class RunningDoor:
    """A door listening on a free port; ``client(token)`` is an httpx client for it."""

    url: str
    settings: WebSettings
    nc: nats.NATS
    app: Any

    @property
    def ws_url(self) -> str:
        return "ws" + self.url[len("http"):]

    def client(self, token: str | None = WEBSITE_TOKEN, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=15.0, **kwargs)


StartDoor = Callable[..., Awaitable[RunningDoor]]


@pytest.fixture
async def start_door(nats_url: str) -> AsyncIterator[StartDoor]:
    """Start in-process doors with settings overrides; all are stopped after the test."""
    started: list[tuple[QuietServer, asyncio.Task[None], nats.NATS]] = []

    async def start(**overrides: Any) -> RunningDoor:
        values: dict[str, Any] = {"nats_url": nats_url, "web_port": 0, "web_token": WEBSITE_TOKEN,
                                  "web_operator_token": OPERATOR_TOKEN,
                                  "web_module_tokens": MODULE_TOKENS, **overrides}
        settings = WebSettings(**values)
        nc = await nats.connect(settings.nats_servers(), connect_timeout=5,
                                max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        app = build_http_app(settings, nc)
        sock = listen_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        server = QuietServer(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", http=DoorHttp,
                                        timeout_graceful_shutdown=2))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        started.append((server, task, nc))
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        return RunningDoor(f"http://127.0.0.1:{port}", settings, nc, app)

    yield start
    for server, task, nc in started:
        ask_to_stop(server)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await nc.close()


@pytest.fixture
async def door(start_door: StartDoor) -> RunningDoor:
    """One door with the default test tokens and no default shard."""
    return await start_door()
