"""Seeded faults on real hosts (docs/reliability.md, "Hosts"; issue 36), each while careful
shards stream, then healed, each checked by the checker (``checker.py``): every acknowledged
frame stored once and in its shard's order, nothing dead-lettered, nothing left unacknowledged.

Every random choice — which node, when, how long — comes from the run's seed
(``nemesis.py``): ``SHARDBUS_HOSTS_SEED=<n> make test-hosts`` replays a run; a failure prints
the seed, the plan and every timed step.

Needs root (``make test-hosts``); skipped with the reason elsewhere, failed instead when
``SHARDBUS_REQUIRE_HOSTS=1``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hosts import nemesis as nemesis_lib
from tests.hosts.nemesis import NODE_NAMES, Schedule
from tests.hosts.net import Host, why_not_available
from tests.hosts.proxy import Proxied
from tests.hosts.scene import SECONDS, SHARD_NAMES, Scene, acked, leader, progress, run_scenario, wait_for

REASON = why_not_available()
if REASON is not None and os.environ.get("SHARDBUS_REQUIRE_HOSTS") == "1":
    pytest.fail(f"SHARDBUS_REQUIRE_HOSTS=1 but {REASON}", pytrace=False)
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""), pytest.mark.timeout(600)]

RECOVERED = 300
"""Frames acknowledged after a cut before it is held: the system has found its way around it."""

MOVED = 50
"""Frames of each shard of a gateway cut off acknowledged again (through the other) before the
cut is held: its shards have moved."""


def names(scene: Scene, hosts: list[Host]) -> str:
    """The hosts by what runs on them (``nats-2``, ``the gateway``)."""
    by_host = {n.host.name: n.name for n in scene.nodes} | {scene.gw_host.name: "the gateway"}
    return ", ".join(by_host.get(h.name, h.name) for h in hosts)


async def acknowledged_again(scene: Scene, before: int, timeout: float = 90.0) -> None:
    """Precondition of a hold: frames acknowledged again (``RECOVERED`` more than ``before``)."""
    assert scene.schedule is not None
    await wait_for(f"{RECOVERED} more frames acknowledged", lambda: acked(scene.progress) > before + RECOVERED,
                   timeout)
    scene.schedule.step(f"frames acknowledged again ({acked(scene.progress) - before} since the cut)")


@asynccontextmanager
async def partitioned(scene: Scene, host: Host, others: list[Host], said: str, healed: str,
                      during: str) -> AsyncIterator[int]:
    """``host`` cut from ``others`` for the body (the step says ``said``, where the gateway is and
    which node leads the frames stream), healed however it ends; the frames acknowledged
    meanwhile are a step and a note ("acknowledged during the ``during``"). Yields the count
    acknowledged before the cut."""
    assert scene.schedule is not None
    before = acked(scene.progress)
    scene.schedule.step(f"{said} (the gateway on {scene.gw_node.name}, frames stream led by {await leader(scene.nc)})")
    scene.hosts.cut(host, others)
    try:
        yield before
    finally:
        scene.hosts.heal(host)
        count = acked(scene.progress) - before
        scene.schedule.step(f"healed {healed} ({count} frames acknowledged during the {during})")
        scene.notes[f"acknowledged during the {during}"] = count


@pytest.mark.hosts_short
async def test_a_nats_node_isolated_from_everything_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """A node chosen by the seed — whether or not it leads ``SHARD_FRAMES`` (also chosen) or
    is the gateway's — cut from the other two nodes and from the gateway while shards stream;
    held until frames are acknowledged again, then for a seeded time; healed."""
    schedule = Schedule("NATS node isolated")
    leader_on = schedule.choice("frames stream led by", NODE_NAMES)
    victim = schedule.choice("node isolated", NODE_NAMES)
    after = schedule.seconds("cut after (s)", 0.0, 5.0)
    held = schedule.seconds("held after recovery (s)", 5.0, 15.0)
    gateway_on = schedule.choice("gateway on", NODE_NAMES)  # drawn last: earlier seeds' plans hold

    async def nemesis(scene: Scene) -> None:
        node = scene.node(victim)
        others = [n.host for n in scene.nodes if n is not node] + [scene.gw_host]
        await asyncio.sleep(after)
        async with partitioned(scene, node.host, others, f"cut {victim} from {names(scene, others)}", victim,
                               "partition") as before:
            await acknowledged_again(scene, before)
            await asyncio.sleep(held)

    await run_scenario(tmp_path, "NATS node isolated", nemesis, schedule=schedule,
                       gateway_on=gateway_on, leader_on=leader_on)


@pytest.mark.hosts_short
async def test_a_gateway_host_isolated_moves_its_shards_and_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """Two gateways on hosts of their own, the shards spread over both (shard ``i`` on gateway ``i``
    mod 2). A gateway chosen by the seed is cut from everything — the nodes, the other gateway, the
    shards' and the website's hosts — while shards stream: its shards hear nothing, drop the link,
    dial the other gateway and resend what was not acknowledged. Held until each of them is
    acknowledged again there, then for a seeded time; healed (the old gateway still holds their
    frames, and publishes them again once it is back: de-duplicated)."""
    schedule = Schedule("a gateway host isolated")
    leader_on = schedule.choice("frames stream led by", NODE_NAMES)
    victim = ("gateway 1", "gateway 2").index(schedule.choice("gateway isolated", ("gateway 1", "gateway 2")))
    after = schedule.seconds("cut after (s)", 0.0, 5.0)
    held = schedule.seconds("held after its shards moved (s)", 2.0, 8.0)
    gateway_on = schedule.choice("gateway on", NODE_NAMES)  # drawn last: earlier seeds' plans hold

    async def nemesis(scene: Scene) -> None:
        host = scene.gw_hosts[victim]
        others = [h for h in scene.hosts.hosts.values() if h is not host]
        theirs = [shard for k, shard in enumerate(SHARD_NAMES) if k % len(scene.gw_hosts) == victim]
        await asyncio.sleep(after)
        async with partitioned(scene, host, others, f"cut gateway {victim + 1} ({', '.join(theirs)}) from "
                               "everything", f"gateway {victim + 1}", "partition"):
            base = {shard: progress(scene.progress)[shard]["acked"] for shard in theirs}
            await wait_for(f"{', '.join(theirs)} acknowledged again, through the other gateway",
                           lambda: all(progress(scene.progress)[s]["acked"] > base[s] + MOVED for s in theirs), 90)
            schedule.step(f"{', '.join(theirs)} acknowledged again through the other gateway")
            await asyncio.sleep(held)

    await run_scenario(tmp_path, "a gateway host isolated", nemesis, schedule=schedule, gateways=2,
                       gateway_on=gateway_on, leader_on=leader_on)


async def watch_leader(scene: Scene, schedule: Schedule, seconds: float) -> list[str]:
    """Hold for ``seconds``, recording each change of the frames stream's leader as a step (as
    the test's connection sees it; "" when no leader answered). Returns the leaders seen."""
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        now = await leader(scene.nc)
        if not seen or now != seen[-1]:
            seen.append(now)
            schedule.step(f"frames stream led by {now or 'no node that answers'}")
        await asyncio.sleep(max(0.0, min(1.0, end - loop.time())))
    return seen


