"""Conformance fixtures: the real in-process gateway (the gateway tests' fixtures), and a
scripted shard — a bare TCP client that says the seed's hello and answers each command with
exactly the answer a test gives it, so the seed's own answers reach the gateway verbatim,
without the simulator in between (a double must not agree with the gateway by construction)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from tests.gateway.conftest import INTEREST_SETTLE_S, TOKEN, gateway, shard_sims, start_gateway, wait_until

__all__ = ["gateway", "shard_sims", "start_gateway"]


class ScriptedShard:
    """A shard that answers every command line with ``answer(line)`` (None: stays silent)."""

    def __init__(self, shard: str) -> None:
        self.shard = shard
        self.lines: list[dict[str, Any]] = []
        self.answer: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda line: None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    async def connect(self, port: int, protocol: int = 7) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        hello = {"t": 1733000000000, "kind": "server.hello", "shard": self.shard, "protocol": protocol,
                 "token": TOKEN}
        await self.write(hello)
        self.task = asyncio.create_task(self._read())

    async def write(self, obj: dict[str, Any] | bytes) -> None:
        assert self.writer is not None
        data = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        self.writer.write(data)
        await self.writer.drain()

    async def _read(self) -> None:
        assert self.reader is not None
        while line := await self.reader.readline():
            message = json.loads(line)
            self.lines.append(message)
            if "reqId" in message:
                answer = self.answer(message)
                if answer is not None:
                    await self.write({"t": 1733000000001, **answer, "reqId": message["reqId"]})

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def scripted(gateway, unique) -> AsyncIterator[ScriptedShard]:
    """A scripted shard ``p<unique>`` connected to the in-process gateway."""
    shard = ScriptedShard(f"p{unique}")
    await shard.connect(gateway.port)
    await wait_until(lambda: shard.shard in gateway.gateway.links)
    await asyncio.sleep(INTEREST_SETTLE_S)
    try:
        yield shard
    finally:
        await shard.close()


ConnectScripted = Callable[..., Awaitable[ScriptedShard]]


@pytest.fixture
def gateway_port_for_cli(services) -> int:
    """A gateway process (not in this event loop, so a blocking CLI run can dial it): its port."""
    from tests.cleanup.conftest import gateway_addr

    process = services.start("gateway", shard_token=TOKEN, shard_port="0")
    return gateway_addr(process)[1]
