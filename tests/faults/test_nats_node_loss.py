"""Fault: one nats-server of a three-node cluster is killed (SIGKILL) while a simulated shard
sends frames through a real gateway process, a caller keeps sending it commands, and runs
keep being created on it, recorded in the ledger, ended and given back by two cleanup
replicas (all services on the cluster's URLs, so they reconnect to a surviving node). Every
frame the gateway acknowledged is in JetStream (R3 streams), none twice; commands are
answered again within seconds; every resource is given back exactly once."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import nats
import pytest

from shardbus import embedded
from tests.cleanup.conftest import connect_shard
from tests.faults.harness import Tally, finish_and_count, keep_commanding, send_frames
from tests.faults.shard_traffic import ShardTraffic
from tests.faults.workload import RunLoad
from tests.processes import ServiceProcesses

pytestmark = pytest.mark.faults

FRAMES = 3000
"""Frames the shard sends (6 s at 500 frames/s, the issue's realistic shard load)."""

RATE = 500.0
"""Frames per second."""

RESUME_WITHIN_S = 5.0
"""Longest acceptable pause between answered commands once the node is gone."""

RUNS, EVERY_S = 24, 0.3
"""Runs the workload creates, records and ends, one every 0.3 s (7 s, so across the kill)."""


@pytest.fixture
def cluster(tmp_path):
    """A durable three-node cluster of this test's own (never the shared server)."""
    nodes = embedded.start_nats_cluster(tmp_path / "cluster", 3, durable=True)
    try:
        yield nodes
    finally:
        nodes.stop()


def _services_on(node) -> list[str]:
    """The services connected to ``node`` (its monitoring ``/connz``), e.g. ``["cleanup", "gateway"]``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/connz", timeout=2) as reply:
        names = [c.get("name", "") for c in json.load(reply)["connections"]]
    return sorted(name.removeprefix("shardbus-").split("@")[0] for name in names if name.startswith("shardbus-"))


def _node_holding(cluster, service: str) -> str:
    """The name of a node ``service`` is connected to."""
    for node in cluster.nodes:
        if service in _services_on(node):
            return node.name
    raise AssertionError(f"the {service} is connected to no node")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim_role", ["frames stream leader", "gateway's node", "ledger's node"])
async def test_killing_one_nats_node_of_three_loses_no_acknowledged_frame_nor_gives_back_twice(
        cluster, tmp_path, database_url, unique, victim_role):
    procs = ServiceProcesses(tmp_path, cluster.url)
    nc = await nats.connect(cluster.url.split(","), connect_timeout=5, max_reconnect_attempts=-1,
                            reconnect_time_wait=0.2)
    tally, stop, shard, load, traffic = Tally(), asyncio.Event(), None, None, None
    try:
        traffic = await ShardTraffic.start(procs, jetstream_replicas="3")
        shard = await connect_shard(nc, procs, f"nk{unique}", sequenced=True, jetstream_replicas="3",
                                    publish_ack_timeout_s="1", silence_timeout_s="60")
        sim = shard.sim
        load = await RunLoad.start(procs, nc, shard, database_url, f"w{unique}", RUNS, EVERY_S)
        commander = asyncio.create_task(keep_commanding(nc, sim.shard, tally, stop))
        sender = asyncio.create_task(send_frames(sim, tally, FRAMES, RATE))

        async with asyncio.timeout(20):
            while tally.sent < FRAMES // 3:
                await asyncio.sleep(0.01)
        # The hardest nodes to lose: the one leading the frames stream (a new leader must be
        # elected before anything is stored), the one the gateway is connected to (it must
        # reconnect to another while frames are in flight) and the ledger's (every run's
        # requests wait for it to reconnect). Cleanup replicas are on whichever node they drew.
        if victim_role == "frames stream leader":
            leader = (await nc.jetstream().stream_info("SHARD_FRAMES")).cluster.leader
        else:
            leader = _node_holding(cluster, victim_role.split("'")[0])
        victim = next(node for node in cluster.nodes if node.name == leader)
        on_victim = _services_on(victim)
        victim.kill()
        killed_at = time.monotonic()

        await finish_and_count(nc, sim, tally, sender, commander, stop, FRAMES, ack_timeout=30)
        gap = tally.longest_gap_after(killed_at)
        await load.finish()
        await traffic.finish(nc)
        print(f"\n{tally.line(f'NATS node {leader} of 3 killed ({victim_role})')}; "
              f"longest command pause {gap:.2f} s; {load.line()}; services on the killed node {on_victim}; "
              f"{traffic.line()}")
    finally:
        stop.set()
        if traffic:
            traffic.stop()
        await RunLoad.tear_down(load, shard, nc, procs)

    info_stream = f"({victim_role} {leader} killed)"
    assert tally.acknowledged == FRAMES, info_stream
    assert tally.lost == 0 and tally.duplicated == 0, tally.line(info_stream)
    assert tally.stored == FRAMES
    assert gap < RESUME_WITHIN_S, f"commands paused {gap:.2f} s after the node was killed"
    load.check()
    traffic.check()