async def test_a_bridge_between_two_halves_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """The three nodes split so that the two ends each see only the middle node (chosen by the
    seed): nats-a ↔ middle ↔ nats-b, the ends not seeing each other (NATS routes do not relay,
    so each end misses the other's interest and raft votes). The gateway sees all three.
    Held for a seeded time while the leader is watched; healed."""
    schedule = Schedule("a bridge")
    leader_on = schedule.choice("frames stream led by", NODE_NAMES)
    middle = schedule.choice("middle node", NODE_NAMES)
    after = schedule.seconds("cut after (s)", 0.0, 5.0)
    held = schedule.seconds("held (s)", 10.0, 20.0)
    gateway_on = schedule.choice("gateway on", NODE_NAMES)  # drawn last: earlier seeds' plans hold

    async def nemesis(scene: Scene) -> None:
        one, other = (n for n in scene.nodes if n.name != middle)
        await asyncio.sleep(after)
        async with partitioned(scene, one.host, [other.host], f"cut {one.name} from {other.name}: only {middle} "
                               "sees both", f"{one.name} and {other.name}", "bridge"):
            await watch_leader(scene, schedule, held)

    await run_scenario(tmp_path, "a bridge", nemesis, schedule=schedule,
                       gateway_on=gateway_on, leader_on=leader_on)


