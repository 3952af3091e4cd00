"""What the replica-kill scenarios share: ledger requests that are retried (same payload, so
the same idempotency key) when a replica dies under them; a workload that keeps creating
runs on a simulated shard, recording what they really hold there and ending them so that
cleanup gives it all back (and, for the NATS faults, :class:`RunLoad`: a ledger and two cleanup
replicas with that workload, checked afterwards); and what an installer test reads: who holds the site lock,
scratch left in the volume, whether ``installer.list`` is still answered."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.js.errors

from shared import subjects
from simulator.world import PLACES_AT_MOST
from tests.cleanup.conftest import Ledger, Shard, ask, start_cleanup, wait_for
from tests.cleanup.test_replicas import _all_clean, _populate
from tests.processes import ServiceProcesses

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
    answered: int = 0
    key_commands: bool = False
    """Give each shard command sent without an idempotency key one made of its subject and body:
    a first attempt delivered late (NATS buffers while reconnecting) and its resend are then
    one execution at the shard and a replay, not two executions."""

    async def request(self, subject: str, payload: bytes, timeout: float = ATTEMPT_S) -> nats.aio.msg.Msg:
        self.requests += 1
        self.in_flight += 1
        if self.in_flight >= self.busy_at:
            self.busy.set()
        if self.key_commands and ".cmd." in subject:
            body = json.loads(payload or b"{}")
            body.setdefault("idempotencyKey", hashlib.sha256(subject.encode() + payload).hexdigest()[:24])
            payload = json.dumps(body).encode()
        try:
            reply = await self._answered(subject, payload, timeout)
            self.answered += 1
            return reply
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

    async def none_reverting(self, ids: set[int]) -> bool:
        return not ids & await self.reverting()


RUN_LOAD_CLEANUP = {"sweep_period_s": "0.3", "claim_timeout_s": "3", "command_timeout_s": "2",
                    "ledger_timeout_s": "2", "max_attempts": "20"}
"""The cleanup replicas of :class:`RunLoad`: short periods, so giving back resumes within seconds.
Each sweep spends an attempt of a row whose give-back met "no responders" (the gateway still
reconnecting): at a 0.3 s period the default 3 would be spent in a second and the run left
``incomplete``, where a real period (30 s) spreads them over a minute."""


@dataclass
class RunLoad:
    """A ledger process (on ``database_url``), two cleanup replicas and a :class:`Workload` on a
    connected ``shard``, all over the NATS under test: runs keep being created, recorded and
    ended, and given back, while the fault happens. Every request is :class:`Retrying`."""

    answered: Retrying
    work: Workload
    runs: int
    producing: asyncio.Task | None = None
    consoles: list[dict] = field(default_factory=list)

    @classmethod
    async def start(cls, procs: ServiceProcesses, nc: nats.NATS, shard: Shard, database_url: str, prefix: str,
                    runs: int, every_s: float, creatures: int = 10, leases: int = 3) -> RunLoad:
        """Start the services (in a thread: the shard keeps answering) and the workload."""
        ledger = await asyncio.to_thread(procs.start, "ledger", database_url=database_url)
        for _ in range(2):
            await start_cleanup(procs, **RUN_LOAD_CLEANUP)
        answered = Retrying(nc, key_commands=True)
        work = Workload(Shard(answered, shard.gateway, shard.sim), Ledger(answered, ledger), prefix, creatures,
                        leases)
        load = cls(answered, work, runs)
        load.producing = asyncio.create_task(work.produce(runs, every_s))
        return load

    async def finish(self, timeout: float = 30.0) -> None:
        """Until every run is ended and its cleanup complete; then read their consoles."""
        await asyncio.wait_for(self.producing, timeout)
        try:
            await wait_for(lambda: _all_clean(self.answered, self.work.ended), "every run's cleanup complete",
                           timeout=timeout, every=0.3)
        except TimeoutError:
            left = [c for c in await self.work.consoles() if c["run"]["cleanupStatus"] != "complete"]
            seen = [(c["run"]["cleanupStatus"], c["counts"], {r["lastError"] for r in c["resources"]}) for c in left]
            raise AssertionError(f"{len(left)} runs' cleanup not complete after {timeout} s: {seen[:3]}") from None
        self.consoles = await self.work.consoles()

    async def cancel(self) -> None:
        if self.producing and not self.producing.done():
            self.producing.cancel()
            await asyncio.gather(self.producing, return_exceptions=True)

    @staticmethod
    async def tear_down(load: RunLoad | None, shard: Shard | None, nc: nats.NATS, procs: ServiceProcesses) -> None:
        """End a scenario with runs, whatever state it stopped in: the workload, the shard, the
        test's connection, then every process it started (the servers are the caller's)."""
        if load:
            await load.cancel()
        if shard:
            await shard.sim.close()
        await nc.close()
        procs.stop_all()

    def expected(self) -> dict[str, int]:
        """How many times each verb must have been executed at the shard; ``world.despawn`` by
        serial, since one command gives back a run's creatures together."""
        w = self.work
        spawns_per_run = -(-w.creatures // PLACES_AT_MOST)  # a shard places at most 30 per world.spawn
        return {"world.spawn": self.runs * spawns_per_run, "lease.apply": self.runs * w.leases,
                "world.despawn": self.runs * w.creatures, "lease.release": self.runs * w.leases}

    def executed(self) -> dict[str, int]:
        """What the shard executed, counted as :meth:`expected` counts it."""
        sim = self.work.shard.sim
        done = {verb: sim.executed[verb] for verb in self.expected()}
        done["world.despawn"] = sum(sim.world.despawned.values())
        return done

    def duplicated(self) -> int:
        executed = self.executed()
        return sum(max(0, executed[verb] - count) for verb, count in self.expected().items())

    def line(self) -> str:
        executed = self.executed()
        return (f"runs {len(self.work.ended)}, resources {self.runs * (self.work.creatures + self.work.leases)}, "
                f"executed {executed['world.despawn'] + executed['lease.release']} (despawn commands "
                f"{self.work.shard.sim.executed['world.despawn']}), duplicated {self.duplicated()}; requests "
                f"{self.answered.requests}, retried {self.answered.retried_ok} ({self.answered.failed} attempts "
                f"failed)")

    def check(self) -> None:
        """Every run ended and given back; each resource executed exactly once; nothing stuck."""
        sim, per_run = self.work.shard.sim, self.work.creatures + self.work.leases
        assert len(self.work.ended) == self.runs, self.line()
        assert self.answered.answered == self.answered.requests, self.line()
        assert self.executed() == self.expected(), self.line()
        assert max(sim.world.despawned.values(), default=1) == 1, self.line()
        assert not any(obj.present for obj in sim.world.objects.values()) and sim.world.holds == {}
        assert len(self.consoles) == self.runs
        for console in self.consoles:
            assert console["unresolved"] == 0 and console["counts"]["reverting"] == 0, console["counts"]
            assert console["counts"]["reverted"] == per_run, console["counts"]


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
