"""The gateway's publish pipeline (``pipeline.py``) and its read callback (``line_reader.py``),
against a real nats-server: many shards' frames share a pass and each shard keeps its order;
a pass cut by a NATS outage loses and repeats nothing; a command's reply and the frames around
its answer; lines however the TCP stream cuts them."""

from __future__ import annotations

import asyncio
import json

import nats

from services.gateway.publishing import nats_protocol
from services.gateway.publishing.pipeline import PublishPipeline
from shared import subjects
from tests.gateway.conftest import wait_until
from tests.gateway.test_listener import stored_frames
from tests.gateway.test_no_loss import own_nats  # noqa: F401 — a fixture

SHARDS = 12
FRAMES = 300


def runs(values: list[int]) -> str:
    """``values`` as ranges of consecutive numbers (what a failure shows)."""
    out: list[str] = []
    for v in values:
        if out and int(out[-1].split("-")[-1]) == v - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        else:
            out.append(str(v))
    return ", ".join(out)


def moves(msgs: list) -> list[int]:
    return [json.loads(m.data)["i"] for m in msgs if m.subject.endswith(".player.move")]


async def test_many_shards_share_each_pass_and_every_shard_keeps_its_order(start_gateway, shard_sims, nc, unique):
    # A window above the burst: no pass waits for acknowledgements, so passes count the reads.
    gateway = await start_gateway(publish_window=FRAMES + 100)
    sims = [await shard_sims(gateway, f"p{n}{unique}", sequenced=True) for n in range(SHARDS)]
    pipeline = gateway.gateway.pipeline
    published, passes = pipeline.published, pipeline.batches

    async def burst(sim) -> None:
        for start in range(0, FRAMES, 50):  # 50 lines a write: many shards' lines in one turn
            lines = b"".join(json.dumps({"kind": "player.move", "i": i, "seq": sim.next_seq + i}).encode() + b"\n"
                             for i in range(start, start + 50))
            await sim.send_raw(lines)
        sim.next_seq += FRAMES

    await asyncio.gather(*(burst(sim) for sim in sims))
    for sim in sims:
        got = await stored_frames(nc, sim.shard, FRAMES + 1, timeout=30)
        assert moves(got) == list(range(FRAMES))  # none lost, none twice, in order
    frames, passes = pipeline.published - published, pipeline.batches - passes
    assert frames == SHARDS * FRAMES
    assert passes < frames / 10  # a pass carries many frames (and shards), not one each


async def test_a_pass_cut_by_a_nats_outage_loses_nothing_and_repeats_nothing(own_nats, start_gateway,  # noqa: F811
                                                                            shard_sims, unique):
    servers, restart = own_nats
    running = await start_gateway(nats_servers=servers[0].url, publish_ack_timeout_s=1.0, silence_timeout_s=60)
    sims = [await shard_sims(running, f"o{n}{unique}", sequenced=True) for n in range(6)]
    sent = [0] * len(sims)

    async def keep_sending(n: int, sim) -> None:
        for i in range(1500):
            await sim.send("player.move", i=i)
            sent[n] = i + 1
            if i % 50 == 49:
                await asyncio.sleep(0.005)  # a steady stream: the outage falls mid-pass

    senders = [asyncio.create_task(keep_sending(n, sim)) for n, sim in enumerate(sims)]
    await wait_until(lambda: min(sent) >= 300, timeout=30)
    servers[0].stop()  # frames in flight, frames queued, frames being read
    await asyncio.sleep(2.0)
    restart()
    await asyncio.wait_for(asyncio.gather(*senders), 60)
    for sim in sims:
        await sim.wait_acked(timeout=60)
    nc = await nats.connect(servers[-1].url)  # the test's own client, on the restarted server
    try:
        for sim in sims:
            got = await stored_frames(nc, sim.shard, 1501, timeout=30)
            assert moves(got) == list(range(1500)), runs(moves(got))  # in order, none lost, none stored twice
    finally:
        await nc.close()


async def test_a_reply_that_opens_a_pass_after_nats_reconnected_is_sent(own_nats, unique):  # noqa: F811
    servers, restart = own_nats
    nc = await nats.connect(servers[0].url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        got: asyncio.Queue = asyncio.Queue()
        await nc.subscribe(f"r.{unique}", cb=got.put)
        pipeline = PublishPipeline(nc, ack_timeout_s=1.0)
        servers[0].stop()
        restart()
        await wait_until(lambda: nc.is_connected and nc.stats["reconnects"] >= 1, timeout=30)
        await nc.flush(timeout=5)  # the subscription is the server's again
        reply = nats_protocol.reply(f"r.{unique}", b'{"status":200}', None, nc.max_payload)
        assert reply is not None
        pipeline.post(reply)  # the first command of the pass, on the new connection
        await pipeline.flush()
        async with asyncio.timeout(5):
            assert (await got.get()).data == b'{"status":200}'
    finally:
        await nc.close()


async def test_a_command_reply_goes_out_and_the_frames_around_its_answer_keep_their_order(gateway, shard_sims, nc,
                                                                                           unique):
    sim = await shard_sims(gateway, f"c{unique}", sequenced=True)

    async def frames() -> None:
        for i in range(600):
            await sim.send("player.move", i=i)
            if i % 20 == 19:
                await asyncio.sleep(0)

    sender = asyncio.create_task(frames())
    replies = await asyncio.gather(*(nc.request(subjects.command(sim.shard, "item.catalog"), b"{}", timeout=10,
                                                headers={"X-Trace": f"t{n}"}) for n in range(30)))
    await asyncio.wait_for(sender, 30)
    for n, msg in enumerate(replies):
        assert json.loads(msg.data)["status"] == 200
        assert msg.headers and msg.headers.get("X-Trace") == f"t{n}"  # the request's headers come back
    await sim.wait_acked(timeout=20)
    got = await stored_frames(nc, sim.shard, 1 + 600 + 30, timeout=20)
    assert moves(got) == list(range(600))
    answers = [json.loads(m.data).get("reqId") for m in got if b'"reqId"' in m.data]
    assert len(answers) == len(set(answers)) == 30  # each answer stored once, as a frame


async def test_lines_are_the_same_however_tcp_cuts_them(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"t{unique}")
    lines = [json.dumps({"kind": "player.move", "i": i, "pad": "x" * (i * 7 % 90)}).encode() for i in range(40)]
    stream = b"".join(line + (b"\r\n" if i % 3 == 0 else b"\n") for i, line in enumerate(lines[:20]))
    for i in range(0, len(stream), 7):  # seven bytes a write, each waited for
        await sim.send_raw(stream[i:i + 7])
        await asyncio.sleep(0)
    await sim.send_raw(b"".join(line + b"\n" for line in lines[20:39]) + lines[39])  # the last one unterminated
    await sim.close()  # the shard's end of stream ends its last line
    got = await stored_frames(nc, sim.shard, 41, timeout=20)
    assert [m.data for m in got if m.subject.endswith(".player.move")] == lines  # verbatim, "\r" dropped