async def test_a_pause_during_a_partition_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """During a partition chosen by the seed (the frames stream's leader cut from its peers, the
    gateway still reaching it; or a node cut from everything), a process chosen by the seed — a
    NATS node or the gateway — is stopped (SIGSTOP) for a few seconds, continued (SIGCONT);
    the partition is held a little longer, healed."""
    schedule = Schedule("a pause during a partition")
    leader_on = schedule.choice("frames stream led by", NODE_NAMES)
    partition = schedule.choice("partition", ("the leader cut from its peers", "a node cut from everything"))
    isolated = leader_on if partition.startswith("the leader") else schedule.choice("node isolated", NODE_NAMES)
    paused = schedule.choice("process paused", (*NODE_NAMES, "gateway"))
    after = schedule.seconds("cut after (s)", 0.0, 5.0)
    pause_after = schedule.seconds("paused after the cut (s)", 1.0, 4.0)
    pause_for = schedule.seconds("paused for (s)", 2.0, 8.0)
    held = schedule.seconds("held after the pause (s)", 2.0, 6.0)
    gateway_on = schedule.choice("gateway on", NODE_NAMES)  # drawn last: earlier seeds' plans hold

    async def nemesis(scene: Scene) -> None:
        node = scene.node(isolated)
        others = [n.host for n in scene.nodes if n is not node]
        if partition == "a node cut from everything":
            others.append(scene.gw_host)
        target = scene.gateway if paused == "gateway" else scene.node(paused).started
        assert target is not None
        await asyncio.sleep(after)
        async with partitioned(scene, node.host, others, f"cut {isolated} from {names(scene, others)}", isolated,
                               "partition"):
            await asyncio.sleep(pause_after)
            schedule.step(f"SIGSTOP {paused}")
            nemesis_lib.pause(target)
            try:
                await asyncio.sleep(pause_for)
            finally:
                nemesis_lib.resume(target)
                schedule.step(f"SIGCONT {paused}")
            await asyncio.sleep(held)

    await run_scenario(tmp_path, "a pause during a partition", nemesis, schedule=schedule,
                       gateway_on=gateway_on, leader_on=leader_on)


@pytest.mark.hosts_short
async def test_a_node_killed_and_restarted_during_a_partition_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """During a partition (a node chosen by the seed cut from everything), a node chosen by the
    seed — the isolated one or another, which leaves no majority until it is back — is killed
    (SIGKILL: only what it synced survives), down for a few seconds, started again on its store;
    once its monitoring port answers the partition is held a little longer, healed."""
    schedule = Schedule("a kill during a partition")
    leader_on = schedule.choice("frames stream led by", NODE_NAMES)
    isolated = schedule.choice("node isolated", NODE_NAMES)
    killed = schedule.choice("node killed", NODE_NAMES)
    after = schedule.seconds("cut after (s)", 0.0, 5.0)
    kill_after = schedule.seconds("killed after the cut (s)", 1.0, 4.0)
    down_for = schedule.seconds("down for (s)", 2.0, 8.0)
    held = schedule.seconds("held after the restart (s)", 2.0, 6.0)
    gateway_on = schedule.choice("gateway on", NODE_NAMES)  # drawn last: earlier seeds' plans hold

    async def nemesis(scene: Scene) -> None:
        assert scene.processes is not None
        node, victim = scene.node(isolated), scene.node(killed)
        others = [n.host for n in scene.nodes if n is not node] + [scene.gw_host]
        await asyncio.sleep(after)
        async with partitioned(scene, node.host, others, f"cut {isolated} from {names(scene, others)}", isolated,
                               "partition"):
            await asyncio.sleep(kill_after)
            code = nemesis_lib.kill(victim.started)
            schedule.step(f"SIGKILL {killed} (exit {code})")
            await asyncio.sleep(down_for)
            nemesis_lib.restart_node(scene.processes, victim)
            schedule.step(f"{killed} started again")
            await wait_for(f"{killed} answers on its monitoring port", lambda: nemesis_lib.up(victim), 60)
            schedule.step(f"{killed} answers")
            await asyncio.sleep(held)

    await run_scenario(tmp_path, "a kill during a partition", nemesis, schedule=schedule,
                       gateway_on=gateway_on, leader_on=leader_on)


