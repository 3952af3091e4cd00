"""JetStream's acknowledgements of the shards' frames, taken on the gateway's one ack inbox
(``pipeline.PublishPipeline``, not ``publish_async``): every frame acknowledged and nothing left
waiting; an error answer taken at once, not after the acknowledgement timeout."""

from __future__ import annotations

import json
import time

from nats.js.api import StreamConfig

from services.gateway.publishing.publisher import REFUSALS_BEFORE_DEAD_LETTER
from shared import subjects
from tests.gateway.conftest import collect, wait_until
from tests.gateway.test_listener import stored_frames


async def test_every_frame_of_several_shards_is_acknowledged_and_nothing_is_left_waiting(gateway, shard_sims, nc,
                                                                                          unique):
    sims = [await shard_sims(gateway, f"a{n}{unique}", sequenced=True) for n in range(3)]
    for i in range(300):
        for sim in sims:
            await sim.send("player.move", i=i)
    for sim in sims:
        await sim.wait_acked(timeout=20)  # frame.ack: JetStream holds each frame
    acks = gateway.gateway.intake.pipeline
    await wait_until(lambda: acks.waiting() == 0 and all(p.pending() == 0 for p in gateway.gateway.publishers.values()))
    for sim in sims:
        got = await stored_frames(nc, sim.shard, 301)
        moves = [json.loads(m.data)["i"] for m in got if m.subject.endswith("player.move")]
        assert moves == list(range(300))  # none lost, none twice, in order


async def test_an_error_answer_from_jetstream_is_taken_at_once_not_after_the_ack_timeout(start_gateway, shard_sims,
                                                                                        nc, unique):
    # Before, nats-py's publish_async left the message's future unresolved on an error answer
    # (APIError.from_error raises in its callback), so each refusal cost the acknowledgement timeout.
    running = await start_gateway(publish_ack_timeout_s=30)
    js = nc.jetstream()
    info = await js.stream_info(running.settings.frames_stream)
    await js.update_stream(StreamConfig.from_response({**info.config.as_dict(), "max_msg_size": 2000}))
    try:
        sim = await shard_sims(running, f"e{unique}")
        big = json.dumps({"kind": "too.big", "pad": "p" * 3000}).encode()
        started = time.monotonic()
        letters = await collect(nc, subjects.deadletter(sim.shard), 1, timeout=20,
                                start=lambda: sim.send_raw(big + b"\n"))
        assert time.monotonic() - started < 20  # not 30 s (nor 5 x 30 s)
        assert letters[0].data == big
        assert f"refused it {REFUSALS_BEFORE_DEAD_LETTER} times" in letters[0].headers["Shardbus-Reason"]
    finally:
        await js.update_stream(StreamConfig.from_response({**info.config.as_dict(), "max_msg_size": -1}))
    await wait_until(lambda: running.gateway.intake.pipeline.waiting() == 0)
