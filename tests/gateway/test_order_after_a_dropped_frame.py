"""A frame JetStream stores only after a later frame of its shard is counted and logged, never
passed over (docs/gateway.md, "What a shard may rely on": the one known exception to order), and a
shard whose oldest frame is unanswered — for half a second, or while a later one was stored ahead
of it — publishes nothing newer until it is, so the exception is kept to the frames already in
flight.

On hosts a change of the stream's leader drops the frames in flight for a few seconds and then
stores the later ones (docs/reliability.md, "Frames stored out of order after a leader change").
Here the same thing is made to happen on one real nats-server: the first frame goes to a subject
no stream takes yet, and a plain subscriber listens there so that the publish meets neither a
stream nor "no responders": it is dropped without a word, as in that gap. The later frames are
stored; then the stream takes the first frame's subject too, and the shard's recovery stores it
after them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from services.gateway.publishing.outgoing import Outgoing
from services.gateway.publishing.pipeline import PublishPipeline
from services.gateway.publishing.publisher import ShardPublisher
from tests.gateway.conftest import stored_in_stream, wait_until


async def _publisher(nc, ack_timeout_s: float = 1.0) -> tuple[PublishPipeline, ShardPublisher, list[Outgoing]]:
    pipeline = PublishPipeline(nc, ack_timeout_s=ack_timeout_s)
    await pipeline.start()
    stored: list[Outgoing] = []
    publisher = ShardPublisher(pipeline, nc.jetstream(), window=16, buffer=64, on_stored=stored.append)
    publisher.start()
    return pipeline, publisher, stored


async def test_a_frame_stored_after_a_later_one_of_its_shard_is_counted_and_logged(nc, unique, caplog):
    stream, dropped, kept = f"ORDER_{unique}", f"order.{unique}.first", f"order.{unique}.rest"
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[kept])
    await nc.subscribe(dropped)  # a listener, not a stream: the publish is dropped without an answer
    await nc.flush()
    pipeline, publisher, stored = await _publisher(nc)
    try:
        with caplog.at_level(logging.ERROR, logger="shardbus.gateway.publisher"):
            publisher.put_nowait(Outgoing(dropped, b'{"i":0}', f"{unique}-0", ack_seq=0))
            for i in (1, 2, 3):
                publisher.put_nowait(Outgoing(kept, b'{"i":%d}' % i, f"{unique}-{i}", ack_seq=i))
            # The three later frames are stored while the first waits: made to happen, not hoped for.
            async with asyncio.timeout(10):
                while (await js.stream_info(stream)).state.messages < 3:
                    await asyncio.sleep(0.05)
            await js.update_stream(name=stream, subjects=[kept, dropped])
            await wait_until(lambda: len(stored) == 4, timeout=15)
        assert await stored_in_stream(nc, stream) == [1, 2, 3, 0]
        assert publisher.stored_out_of_order == 1
        assert [item.ack_seq for item in stored] == [0, 1, 2, 3]  # acknowledged, each once
        told = [r for r in caplog.records if "stored after later frames" in r.getMessage()]
        assert len(told) == 1 and told[0].subject == dropped and told[0].count == 1
    finally:
        await publisher.stop(drain_timeout_s=0)
        await pipeline.stop()


async def test_frames_recovered_in_order_are_not_counted_out_of_order(nc, unique):
    """The control: the first frame meets no stream at all ("no responders"), so its recovery
    publishes it and those after it again, in order, before anything later is stored."""
    stream, subject = f"ORDER_{unique}", f"order.{unique}.all"
    js = nc.jetstream()
    pipeline, publisher, stored = await _publisher(nc)
    try:
        for i in range(4):
            publisher.put_nowait(Outgoing(subject, b'{"i":%d}' % i, f"{unique}-{i}", ack_seq=i))
        await asyncio.sleep(0.2)  # answered "no responders": the recovery is retrying the first
        await js.add_stream(name=stream, subjects=[subject])
        await wait_until(lambda: len(stored) == 4, timeout=15)
        assert await stored_in_stream(nc, stream) == [0, 1, 2, 3]
        assert publisher.stored_out_of_order == 0
    finally:
        await publisher.stop(drain_timeout_s=0)
        await pipeline.stop()


async def _stream_missing_one_subject(nc, unique: str) -> tuple[Any, str, str, str]:
    """A stream taking ``kept`` but not yet ``dropped``, where a plain listener makes a publish
    vanish without an answer (as in a leader's gap): (js, stream, dropped, kept)."""
    stream, dropped, kept = f"ORDER_{unique}", f"order.{unique}.first", f"order.{unique}.rest"
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[kept])
    await nc.subscribe(dropped)
    await nc.flush()
    return js, stream, dropped, kept


