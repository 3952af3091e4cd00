"""Fixtures of the cleanup tests: a real gateway process with the shard simulator dialled
into it over TCP, the real ledger process on a fresh database, and helpers to drive them
the way a website and a game module would (requests over NATS)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import nats
import pytest

from shared import subjects
from simulator.shard import ShardSimulator
from simulator.world import ShardWorld
from tests.processes import ServiceProcess, ServiceProcesses

TOKEN = "cleanup-test-token-5678"
"""The shard token every test gateway accepts."""

WAIT_S = 30.0
"""The longest any helper waits for something to happen."""


async def ask(nc: nats.NATS, subject: str, payload: dict[str, Any] | None = None, timeout: float = 10.0) -> dict:
    """One request, its decoded JSON reply."""
    msg = await nc.request(subject, json.dumps(payload or {}).encode(), timeout=timeout)
    return json.loads(msg.data)


async def ok(nc: nats.NATS, subject: str, payload: dict[str, Any] | None = None, timeout: float = 10.0) -> dict:
    """One request that must succeed (2xx); its reply."""
    reply = await ask(nc, subject, payload, timeout)
    assert 200 <= reply.get("status", 0) < 300, f"{subject} {payload} → {reply}"
    return reply


def gateway_addr(gateway: ServiceProcess) -> tuple[str, int]:
    """Where the gateway listens for shards (it logs it once listening)."""
    for line in gateway.log().splitlines():
        if '"listening for shards"' in line:
            host, port = json.loads(line)["addr"].rsplit(":", 1)
            return host, int(port)
    raise AssertionError(f"the gateway did not say where it listens:\n{gateway.log()[-2000:]}")


@dataclass
class Shard:
    """A gateway process with one simulated shard connected to it."""

    nc: nats.NATS
    gateway: ServiceProcess
    sim: ShardSimulator

    @property
    def id(self) -> str:
        return self.sim.shard

    @property
    def world(self) -> ShardWorld:
        return self.sim.world

    async def command(self, verb: str, body: dict[str, Any]) -> dict:
        """A command to the shard through the gateway: the gateway's reply."""
        return await ask(self.nc, f"shard.{self.id}.cmd.{verb}", body)


async def connect_shard(nc: nats.NATS, services: ServiceProcesses, shard: str, world: ShardWorld | None = None,
                        sequenced: bool = False, **gateway_settings: str) -> Shard:
    """Start a gateway, dial the simulator into it and wait until commands reach it (``sequenced``:
    the simulator numbers its frames and resends the unacknowledged ones after a reconnect)."""
    gateway = services.start("gateway", shard_token=TOKEN, shard_port="0", **gateway_settings)
    host, port = gateway_addr(gateway)
    sim = ShardSimulator(host, port, shard, TOKEN, world=world or ShardWorld(), sequenced=sequenced)
    await sim.connect()
    linked = Shard(nc, gateway, sim)
    async with asyncio.timeout(WAIT_S):
        while True:
            try:
                if (await linked.command("lease.list", {})).get("status") == 200:
                    return linked
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                pass
            await asyncio.sleep(0.05)


@pytest.fixture
async def shard(nc, services, unique) -> AsyncIterator[Shard]:
    """A gateway process and a simulated shard ``c<unique>`` connected to it."""
    async with shard_with(nc, services, f"c{unique}") as linked:
        yield linked


@contextlib.asynccontextmanager
async def shard_with(nc: nats.NATS, services: ServiceProcesses, shard: str,
                     world: ShardWorld | None = None) -> AsyncIterator[Shard]:
    """A gateway process with ``shard`` (its ``world``) connected; the simulator closed after."""
    linked = await connect_shard(nc, services, shard, world)
    try:
        yield linked
    finally:
        await linked.sim.close()