@dataclass
class Fault:
    """One fault of a lossy link: at ``at_s`` (after frames flow), on ``link``."""

    at_s: float
    link: str
    kind: str
    """"delay" (every chunk held ``delay_s``, both ways, for ``lasting_s``), "stall" (nothing
    passed on for ``lasting_s``) or "drop" (every connection reset)."""
    delay_s: float = 0.0
    lasting_s: float = 0.0

    def __str__(self) -> str:
        what = {"delay": f"delay {self.delay_s * 1000:.0f} ms for {self.lasting_s} s",
                "stall": f"stall {self.lasting_s} s", "drop": "drop every connection"}[self.kind]
        return f"at {self.at_s} s, {self.link}: {what}"


def plan_faults(schedule: Schedule, links: list[str]) -> list[Fault]:
    """4-7 faults over the shards' 30 s, drawn in turn from the seed's generator; the plan
    records them in time order."""
    rng, faults = schedule.rng, []
    for _ in range(rng.randint(4, 7)):
        fault = Fault(round(rng.uniform(0.0, SECONDS - 5.0), 1), rng.choice(links),
                      rng.choice(("delay", "stall", "drop")))
        if fault.kind == "delay":
            fault.delay_s = rng.randint(5, 250) / 1000
            fault.lasting_s = round(rng.uniform(2.0, 8.0), 1)
        elif fault.kind == "stall":
            fault.lasting_s = round(rng.uniform(1.0, 8.0), 1)
        faults.append(fault)
    faults.sort(key=lambda f: f.at_s)
    schedule.choices["faults"] = [str(f) for f in faults]
    return faults


@pytest.mark.hosts_short
@pytest.mark.timeout(900)
async def test_a_lossy_link_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """A userspace TCP proxy (``proxy.py``; the kernel has no netem) on the gateway's links to
    the NATS nodes and/or on the shards' link to the gateway (the seed chooses), which at seeded
    moments adds delay, stalls for a few seconds or resets every connection; then calm. The
    careful shards must lose nothing: every frame they were acknowledged is stored once."""
    schedule = Schedule("a lossy link")
    placement = schedule.choice("proxied", (Proxied.NATS, Proxied.SHARDS, "both"))
    wiring = Proxied(nats=placement in (Proxied.NATS, "both"), shards=placement in (Proxied.SHARDS, "both"))
    faults = plan_faults(schedule, [Proxied.NATS, Proxied.SHARDS] if placement == "both" else [placement])
    gateway_on = schedule.choice("gateway on", NODE_NAMES)  # drawn last: earlier seeds' plans hold

    async def nemesis(scene: Scene) -> None:
        proxy = wiring.proxy
        assert proxy is not None
        for what in wiring.links():
            await wait_for(f"a connection open through {what}", lambda w=what: wiring.open(w) > 0, 30)  # type: ignore[misc]
        schedule.step(f"connections through the proxies: { {w: wiring.open(w) for w in wiring.links()} }")

        async def act(fault: Fault) -> None:
            await asyncio.sleep(fault.at_s)
            names_ = wiring.each(fault.link)
            if fault.kind == "drop":
                dropped = sum(proxy.drop(name) for name in names_)
                schedule.step(f"{fault.link}: reset {dropped} connections")
            elif fault.kind == "stall":
                for name in names_:
                    proxy.stall(name, fault.lasting_s)
                schedule.step(f"{fault.link}: stalled for {fault.lasting_s} s")
            else:
                for name in names_:
                    proxy.delay(name, fault.delay_s)
                schedule.step(f"{fault.link}: {fault.delay_s * 1000:.0f} ms delay for {fault.lasting_s} s")
                await asyncio.sleep(fault.lasting_s)
                # Overlapping delays: a later one that took over ends itself.
                ended = [name for name in names_ if proxy.links[name].delay_s == fault.delay_s]
                for name in ended:
                    proxy.delay(name, 0.0)
                if ended:
                    schedule.step(f"{fault.link}: {fault.delay_s * 1000:.0f} ms delay over")

        try:
            await asyncio.gather(*(act(f) for f in faults))
        finally:
            for name in proxy.links:
                proxy.calm(name)
            schedule.step("calm: no delay, no stall")

    await run_scenario(tmp_path, "a lossy link", nemesis, schedule=schedule, gateway_on=gateway_on, wiring=wiring)