async def _taken_in_and_read(nc, js, stream: str, subjects: list[str], stored: list[Outgoing]) -> list[int]:
    """The stream takes ``subjects`` (the dropped one too); once the shard's four frames are
    stored, the stream's order of them."""
    await js.update_stream(name=stream, subjects=subjects)
    await wait_until(lambda: len(stored) == 4, timeout=20)
    return await stored_in_stream(nc, stream)


async def _held_back(publisher: ShardPublisher) -> None:
    loop = asyncio.get_running_loop()
    await wait_until(lambda: publisher.held_back(loop.time()), timeout=10)


async def _frames_in(js, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages


async def test_a_shard_whose_oldest_frame_is_unanswered_publishes_nothing_newer(nc, unique):
    """The frame dropped in a leader's gap waits unanswered: the shard's frames put after it has
    waited half a second are held back until its recovery stores it, and go after it. (Before the
    hold they went at once and were stored ahead of it: [1, 2, 3, 0].)"""
    js, stream, dropped, kept = await _stream_missing_one_subject(nc, unique)
    pipeline, publisher, stored = await _publisher(nc, ack_timeout_s=5.0)  # recovery 5 s after
    try:
        publisher.put_nowait(Outgoing(dropped, b'{"i":0}', f"{unique}-0", ack_seq=0))
        await _held_back(publisher)  # unanswered for half a second: made to happen
        for i in (1, 2, 3):
            publisher.put_nowait(Outgoing(kept, b'{"i":%d}' % i, f"{unique}-{i}", ack_seq=i))
        await asyncio.sleep(0.5)  # long enough for a pass to publish them, were they not held
        assert await _frames_in(js, stream) == 0
        assert await _taken_in_and_read(nc, js, stream, [kept, dropped], stored) == [0, 1, 2, 3]
        assert publisher.stored_out_of_order == 0
    finally:
        await publisher.stop(drain_timeout_s=0)
        await pipeline.stop()


async def test_once_a_later_frame_is_stored_ahead_nothing_newer_is_published(nc, unique):
    """Frame 1 stored while frame 0 goes unanswered says 0 was dropped in flight: 2 and 3, put
    after, wait for 0 (the half-second hold is set out of reach here, so only this rule holds
    them). Only the frame already in flight lands ahead: [1, 0, 2, 3], counted once."""
    js, stream, dropped, kept = await _stream_missing_one_subject(nc, unique)
    pipeline, publisher, stored = await _publisher(nc, ack_timeout_s=5.0)
    publisher.hold_after_s = 60.0
    try:
        publisher.put_nowait(Outgoing(dropped, b'{"i":0}', f"{unique}-0", ack_seq=0))
        publisher.put_nowait(Outgoing(kept, b'{"i":1}', f"{unique}-1", ack_seq=1))
        await _held_back(publisher)  # frame 1's answer came while frame 0's did not
        for i in (2, 3):
            publisher.put_nowait(Outgoing(kept, b'{"i":%d}' % i, f"{unique}-{i}", ack_seq=i))
        await asyncio.sleep(0.5)
        assert await _frames_in(js, stream) == 1
        assert await _taken_in_and_read(nc, js, stream, [kept, dropped], stored) == [1, 0, 2, 3]
        assert publisher.stored_out_of_order == 1
        assert [item.ack_seq for item in stored] == [0, 1, 2, 3]
    finally:
        await publisher.stop(drain_timeout_s=0)
        await pipeline.stop()