class Ledger:
    """Asks the real ledger process, as a game module and a website would."""

    def __init__(self, nc: nats.NATS, process: ServiceProcess) -> None:
        self.nc, self.process = nc, process

    async def run(self, run_id: str, shard: str, status: str = "running") -> dict:
        """Create run ``run_id`` on ``shard`` and walk it to ``status``."""
        reply = await ok(self.nc, subjects.LEDGER_RUN_CREATE, {"runId": run_id, "shard": shard, "event": "invasion"})
        for step in {"scheduled": [], "running": ["running"]}.get(status, ["running", status]):
            reply = await ok(self.nc, subjects.LEDGER_RUN_STATUS, {"runId": run_id, "status": step})
        return reply["run"]

    async def end(self, run_id: str, status: str = "cancelled") -> dict:
        """Move a run to a terminal status."""
        return (await ok(self.nc, subjects.LEDGER_RUN_STATUS, {"runId": run_id, "status": status}))["run"]

    async def record(self, run_id: str, kind: str, ref: str, *, module: str = "arena",
                     revert: dict[str, Any] | None = None) -> dict:
        """Record a confirmed resource; the row."""
        body = {"runId": run_id, "module": module, "kind": kind, "ref": ref,
                "idempotencyKey": f"{run_id}:{module}:{kind}:{ref}", "revert": revert or {}}
        return (await ok(self.nc, subjects.LEDGER_RESOURCE_RECORD, body))["resource"]

    async def record_many(self, rows: list[tuple[str, str, str, dict[str, Any] | None]], module: str = "arena",
                          in_flight: int = 64) -> None:
        """Record ``(runId, kind, ref, revert)`` rows, ``in_flight`` requests at a time."""
        gate = asyncio.Semaphore(in_flight)

        async def one(row: tuple[str, str, str, dict[str, Any] | None]) -> None:
            async with gate:
                await self.record(row[0], row[1], row[2], module=module, revert=row[3])

        await asyncio.gather(*(one(row) for row in rows))

    async def expire(self, module: str, kind: str, ref: str) -> int:
        """The owning module reports the game ended it at its deadline."""
        reply = await ok(self.nc, subjects.ledger_expired(module), {"kind": kind, "ref": ref})
        return reply["expired"]

    async def console(self, run_id: str) -> dict:
        """The run console."""
        return await ok(self.nc, subjects.LEDGER_CONSOLE, {"runId": run_id})

    async def statuses(self, run_id: str) -> dict[str, str]:
        """Each resource's ref → status, from the console."""
        return {row["ref"]: row["status"] for row in (await self.console(run_id))["resources"]}


@pytest.fixture
async def ledger(nc, services, database_url) -> AsyncIterator[Ledger]:
    """The real ledger process on a fresh database (stopped before the database is dropped)."""
    process = services.start("ledger", database_url=database_url)
    try:
        yield Ledger(nc, process)
    finally:
        services.stop(process)


async def start_cleanup(services: ServiceProcesses, **settings: Any) -> ServiceProcess:
    """A cleanup process; by default it sweeps only on request (a long period, after one at start).
    Waited for in a thread, so a simulated shard on this event loop keeps answering meanwhile."""
    options = {"sweep_period_s": "3600", "reconcile_period_s": "3600", "claim_timeout_s": "30",
               "command_timeout_s": "10"}
    options.update({key: str(value) for key, value in settings.items()})
    return await asyncio.to_thread(services.start, "cleanup", **options)


async def wait_for(check, what: str, timeout: float = WAIT_S, every: float = 0.1):
    """Call async ``check`` until it returns something truthy; that value."""
    async with asyncio.timeout(timeout):
        while not (result := await check()):
            await asyncio.sleep(every)
    assert result, what
    return result


async def shard_gone_from_gateway(nc: nats.NATS, shard: Shard) -> None:
    """Wait until no gateway names ``shard`` among its connected shards (after ``sim.drop()``)."""
    async def gone() -> bool:
        health = await ask(nc, subjects.health("gateway"))
        return shard.id not in health.get("shards", [shard.id])

    await wait_for(gone, "the gateway noticed the shard left", timeout=10)


async def shard_answers(shard: Shard) -> bool:
    """Whether ``shard`` answers a command again (a wait_for check after ``sim.connect()``)."""
    try:
        return (await shard.command("lease.list", {})).get("status") == 200
    except Exception:
        await asyncio.sleep(0.05)
        return False


class DespawnTally:
    """Every ``world.despawn`` the shard's world carried out (a replay from the shard's
    idempotency cache never reaches the world): the serials each one named."""

    def __init__(self, world: ShardWorld) -> None:
        self.commands: list[list[str]] = []
        inner = world._world_despawn

        def counting(body: dict[str, Any]) -> dict[str, Any]:
            self.commands.append(list(body.get("serials") or []))
            return inner(body)

        world._world_despawn = counting  # type: ignore[method-assign]

    def per_serial(self) -> Counter[str]:
        """How many executed despawns named each serial."""
        return Counter(serial for serials in self.commands for serial in serials)


async def listen(nc: nats.NATS, subject: str) -> list[dict[str, Any]]:
    """Every payload published on ``subject`` from now on (a listener beside the gateway: it sees
    each command as sent, and never answers)."""
    seen: list[dict[str, Any]] = []

    async def on(msg) -> None:
        seen.append(json.loads(msg.data))

    await nc.subscribe(subject, cb=on)
    await nc.flush()
    return seen
