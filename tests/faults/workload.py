"""What the replica-kill scenarios share: ledger requests that are retried (same payload, so
the same idempotency key) when a replica dies under them; a workload that keeps creating
runs on a simulated shard, recording what they really hold there and ending them so that
cleanup gives it all back; and what an installer test reads: who holds the site lock,
scratch left in the volume, whether ``installer.list`` is still answered."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.js.errors

from shared import subjects
from tests.cleanup.conftest import Ledger, Shard, ask
from tests.cleanup.test_replicas import _populate

ATTEMPT_S = 2.0
"""How long one attempt of a ledger request may take before it is counted failed and retried."""

GIVE_UP_S = 30.0
"""How long a request keeps being retried before the scenario fails."""


@dataclass
class Retrying:
    """Stands in for a nats-py client in :class:`Ledger`: a request in flight when its replica
    dies (timeout, no responders, 503) is sent again as it was, and counted."""

    nc: nats.NATS
    busy_at: int = 16
    """``busy`` is set whenever this many requests are in flight at once (a kill then hits some)."""
    busy: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    requests: int = 0
    failed: int = 0
    retried_ok: int = 0
    recovered_times: list[float] = field(default_factory=list)
    """When each request that had failed was answered on a retry."""

    async def request(self, subject: str, payload: bytes, timeout: float = ATTEMPT_S) -> nats.aio.msg.Msg:
        self.requests += 1
        self.in_flight += 1
        if self.in_flight >= self.busy_at:
            self.busy.set()
        try:
            return await self._answered(subject, payload, timeout)
        finally:
            self.in_flight -= 1

    async def _answered(self, subject: str, payload: bytes, timeout: float) -> nats.aio.msg.Msg:
        deadline, failures = time.monotonic() + GIVE_UP_S, 0
        while True:
            try:
                msg = await self.nc.request(subject, payload, timeout=min(timeout, ATTEMPT_S))
                if json.loads(msg.data).get("status") != 503:
                    if failures:
                        self.retried_ok += 1
                        self.recovered_times.append(time.monotonic())
                    return msg
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                pass
            failures += 1
            self.failed += 1
            assert time.monotonic() < deadline, f"{subject} unanswered for {GIVE_UP_S} s"
            await asyncio.sleep(0.1)


@dataclass
class Workload:
    """Runs on ``shard``, each holding ``creatures`` world objects and ``leases`` leases."""

    shard: Shard
    ledger: Ledger
    prefix: str
    creatures: int
    leases: int
    ended: list[str] = field(default_factory=list)

    async def one_run(self, index: int) -> None:
        run, = await _populate(self.shard, self.ledger, f"{self.prefix}-{index}", 1, self.creatures, self.leases)
        await self.ledger.end(run)
        self.ended.append(run)

    async def produce(self, runs: int, every_s: float) -> None:
        """Start a run every ``every_s`` (each one created, populated and ended in its own task)."""
        tasks = []
        for index in range(runs):
            tasks.append(asyncio.create_task(self.one_run(index)))
            await asyncio.sleep(every_s)
        await asyncio.gather(*tasks)

    async def wait_ended(self, count: int, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.ended) < count:
                await asyncio.sleep(0.05)

    async def consoles(self, runs: list[str] | None = None) -> list[dict]:
        return list(await asyncio.gather(*(self.ledger.console(run) for run in runs or list(self.ended))))

    async def reverting(self) -> set[int]:
        """The ids of the ended runs' rows that are being given back right now."""
        return {row["resourceId"] for console in await self.consoles()
                for row in console["resources"] if row["status"] == "reverting"}

    async def reverting_more_than(self, count: int) -> bool:
        return len(await self.reverting()) > count

    async def none_reverting(self, ids: set[int]) -> bool:
        return not ids & await self.reverting()


async def lock_holder(nc: nats.NATS, bucket: str, site: str) -> int | None:
    """The pid of the replica holding the site lock (its holder reads ``host:pid:nonce``)."""
    try:
        entry = await (await nc.jetstream().key_value(bucket)).get(f"site.{site}")
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.BucketNotFoundError):
        return None
    return int(json.loads(entry.value)["holder"].split(":")[1]) if entry.value else None


async def scratch(volume: Path) -> list[Path]:
    """The install scratch directories in ``volume`` (a coroutine, for ``wait_for``)."""
    return list(volume.glob(".install-*"))


async def keep_listing(nc: nats.NATS, seen: dict[str, int], stop: asyncio.Event) -> None:
    """Ask ``installer.list`` until ``stop``; count answers and failures (the other replica answers)."""
    while not stop.is_set():
        try:
            ok = (await ask(nc, subjects.INSTALLER_LIST, timeout=1.0))["status"] == 200
        except nats.errors.TimeoutError:
            ok = False
        seen["answered" if ok else "failed"] += 1
        await asyncio.sleep(0.05)
