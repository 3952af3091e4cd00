"""Gateway fixtures: a gateway running in the test's own event loop against the real
nats-server (fast to start, and its state is inspectable), and shard simulators dialling it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import nats
import pytest

from services.gateway.gateway import Gateway, Serving, serve
from services.gateway.settings import GatewaySettings
from simulator.shard import ShardSimulator

TOKEN = "gateway-test-token-5678"
"""The shard token every test gateway is configured with."""

INTEREST_SETTLE_S = 0.05
"""Pause after a new subscription before another connection publishes to it. Measured: even
after SUB and a flush (PING/PONG), about 1 in 100 messages published at once by another
connection were not delivered (nats-server 2.9 and 2.15); 20 ms later none were."""


@dataclass
class RunningGateway:
    """A gateway serving on a free port (:func:`services.gateway.gateway.serve`, as the service
    runs it), and its NATS connection."""

    serving: Serving
    nc: nats.NATS
    settings: GatewaySettings
    stack: AsyncExitStack

    @property
    def gateway(self) -> Gateway:
        return self.serving.gateway

    @property
    def server(self) -> asyncio.Server:
        return self.serving.server

    @property
    def port(self) -> int:
        addr = self.serving.addr
        assert addr is not None, "the gateway's listener is closed"
        return addr[1]

    async def stop(self) -> None:
        await self.stack.aclose()
        await self.nc.close()


StartGateway = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def start_gateway(nats_url: str) -> AsyncIterator[StartGateway]:
    """Start in-process gateways with settings overrides; all are stopped after the test."""
    started: list[RunningGateway] = []

    async def start(nats_servers: str | None = None, **overrides: Any) -> RunningGateway:
        settings = GatewaySettings(nats_url=nats_servers or nats_url, shard_token=TOKEN,
                                   **{"shard_host": "127.0.0.1", "shard_port": 0, **overrides})
        nc = await nats.connect(settings.nats_servers(), connect_timeout=5,
                                max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        stack = AsyncExitStack()
        try:
            serving = await stack.enter_async_context(serve(nc, settings))
        except BaseException:
            await nc.close()
            raise
        running = RunningGateway(serving, nc, settings, stack)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.stop()


@pytest.fixture
async def gateway(start_gateway: StartGateway) -> RunningGateway:
    """One in-process gateway with the default settings."""
    return await start_gateway()


@pytest.fixture
async def shard_sims() -> AsyncIterator[Callable[..., Awaitable[ShardSimulator]]]:
    """Connect shard simulators (``await shard_sims(gateway, shard_id)``); all closed after."""
    sims: list[ShardSimulator] = []

    async def connect(running: RunningGateway, shard: str, *, token: str = TOKEN,
                      **options: Any) -> ShardSimulator:
        sim = ShardSimulator("127.0.0.1", running.port, shard, token, **options)
        sims.append(sim)
        await sim.connect()
        await wait_until(lambda: shard in running.gateway.links)
        await asyncio.sleep(INTEREST_SETTLE_S)  # the gateway's command subscription, seen by the server
        return sim

    yield connect
    for sim in sims:
        await sim.close()


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``condition`` until true; TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def stored_in_stream(nc: nats.NATS, stream: str) -> list[Any]:
    """The ``"i"`` of every message in ``stream``, in the stream's order (read to its end: no
    message for 1 s)."""
    sub = await nc.jetstream().subscribe("", stream=stream, ordered_consumer=True)
    found = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1)
            except TimeoutError:
                return found
            found.append(json.loads(msg.data)["i"])
    finally:
        await sub.unsubscribe()


async def collect(nc: nats.NATS, subject: str, count: int, timeout: float = 10.0,
                  start: Callable[[], Awaitable[None]] | None = None) -> list[Any]:
    """Subscribe to ``subject`` (core NATS), run ``start``, return the first ``count`` messages."""
    got: list[Any] = []
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        got.append(msg)
        if len(got) >= count:
            done.set()

    sub = await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    await asyncio.sleep(INTEREST_SETTLE_S)
    try:
        if start:
            await start()
        try:
            await asyncio.wait_for(done.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"{subject}: {len(got)} of {count} messages within {timeout} s") from None
    finally:
        await sub.unsubscribe()
    return got[:count]


async def refused(running, shard: str, token: str) -> bool:
    """True when the gateway closes a connection saying hello with ``token``."""
    sim = ShardSimulator("127.0.0.1", running.port, shard, token)
    try:
        await sim.connect()
        await asyncio.wait_for(sim.disconnected.wait(), 5)
        return shard not in running.gateway.links
    finally:
        await sim.close()
