"""Frames in JetStream fast-ingest batches keep their shard's order even when frames in flight
together are dropped and a later one reaches the stream (docs/gateway.md, "What a shard may rely
on"; ADR 0015), and the batches' wire is the server's.

A frame is dropped in flight here as in tests/gateway/test_order_after_a_dropped_frame.py: it
goes to a subject no stream takes yet, where a plain listener makes the publish vanish without
an answer. Plainly published, the frames after it are stored ahead of it; in a batch, the stream
finds the gap and stores none of them until the recovery has stored it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.js.api import StreamConfig

from services.gateway.publishing import fast_ingest
from services.gateway.publishing.fast_ingest import FastBatch
from services.gateway.publishing.outgoing import STORED, Outgoing
from services.gateway.publishing.pipeline import PublishPipeline
from services.gateway.publishing.publisher import ShardPublisher
from services.gateway.publishing.streams import declare_batched_stream, declare_streams
from services.gateway.settings import GatewaySettings
from shardbus import embedded
from tests.gateway.conftest import stored_in_stream, wait_until


def _has_fast_ingest(nc) -> bool:
    version = nc.connected_server_version
    return (version.major, version.minor) >= (2, 14)


@pytest.fixture
def fast_ingest_server(nc) -> None:
    if not _has_fast_ingest(nc):
        pytest.skip(f"nats-server {nc.connected_server_version} has no fast-ingest batches (2.14 and later)")


async def _stream(nc, name: str, subjects: list[str], verb: str = "CREATE") -> dict[str, Any]:
    """Create (or update) a stream that takes batches; nats-py's StreamConfig has no
    ``allow_batched``, so the request is written here as ``streams.py`` writes it."""
    config = {"name": name, "subjects": subjects, "allow_batched": True, "storage": "file", "num_replicas": 1}
    answer = json.loads((await nc.request(f"$JS.API.STREAM.{verb}.{name}", json.dumps(config).encode(),
                                          timeout=5)).data)
    assert "error" not in answer, answer
    return answer


async def test_a_stream_says_whether_it_takes_batches(nc, unique):
    """On 2.14 and later the frames stream takes batches; on an older server (the suite also runs
    on 2.9) the field is ignored, the answer says so, and frames are published plainly. (The
    suite's server holds SHARD_FRAMES already: a stream of the test's own subjects here.)"""
    config = StreamConfig(name=f"FRAMES_{unique}", subjects=[f"fi.{unique}.>"], duplicate_window=120)
    try:
        assert await declare_batched_stream(nc, config, True) is _has_fast_ingest(nc)
        assert await declare_batched_stream(nc, config, True) is _has_fast_ingest(nc)  # again: an update
        assert await declare_batched_stream(nc, config, False) is False
    finally:
        await nc.jetstream().delete_stream(config.name)


async def test_the_gateway_declares_its_frames_stream_taking_batches(tmp_path):
    """``declare_streams`` on a server of its own (2.15.1): the frames stream takes batches unless
    ``SHARDBUS_FAST_INGEST`` is false."""
    server = embedded.start_nats(tmp_path / "nats")
    try:
        nc = await nats.connect(server.url)
        try:
            settings = GatewaySettings()
            assert await declare_streams(nc, nc.jetstream(), settings) is True
            off = settings.model_copy(update={"fast_ingest": False})
            assert await declare_streams(nc, nc.jetstream(), off) is False
        finally:
            await nc.close()
    finally:
        server.stop()


async def test_the_server_answers_a_batch_as_the_gateway_reads_it(nc, unique, fast_ingest_server):
    """The wire of ADR-50 as nats-server speaks it: the first message is answered before it is
    stored, each one after it as it is stored, and a gap ends the batch at the last one before
    it; a message for the ended batch is refused. (A new server that spoke otherwise fails here.)"""
    subject = f"fi.{unique}.a"
    await _stream(nc, f"FI_{unique}", [subject])
    answers: list[tuple[tuple[str, int] | None, fast_ingest.Answer]] = []
    prefix = nc.new_inbox() + "."

    async def keep(msg) -> None:
        answers.append((fast_ingest.parse_reply_tail(msg.subject[len(prefix):]), fast_ingest.parse_answer(msg.data)))

    await nc.subscribe(prefix + ">", cb=keep)
    batch = FastBatch.new()

    async def send(seq: int) -> None:
        await nc.publish(subject, b"%d" % seq, reply=prefix + fast_ingest.reply_tail(batch, seq),
                         headers={"Nats-Msg-Id": f"{unique}-{seq}"})

    for seq in (1, 2, 3):
        await send(seq)
    await send(5)  # 4 never sent: a gap
    await wait_until(lambda: any(answer.kind == "end" for _, answer in answers), timeout=10)
    await send(6)
    await wait_until(lambda: answers[-1][1].kind == "refused", timeout=10)
    kinds = [(where[1] if where else None, answer.kind, answer.seq) for where, answer in answers]
    assert kinds[0] == (1, "ack", 0)  # the batch is open
    assert [k for k in kinds if k[1] == "ack"][-1][2] == 3  # stored up to 3
    assert (5, "gap", 5) in kinds and (5, "end", 3) in kinds
    assert answers[-1][0] == (batch.id, 6)
    assert answers[-1][1].error and answers[-1][1].error["err_code"] == 10208  # "batch publish ID unknown"
    assert (await nc.jetstream().stream_info(f"FI_{unique}")).state.messages == 3


@pytest.mark.parametrize("batched", [True, False], ids=["in-a-batch", "plainly"])
async def test_frames_in_flight_after_a_dropped_one_are_stored_after_it(nc, unique, fast_ingest_server, batched):
    """Frames 2–4 go in the same pass as frame 1, which is dropped. In a batch the stream stores
    none of them before frame 1: [0, 1, 2, 3, 4]. Published plainly (before batches) they were
    stored ahead of it: [0, 2, 3, 4, 1] — the order fault seen on hosts (seed 383573)."""
    stream, dropped, kept = f"FI_{unique}", f"fi.{unique}.first", f"fi.{unique}.rest"
    await _stream(nc, stream, [kept])
    await nc.subscribe(dropped)  # a listener, not a stream: the publish vanishes without an answer
    await nc.flush()
    pipeline = PublishPipeline(nc, ack_timeout_s=5.0)
    pipeline.fast_ingest = batched
    await pipeline.start()
    stored: list[Outgoing] = []
    publisher = ShardPublisher(pipeline, nc.jetstream(), window=16, buffer=64, on_stored=stored.append)
    publisher.hold_after_s = 60.0  # the half-second hold is out of reach: only the batch keeps order
    publisher.start()

    def frame(i: int, subject: str) -> Outgoing:
        return Outgoing(subject, b'{"i":%d}' % i, f"{unique}-{i}", ack_seq=i)

    try:
        publisher.put_nowait(frame(0, kept))
        await wait_until(lambda: len(stored) == 1, timeout=10)  # the batch is open
        for item in (frame(1, dropped), frame(2, kept), frame(3, kept), frame(4, kept)):
            publisher.put_nowait(item)  # one pass: all four in flight together
        # Made to happen: the stream has answered about 2–4 (the batch cut at the gap; plainly,
        # stored while 1 waits) before the stream takes frame 1's subject.
        await wait_until(lambda: publisher.batches_cut == 1 if batched else _stored_ahead(publisher), timeout=10)
        await _stream(nc, stream, [kept, dropped], verb="UPDATE")
        await wait_until(lambda: len(stored) == 5, timeout=20)
        order = await stored_in_stream(nc, stream)
        assert [item.ack_seq for item in stored] == [0, 1, 2, 3, 4]  # acknowledged in order, once each
        if batched:
            assert order == [0, 1, 2, 3, 4] and publisher.stored_out_of_order == 0
        else:
            assert order == [0, 2, 3, 4, 1] and publisher.stored_out_of_order == 1
    finally:
        await publisher.stop(drain_timeout_s=0)
        await pipeline.stop()


def _stored_ahead(publisher: ShardPublisher) -> bool:
    """Plainly: frames 2–4 were answered "stored" while frame 1 waits."""
    window = list(publisher._in_flight)
    return len(window) == 4 and all(entry.state == STORED for entry in window[1:])


async def test_a_batch_the_server_forgot_is_recovered_and_a_new_one_started(nc, unique, fast_ingest_server):
    """A shard silent longer than a batch lives on the server (10 s) sends its next frame in a
    batch the server forgot: refused ("batch publish ID unknown"), published again, and the next
    frames go in a new batch. Here the batch is forgotten by deleting the stream's batches: the
    stream is recreated between two frames."""
    stream, subject = f"FI_{unique}", f"fi.{unique}.a"
    await _stream(nc, stream, [subject])
    pipeline = PublishPipeline(nc, ack_timeout_s=5.0)
    pipeline.fast_ingest = True
    await pipeline.start()
    stored: list[Outgoing] = []
    publisher = ShardPublisher(pipeline, nc.jetstream(), window=16, buffer=64, on_stored=stored.append)
    publisher.start()
    try:
        publisher.put_nowait(Outgoing(subject, b'{"i":0}', f"{unique}-0", ack_seq=0))
        await wait_until(lambda: len(stored) == 1, timeout=10)
        first = publisher._batch
        await nc.jetstream().delete_stream(stream)
        await _stream(nc, stream, [subject])
        for i in (1, 2, 3):
            publisher.put_nowait(Outgoing(subject, b'{"i":%d}' % i, f"{unique}-{i}", ack_seq=i))
        await wait_until(lambda: len(stored) == 4, timeout=20)
        assert publisher.batches_cut == 1
        assert await stored_in_stream(nc, stream) == [1, 2, 3]
        publisher.put_nowait(Outgoing(subject, b'{"i":4}', f"{unique}-4", ack_seq=4))
        await wait_until(lambda: len(stored) == 5, timeout=10)
        assert publisher._batch is not None and publisher._batch is not first
        assert await stored_in_stream(nc, stream) == [1, 2, 3, 4]
    finally:
        await publisher.stop(drain_timeout_s=0)
        await pipeline.stop()


def test_answers_outside_adr_50_are_errors_not_guesses() -> None:
    for data in (b"[]", b'{"type":"ack"}', b'{"type":"ack","seq":-1}', b'{"stream":"S","batch":"b"}', b'{}'):
        with pytest.raises(ValueError):
            fast_ingest.parse_answer(data)
    assert fast_ingest.parse_answer(b'{"stream":"S","seq":4}').kind == "stored"  # a server without batches
    assert fast_ingest.parse_reply_tail("0" * 32 + ".1.fail.3.1.$FI") == ("0" * 32, 3)
    for tail in ("x.1.fail.3.1.$FI", "0" * 32 + ".1.fail.0.1.$FI", "0" * 32 + ".1.ok.3.1.$FI", "abc"):
        assert fast_ingest.parse_reply_tail(tail) is None


@pytest.fixture
async def one_batch_a_stream(tmp_path, unique) -> AsyncIterator[tuple[Any, PublishPipeline]]:
    """A nats-server of the test's own allowing one open batch a stream, the stream
    ``FI_<unique>`` taking ``fi.<unique>.>``, and a started pipeline sending in batches."""
    conf = tmp_path / "limits.conf"
    conf.write_text("jetstream { limits { batch { max_inflight_per_stream: 1 } } }\n")
    server = embedded.start_nats(tmp_path / "nats", extra_args=("-c", str(conf)))
    try:
        nc = await nats.connect(server.url)
        pipeline = PublishPipeline(nc, ack_timeout_s=5.0)
        pipeline.fast_ingest = True
        try:
            await _stream(nc, f"FI_{unique}", [f"fi.{unique}.>"])
            await pipeline.start()
            yield nc, pipeline
        finally:
            await pipeline.stop()
            await nc.close()
    finally:
        server.stop()


async def test_a_shard_beyond_the_streams_open_batches_publishes_plainly(one_batch_a_stream, unique):
    """A server allowing one open batch a stream: the second shard is refused a batch ("too many
    inflight", 10211), publishes plainly for a while, and loses nothing; the first keeps its batch."""
    nc, pipeline = one_batch_a_stream
    publishers: list[ShardPublisher] = []
    stored: dict[int, list[Outgoing]] = {0: [], 1: []}
    try:
        for shard in (0, 1):
            publishers.append(ShardPublisher(pipeline, nc.jetstream(), window=16, buffer=64,
                                             on_stored=stored[shard].append))
            publishers[-1].start()
            for i in range(5):
                publishers[-1].put_nowait(Outgoing(f"fi.{unique}.{shard}", b'{"i":%d}' % i,
                                                   f"{unique}-{shard}-{i}", ack_seq=i))
            await wait_until(lambda shard=shard: len(stored[shard]) == 5, timeout=15)
        first, second = publishers
        assert first._batch is not None and first.batches_cut == 0
        assert second.batches_cut == 1 and second._plain_until > 0 and second._batch is None
        assert [item.ack_seq for item in stored[1]] == [0, 1, 2, 3, 4]
        assert (await nc.jetstream().stream_info(f"FI_{unique}")).state.messages == 10
    finally:
        for publisher in publishers:
            await publisher.stop(drain_timeout_s=0)


async def test_an_idle_batch_is_ended_on_the_server_before_the_next_starts(one_batch_a_stream, unique, monkeypatch):
    """A shard quiet for longer than ``fast_ingest.IDLE_S`` starts a new batch and ends the old one
    on the server (a message it does not store): on a server allowing one open batch a stream,
    the new one is not refused (before, it was: "too many inflight", the shard then plain)."""
    monkeypatch.setattr(fast_ingest, "IDLE_S", 0.3)
    nc, pipeline = one_batch_a_stream
    stored: list[Outgoing] = []
    publisher = ShardPublisher(pipeline, nc.jetstream(), window=16, buffer=64, on_stored=stored.append)
    try:
        publisher.start()
        batches = []
        for i in range(3):
            publisher.put_nowait(Outgoing(f"fi.{unique}.a", b'{"i":%d}' % i, f"{unique}-{i}", ack_seq=i))
            await wait_until(lambda i=i: len(stored) == i + 1, timeout=10)
            batches.append(publisher._batch)
            await asyncio.sleep(0.5)  # idle past IDLE_S
        assert publisher.batches_cut == 0 and publisher._plain_until == 0
        assert len({id(batch) for batch in batches}) == 3 and all(batches)
        assert await stored_in_stream(nc, f"FI_{unique}") == [0, 1, 2]
    finally:
        await publisher.stop(drain_timeout_s=0)
