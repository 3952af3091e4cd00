"""Fault: one nats-server of a three-node cluster is killed (SIGKILL) while a simulated shard
sends frames through a real gateway process and a caller keeps sending it commands. Every
frame the gateway acknowledged is in JetStream (R3 streams), none twice; commands are
answered again within seconds."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import nats
import pytest

from shardbus import embedded
from simulator.shard import ShardSimulator
from tests.faults.harness import TOKEN, Tally, finish_and_count, keep_commanding, send_frames, \
    wait_commands_answered
from tests.processes import ServiceProcesses

pytestmark = pytest.mark.faults

FRAMES = 3000
"""Frames the shard sends (6 s at 500 frames/s, the issue's realistic shard load)."""

RATE = 500.0
"""Frames per second."""

RESUME_WITHIN_S = 5.0
"""Longest acceptable pause between answered commands once the node is gone."""


@pytest.fixture
def cluster(tmp_path):
    """A durable three-node cluster of this test's own (never the shared server)."""
    nodes = embedded.start_nats_cluster(tmp_path / "cluster", 3, durable=True)
    try:
        yield nodes
    finally:
        nodes.stop()


def _node_holding_the_gateway(cluster) -> str:
    """The name of a node the gateway process is connected to (its monitoring ``/connz``)."""
    for node in cluster.nodes:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/connz", timeout=2) as reply:
            if any(c.get("name", "").startswith("shardbus-gateway") for c in json.load(reply)["connections"]):
                return node.name
    raise AssertionError("the gateway is connected to no node")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("victim_role", ["frames stream leader", "gateway's node"])
async def test_killing_one_nats_node_of_three_loses_no_acknowledged_frame(cluster, tmp_path, unique,
                                                                         victim_role):
    port = embedded.free_port()
    procs = ServiceProcesses(tmp_path, cluster.url)
    nc = await nats.connect(cluster.url.split(","), connect_timeout=5, max_reconnect_attempts=-1,
                            reconnect_time_wait=0.2)
    sim = ShardSimulator("127.0.0.1", port, f"nk{unique}", TOKEN)
    tally, stop = Tally(), asyncio.Event()
    try:
        procs.start("gateway", shard_token=TOKEN, shard_port=str(port), jetstream_replicas="3",
                    publish_ack_timeout_s="1", silence_timeout_s="60")
        await sim.connect()
        await wait_commands_answered(nc, sim.shard)
        commander = asyncio.create_task(keep_commanding(nc, sim.shard, tally, stop))
        sender = asyncio.create_task(send_frames(sim, tally, FRAMES, RATE))

        async with asyncio.timeout(20):
            while tally.sent < FRAMES // 3:
                await asyncio.sleep(0.01)
        # The two hardest nodes to lose: the one leading the frames stream (a new leader must
        # be elected before anything is stored) and the one the gateway is connected to (it
        # must reconnect to another while frames are in flight).
        if victim_role == "frames stream leader":
            leader = (await nc.jetstream().stream_info("SHARD_FRAMES")).cluster.leader
        else:
            leader = _node_holding_the_gateway(cluster)
        victim = next(node for node in cluster.nodes if node.name == leader)
        victim.kill()
        killed_at = time.monotonic()

        await finish_and_count(nc, sim, tally, sender, commander, stop, FRAMES, ack_timeout=30)
        gap = tally.longest_gap_after(killed_at)
        print(f"\n{tally.line(f'NATS node {leader} of 3 killed ({victim_role})')}; "
              f"longest command pause {gap:.2f} s")
    finally:
        stop.set()
        await sim.close()
        await nc.close()
        procs.stop_all()

    info_stream = f"({victim_role} {leader} killed)"
    assert tally.acknowledged == FRAMES, info_stream
    assert tally.lost == 0 and tally.duplicated == 0, tally.line(info_stream)
    assert tally.stored == FRAMES
    assert gap < RESUME_WITHIN_S, f"commands paused {gap:.2f} s after the node was killed"
