"""A shard that means harm (issue 11's findings, each a regression test): a line sized to push
a NATS message over max_payload, strings that pass ``^…$`` with a trailing newline, a second
hello carrying the token into the stream, frames that JSON parsers read differently, a frame
JetStream keeps refusing, and a backlog that would hold hundreds of megabytes."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from nats.js.api import StreamConfig

from services.gateway.publishing.publisher import REFUSALS_BEFORE_DEAD_LETTER
from shared import subjects
from tests.gateway.conftest import TOKEN, collect, refused, wait_until
from tests.gateway.test_listener import stored_frames
from tests.gateway.test_no_loss import own_nats  # noqa: F401  (a fixture)


async def status(nc) -> dict:
    return json.loads((await nc.request(subjects.GATEWAY_STATUS, b"{}", timeout=5)).data)


async def test_a_line_that_would_overflow_max_payload_never_cuts_the_gateway_off_nats(gateway, shard_sims, nc,
                                                                                       unique):
    # Before: the 1 MiB line cap let b"z"*1048500 through, and with the headers the gateway adds
    # its dead letter exceeded NATS's max_payload: the server closed the gateway's connection
    # for good, and gateway.status, health and every new hello went unanswered.
    cap = gateway.gateway.line_cap
    assert cap + 4096 <= gateway.nc.max_payload
    sim = await shard_sims(gateway, f"h{unique}")
    await sim.send_raw(b"z" * 1_048_500 + b"\n")
    await wait_until(lambda: sim.shard not in gateway.gateway.links)  # over the cap: that link closes
    assert gateway.nc.is_connected
    # The largest line the cap allows is stored, as a frame and as a dead letter with its reason.
    again = await shard_sims(gateway, f"h{unique}")
    biggest_frame = b'{"kind":"big","pad":"' + b"x" * (cap - 23) + b'"}'
    biggest_junk = b"y" * cap
    assert len(biggest_frame) == len(biggest_junk) == cap
    frames = await collect(nc, subjects.frame(again.shard, "big"), 1,
                           start=lambda: again.send_raw(biggest_frame + b"\n"))
    letters = await collect(nc, subjects.deadletter(again.shard), 1,
                            start=lambda: again.send_raw(biggest_junk + b"\n"))
    assert frames[0].data == biggest_frame and letters[0].data == biggest_junk
    assert gateway.nc.is_connected and again.shard in gateway.gateway.links


@pytest.mark.parametrize("kind", ["sec.nl\n", "guild.update\n", "a\n.b"])
async def test_a_kind_with_a_newline_is_a_dead_letter_and_later_frames_still_flow(gateway, shard_sims, nc, unique,
                                                                                   kind):
    # Before: "sec.nl\n" passed ^…$, its publish failed for ever under the publisher's lock, and
    # every later frame of that shard was lost.
    sim = await shard_sims(gateway, f"k{unique}")
    letters = await collect(nc, subjects.deadletter(sim.shard), 1,
                            start=lambda: sim.send_raw(json.dumps({"kind": kind}).encode() + b"\n"))
    assert "kind is not a safe subject tail" in letters[0].headers["Shardbus-Reason"]
    got = await collect(nc, subjects.frame(sim.shard, "after"), 1, start=lambda: sim.send("after"))
    assert len(got) == 1


async def test_a_shard_id_with_a_trailing_newline_is_refused(gateway, unique):
    # Before: "uoa\n" passed the hello and left a ghost in gateway.status.
    assert await refused(gateway, f"uoa{unique}\n", TOKEN)
    assert not any(shard.endswith("\n") for shard in gateway.gateway.links)


async def test_a_second_hello_on_an_open_link_never_puts_the_token_into_the_stream(gateway, shard_sims, nc,
                                                                                   unique):
    sim = await shard_sims(gateway, f"t{unique}")
    await sim.send("server.hello", shard=sim.shard, protocol=7, token=TOKEN)
    got = await stored_frames(nc, sim.shard, 2)
    assert [m.subject.rsplit(".frame.", 1)[1] for m in got] == ["server.hello", "server.hello"]
    assert all(TOKEN.encode() not in m.data and b'"token"' not in m.data for m in got)


async def test_a_second_hello_drops_partial_rosters_and_replays_news_as_the_seed_does(gateway, shard_sims, nc,
                                                                                      unique):
    sim = await shard_sims(gateway, f"r{unique}")
    await nc.request(subjects.news_add(sim.shard), b'{"id":"n1","title":"Fair"}', timeout=5)
    await wait_until(lambda: len(sim.news) == 1)
    await sim.send("guild.roster", id=7, seq=0, more=True, members=[{"name": "Half"}])
    await sim.send("server.hello", shard=sim.shard, protocol=7)
    await sim.send("guild.roster", id=7, seq=1, more=False, members=[{"name": "Rest"}])
    await wait_until(lambda: len(sim.news) == 2)
    assert sim.news[1]["announce"] is False
    await asyncio.sleep(0.2)
    board = json.loads((await nc.request(subjects.board(sim.shard, "guilds"), b"{}", timeout=5)).data)
    assert board["items"] == []  # the continuation had nothing to continue


@pytest.mark.parametrize(("line", "reason"), [
    ('\ufeff{"kind":"bom"}'.encode(), "starts with a byte-order mark"),
    ('{"kind":"utf16"}'.encode("utf-16"), "not UTF-8"),
    (b'{"kind":"nan","x":NaN}', "malformed JSON: NaN is not JSON"),
    (b'{"kind":"x","y":-Infinity}', "malformed JSON: -Infinity is not JSON"),
    (b'{"kind":"safe","kind":"guild.update"}', "malformed JSON: the key 'kind' appears twice"),
    (b'{"kind":"deep","a":{"b":1,"b":2}}', "malformed JSON: the key 'b' appears twice"),
])
async def test_a_frame_json_parsers_read_differently_is_a_dead_letter_with_the_reason(gateway, shard_sims, nc,
                                                                                      unique, line, reason):
    sim = await shard_sims(gateway, f"j{unique}")
    letters = await collect(nc, subjects.deadletter(sim.shard), 1, start=lambda: sim.send_raw(line + b"\n"))
    assert letters[0].headers["Shardbus-Reason"] == reason and letters[0].data == line


@pytest.mark.parametrize("news_id", ["é1", "٣", "n 1", "a" * 65, "n1\n"])
async def test_a_news_id_that_is_not_ascii_letters_and_digits_is_400(gateway, nc, unique, news_id):
    # Before: "é1" passed str.isalnum(), failed as a bucket key, and no reply came at all.
    reply = json.loads((await nc.request(subjects.news_add(f"s{unique}"), json.dumps({"id": news_id}).encode(),
                                         timeout=5)).data)
    assert reply["status"] == 400 and "ASCII letters and digits" in reply["error"]


async def test_a_frame_jetstream_keeps_refusing_is_dead_lettered_and_the_shard_goes_on(gateway, shard_sims, nc,
                                                                                      unique):
    # A stream that refuses big messages stands in for any 4xx JetStream answer about one message.
    js = nc.jetstream()
    info = await js.stream_info(gateway.settings.frames_stream)
    await js.update_stream(StreamConfig.from_response({**info.config.as_dict(), "max_msg_size": 2000}))
    try:
        sim = await shard_sims(gateway, f"x{unique}")
        big = json.dumps({"kind": "too.big", "pad": "p" * 3000}).encode()
        letters = await collect(nc, subjects.deadletter(sim.shard), 1, timeout=20,
                                start=lambda: sim.send_raw(big + b"\n"))
        assert letters[0].data == big
        assert letters[0].headers["Shardbus-Subject"] == subjects.frame(sim.shard, "too.big")
        assert f"refused it {REFUSALS_BEFORE_DEAD_LETTER} times" in letters[0].headers["Shardbus-Reason"]
        got = await collect(nc, subjects.frame(sim.shard, "small"), 1, start=lambda: sim.send("small"))
        assert len(got) == 1
    finally:
        await js.update_stream(StreamConfig.from_response({**info.config.as_dict(), "max_msg_size": -1}))


async def test_a_sequenced_frame_jetstream_refuses_is_dead_lettered_and_never_acknowledged(gateway, shard_sims, nc,
                                                                                           unique):
    # frame.ack means "stored in SHARD_FRAMES" and nothing else (docs/gateway.md, "Frames"; issue
    # 36): a frame given up on (dead-lettered) keeps its seq unacknowledged, so a shard that trusts
    # frame.ack keeps it. Before, the gateway acknowledged it once it was dead-lettered.
    js = nc.jetstream()
    info = await js.stream_info(gateway.settings.frames_stream)
    await js.update_stream(StreamConfig.from_response({**info.config.as_dict(), "max_msg_size": 2000}))
    try:
        sim = await shard_sims(gateway, f"q{unique}", sequenced=True)
        letters = await collect(nc, subjects.deadletter(sim.shard), 1, timeout=20,
                                start=lambda: sim.send("too.big", pad="p" * 3000))
        refused_seq = json.loads(letters[0].data)["seq"]
        # A later frame is stored and acknowledged: its ack is a fact the refused frame's is
        # ordered before (frames leave the window in order), so the refused one had its chance.
        later = await sim.send("small")
        await wait_until(lambda: later not in sim.unacked, timeout=20)
        assert refused_seq in sim.unacked  # never acknowledged
        assert list(sim.unacked) == [refused_seq]
    finally:
        await js.update_stream(StreamConfig.from_response({**info.config.as_dict(), "max_msg_size": -1}))


async def test_frames_held_while_nats_is_away_are_bounded_in_bytes_and_none_is_lost(own_nats,  # noqa: F811
                                                                                    start_gateway, shard_sims,
                                                                                    unique):
    # Before: with NATS away one shard pushed 600 x 500 KB frames and the gateway held 339 MB.
    servers, restart = own_nats
    cap = 4 * 1024 * 1024
    running = await start_gateway(nats_servers=servers[0].url, buffer_bytes=cap, publish_ack_timeout_s=1.0,
                                  silence_timeout_s=120)
    sim = await shard_sims(running, f"b{unique}", sequenced=True)
    servers[0].stop()
    frame = 500 * 1024
    sent = 0

    async def push() -> None:
        nonlocal sent
        for i in range(40):  # 20 MB, five times the bound
            await sim.send("bulk", i=i, pad="p" * frame)
            sent += 1

    pushing = asyncio.create_task(push())
    await asyncio.sleep(3)
    publisher = running.gateway.publishers[sim.shard]
    assert publisher.most_held_bytes <= cap + frame + 1024
    restart()
    await asyncio.wait_for(pushing, 60)
    await sim.wait_acked(timeout=60)
    assert sent == 40 and publisher.held_bytes == 0


async def test_a_jetstream_delivery_pointed_at_a_gateway_subject_is_refused(gateway, shard_sims, nc, unique,
                                                                            caplog):
    # A website may create consumers on the board buckets it watches, and nats-server does not
    # check that it may publish to the deliver subject it names: it could have JetStream deliver
    # any entry it can read to a subject the gateway listens on literally (the shard's news
    # announcements). Such a message keeps its stream subject and carries a $JS.ACK reply; the
    # gateway acts on neither. (A push consumer delivers only to a literal subscription, so the
    # command plane's shard.<s>.cmd.> is out of its reach; the check guards every callback.)
    from nats.js.api import ConsumerConfig, DeliverPolicy

    caplog.set_level("WARNING", logger="shardbus.gateway.boards")
    sim = await shard_sims(gateway, f"f{unique}")
    await nc.request(subjects.news_add(sim.shard), b'{"id":"n1","title":"Fair"}', timeout=5)
    await wait_until(lambda: len(sim.news) == 1)
    js = nc.jetstream()
    stream = f"KV_{gateway.settings.board_bucket_prefix}_NEWS"
    await js.add_consumer(stream, ConsumerConfig(deliver_subject=subjects.news_announce(sim.shard),
                                                 deliver_policy=DeliverPolicy.ALL,
                                                 filter_subject=f"$KV.{stream[3:]}.{sim.shard}.>"))
    await wait_until(lambda: any(r.getMessage() == "message refused" for r in caplog.records))
    await asyncio.sleep(0.3)
    assert len(sim.news) == 1  # the forged delivery never reached the shard
    refusal = next(r for r in caplog.records if r.getMessage() == "message refused")
    assert "stream subject" in refusal.reason


@pytest.mark.parametrize("request_subject", ["shard.{}.news.add", "shard.{}.board.guilds"])
@pytest.mark.parametrize("token", ["é1", "UO1", "x" * 33])
async def test_a_subject_token_that_is_no_shard_id_is_400_and_stores_nothing(gateway, nc, token, request_subject):
    # The token becomes a key or a consumer's filter subject: matched whole, like a hello's.
    reply = json.loads((await nc.request(request_subject.format(token), b'{"id":"n1"}', timeout=5)).data)
    assert reply["status"] == 400 and "must match [a-z0-9_-]{1,32}" in reply["error"]
    assert await gateway.gateway.boards.latest("news", token) == {}


@pytest.mark.timeout(120)
async def test_a_shard_that_sends_and_never_reads_is_disconnected_before_its_backlog_grows_without_bound(
        gateway, unique, monkeypatch):
    """Every stored frame with a ``seq`` is acknowledged to the shard (``frame.ack``), unasked: a
    shard that keeps sending and reads nothing would make the gateway hold every one of them.
    Past ``link.UNREAD_MAX`` bytes waiting (lowered here) the gateway ends the link, saying why."""
    from services.gateway.shard_link import link as link_module

    monkeypatch.setattr(link_module, "UNREAD_MAX", 50_000)
    shard = f"deaf{unique}"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing, and buffers little
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gateway.port))
    _reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(json.dumps({"t": 1, "kind": "server.hello", "shard": shard, "protocol": 7,
                             "token": TOKEN}).encode() + b"\n")
    try:
        await wait_until(lambda: shard in gateway.gateway.links)
        link = gateway.gateway.links[shard]
        # The gateway's own kernel send buffer made small too: otherwise Linux grows it to 4 MiB,
        # and how many frames that takes depends on how busy the machine is.
        link.writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        seq = 0
        # The seed's guild.update (services/gateway/asyncapi_schema.py quotes it) with the optional
        # seq, which the gateway acknowledges with a frame.ack (docs/gateway.md, "Frames").
        async with asyncio.timeout(90):
            while not link.closed:
                batch = b"".join(b'{"kind":"guild.update","id":7,"name":"The Cartographers","abbr":"MAP",'
                                 b'"members":2,"online":1,"seq":%d}\n' % n for n in range(seq, seq + 500))
                seq += 500
                try:
                    writer.write(batch)
                    await asyncio.wait_for(writer.drain(), 2)
                    # Paced, so the acks are written as the frames are stored, and the link ends
                    # after a few thousand frames, not the tens of thousands a flood queues (each
                    # stored before the link is done: 17 s alone, past the wait below on a busy
                    # machine).
                    await asyncio.sleep(0.05)
                except TimeoutError:  # the gateway is behind (back-pressure): its acks still come
                    await asyncio.sleep(0.1)
                except ConnectionError:
                    break
        await wait_until(lambda: link.closed, timeout=30)
        assert link.closed_why.startswith("the shard does not read what the gateway writes ("), link.closed_why
        await wait_until(lambda: shard not in gateway.gateway.links)
    finally:
        writer.close()
