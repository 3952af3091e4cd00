"""Fault: the only nats-server is stopped for 10 s and started again (same port, same store)
while a simulated shard keeps sending frames through a real gateway process, and runs keep
being created on it, recorded in the ledger, ended and given back by two cleanup replicas.
The gateway buffers, then pushes back on the shard; once NATS is back every frame is stored
exactly once, commands are answered again within seconds of the restart, every request the
outage left unanswered is answered on a retry, and every resource is given back exactly once."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from shardbus import embedded
from tests.cleanup.conftest import connect_shard
from tests.faults.harness import Tally, finish_and_count, keep_commanding, send_frames
from tests.faults.shard_traffic import ShardTraffic
from tests.faults.workload import RunLoad
from tests.processes import ServiceProcesses

pytestmark = pytest.mark.faults

FRAMES = 8000
"""Frames the shard sends (16 s at 500 frames/s, so sending spans the whole outage)."""

RATE = 500.0
"""Frames per second."""

OUTAGE_S = 10.0
"""How long nats-server stays away (the issue's figure)."""

RESUME_WITHIN_S = 5.0
"""Longest acceptable time from the restart to the first answered command."""

RUNS, EVERY_S = 30, 0.5
"""Runs the workload creates, records and ends, one every 0.5 s (15 s, so across the outage)."""

SENT_DURING_OUTAGE = 1000
"""Frames the shard must have sent while NATS was away before it is started again."""

OUTAGE_AT_MOST_S = 20.0
"""Longest the outage is drawn out for that, and for a workload request to have failed in it
(each request is retried for 30 s before the scenario fails)."""


@pytest.mark.timeout(180)
async def test_a_10_s_nats_outage_loses_no_frame_and_gives_every_resource_back_once(tmp_path, database_url,
                                                                                     unique):
    port = embedded.free_port()
    servers = [embedded.start_nats(tmp_path / "nats", port=port)]
    procs = ServiceProcesses(tmp_path, servers[0].url)
    nc = await nats.connect(servers[0].url, connect_timeout=5, max_reconnect_attempts=-1,
                            reconnect_time_wait=0.2)
    tally, stop, shard, load, traffic = Tally(), asyncio.Event(), None, None, None
    try:
        traffic = await ShardTraffic.start(procs)
        shard = await connect_shard(nc, procs, f"nr{unique}", sequenced=True, publish_ack_timeout_s="1",
                                    silence_timeout_s="60")
        sim = shard.sim
        load = await RunLoad.start(procs, nc, shard, database_url, f"w{unique}", RUNS, EVERY_S)
        commander = asyncio.create_task(keep_commanding(nc, sim.shard, tally, stop))
        sender = asyncio.create_task(send_frames(sim, tally, FRAMES, RATE))

        async with asyncio.timeout(20):
            while tally.sent < 1000:
                await asyncio.sleep(0.01)
        sent_at_stop, failed_at_stop = tally.sent, load.answered.failed
        servers[0].stop()
        stopped_at = time.monotonic()
        await asyncio.sleep(OUTAGE_S)  # the shard keeps sending; the gateway buffers
        # The outage must have met frames and the workload's requests: drawn out (bounded) until
        # it has, rather than found afterwards not to have.
        try:
            async with asyncio.timeout(stopped_at + OUTAGE_AT_MOST_S - time.monotonic()):
                while tally.sent - sent_at_stop <= SENT_DURING_OUTAGE or load.answered.failed == failed_at_stop:
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"in a {OUTAGE_AT_MOST_S:.0f} s outage the shard sent {tally.sent - sent_at_stop} "
                                 f"frames and {load.answered.failed - failed_at_stop} workload requests "
                                 f"failed") from None
        sent_during_outage = tally.sent - sent_at_stop
        outage = time.monotonic() - stopped_at
        servers.append(embedded.start_nats(tmp_path / "nats", port=port))
        restarted_at = time.monotonic()

        await finish_and_count(nc, sim, tally, sender, commander, stop, FRAMES, ack_timeout=60)
        resumed = tally.resumed_after(restarted_at)
        await load.finish()
        await traffic.finish(nc)
        print(f"\n{tally.line(f'nats-server stopped {outage:.1f} s')}; {sent_during_outage} frames "
              f"sent during the outage; commands answered again {resumed:.2f} s after the restart; "
              f"{load.line()}; {traffic.line()}")
    finally:
        stop.set()
        if traffic:
            traffic.stop()
        await RunLoad.tear_down(load, shard, nc, procs)
        for server in servers:
            server.stop()

    assert tally.acknowledged == FRAMES
    assert tally.lost == 0 and tally.duplicated == 0, tally.line("nats-server restarted")
    assert tally.stored == FRAMES
    assert resumed < RESUME_WITHIN_S, f"commands answered again only {resumed:.2f} s after the restart"
    load.check()  # every request answered: those the outage failed, on a retry
    traffic.check()
