"""Fault: one of two gateway replicas is killed (SIGKILL) while its shard sends frames and a
caller sends it commands. The shard dials the other replica and resends what was not yet
acknowledged; JetStream de-duplicates by message id, so every frame is stored exactly once,
and commands reach the shard again through the other replica within seconds."""

from __future__ import annotations

import asyncio
import signal
import time

import nats
import pytest

from shardbus import embedded
from simulator.shard import ShardSimulator
from tests.faults.harness import (
    TOKEN,
    Tally,
    finish_and_count,
    follow,
    keep_commanding,
    send_frames,
    wait_commands_answered,
)
from tests.faults.shard_traffic import ShardTraffic
from tests.processes import ServiceProcesses

pytestmark = pytest.mark.faults

FRAMES = 3000
"""Frames the shard sends (6 s at 500 frames/s)."""

RATE = 500.0
"""Frames per second."""

RESUME_WITHIN_S = 5.0
"""Longest acceptable pause between answered commands once the replica is gone."""


@pytest.mark.timeout(180)
async def test_sigkill_of_a_gateway_replica_loses_no_frame(nats_url, tmp_path, unique):
    ports = [embedded.free_port(), embedded.free_port()]
    procs = ServiceProcesses(tmp_path, nats_url)
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    # Sequenced: the shard keeps each frame until the gateway acknowledges it, and resends the
    # unacknowledged ones to the replica it dials next (the optional acknowledgement, docs/gateway.md, "Frames").
    sim = ShardSimulator("127.0.0.1", ports[0], f"gk{unique}", TOKEN, sequenced=True)
    tally, stop = Tally(), asyncio.Event()
    follower, traffic = None, None
    try:
        traffic = await ShardTraffic.start(procs)
        first, _second = [procs.start("gateway", shard_token=TOKEN, shard_port=str(port),
                                      publish_ack_timeout_s="1", silence_timeout_s="60") for port in ports]
        await sim.connect()
        await wait_commands_answered(nc, sim.shard)
        follower = asyncio.create_task(follow(sim, ports, stop))
        commander = asyncio.create_task(keep_commanding(nc, sim.shard, tally, stop))
        sender = asyncio.create_task(send_frames(sim, tally, FRAMES, RATE))

        # Killed once a third is sent and while the shard holds frames the replica has not
        # acknowledged (nothing awaited between the look and the kill): those are resent to the other.
        async with asyncio.timeout(20):
            while tally.sent < FRAMES // 3 or not sim.unacked:
                await asyncio.sleep(0.01)
        unacked_at_kill = len(sim.unacked)
        procs.stop(first, signal.SIGKILL)
        killed_at = time.monotonic()

        await finish_and_count(nc, sim, tally, sender, commander, stop, FRAMES, ack_timeout=30)
        gap = tally.longest_gap_after(killed_at)
        await traffic.finish(nc)
        print("\n" + tally.line("gateway replica 1 of 2 SIGKILLed") + f"; longest command pause {gap:.2f} s; "
              f"{unacked_at_kill} frames unacknowledged at the kill; " + traffic.line())
    finally:
        stop.set()
        sim.disconnected.set()  # let the follower see stop
        if follower:
            await asyncio.wait_for(asyncio.gather(follower, return_exceptions=True), 5)
        await sim.close()
        await nc.close()
        if traffic:
            traffic.stop()
        procs.stop_all()

    assert sim.port == ports[1], "the shard should be on the surviving replica"
    assert tally.acknowledged == FRAMES
    assert tally.lost == 0 and tally.duplicated == 0, tally.line("gateway replica killed")
    assert tally.stored == FRAMES
    assert gap < RESUME_WITHIN_S, f"commands paused {gap:.2f} s after the replica was killed"
    traffic.check()
