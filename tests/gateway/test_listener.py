"""The shard listener: hello, frames published verbatim and in order, dead letters, a
reconnect replacing its ghost, heartbeats, the status request and seq acknowledgements."""

from __future__ import annotations

import asyncio
import json

from services.gateway.intake import REASON_HEADER
from shared import subjects
from tests.gateway.conftest import INTEREST_SETTLE_S, TOKEN, collect, refused, wait_until


async def stored_frames(nc, shard: str, expect: int, timeout: float = 10.0) -> list:
    """Every message JetStream holds for ``shard``'s frames (read back with an ordered consumer)."""
    js = nc.jetstream()
    sub = await js.subscribe(subjects.frame(shard, ">"), ordered_consumer=True)
    got = []
    try:
        async with asyncio.timeout(timeout):
            while len(got) < expect:
                got.append(await sub.next_msg(timeout=timeout))
        while True:  # anything beyond what we expected would be a duplicate
            try:
                got.append(await sub.next_msg(timeout=0.3))
            except Exception:
                break
    finally:
        await sub.unsubscribe()
    return got


async def test_frames_are_stored_verbatim_in_order_with_a_message_id(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}", sequenced=False)
    lines = [b'{"kind":"player.login", "t":%d,  "name":"\xc3\xa9l%d"}' % (i, i) for i in range(300)]
    for line in lines:
        await sim.send_raw(line + b"\n")
    got = await stored_frames(nc, sim.shard, 301)
    assert [m.data for m in got[1:]] == lines  # got[0] is the hello
    assert len(got) == 301
    assert all(m.headers and m.headers.get("Nats-Msg-Id") for m in got)
    assert len({m.headers["Nats-Msg-Id"] for m in got}) == 301


async def test_the_hello_is_forwarded_without_its_token(gateway, shard_sims, nc, unique):
    await shard_sims(gateway, f"s{unique}")
    got = await stored_frames(nc, f"s{unique}", 1)
    assert TOKEN.encode() not in got[0].data and json.loads(got[0].data)["shard"] == f"s{unique}"


BAD_LINES = [
    (b'{"kind": "a.*"}', "not a safe subject tail"),
    (b'{"kind": ">"}', "not a safe subject tail"),
    (b'{"kind": "a..b"}', "not a safe subject tail"),
    (b'{"kind": "a b"}', "not a safe subject tail"),
    (b'{"kind": ""}', "not a safe subject tail"),
    (b'{"kind": "guild.update\\u2028x"}', "not a safe subject tail"),
    (b'{"kind": "' + b"k" * 200 + b'"}', "not a safe subject tail"),
    (b'{"kind": 7}', "not a safe subject tail"),
    (b'{"kind": "x", ', "malformed JSON"),
    (b"\xff\xfe garbage", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "malformed JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'"just text"', "not a JSON object"),
    (b'{"t": 1}', "no kind"),
]


async def test_lines_that_cannot_be_frames_are_dead_lettered_and_the_connection_carries_on(
        gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}", sequenced=False)

    async def send_all() -> None:
        for line, _ in BAD_LINES:
            await sim.send_raw(line + b"\n")

    dead = await collect(nc, subjects.deadletter(sim.shard), len(BAD_LINES), start=send_all)
    assert [m.data for m in dead] == [line for line, _ in BAD_LINES]
    for msg, (_, reason) in zip(dead, BAD_LINES, strict=True):
        assert reason in msg.headers[REASON_HEADER]
    good = await collect(nc, subjects.frame(sim.shard, "still.here"), 1,
                         start=lambda: sim.send("still.here"))
    assert json.loads(good[0].data)["kind"] == "still.here"
    assert gateway.gateway.links[sim.shard].dead_letters == len(BAD_LINES)


async def test_an_over_long_line_closes_only_that_connection(start_gateway, shard_sims, nc, unique):
    running = await start_gateway(max_line_bytes=4096)
    noisy = await shard_sims(running, f"n{unique}", sequenced=False)
    calm = await shard_sims(running, f"c{unique}", sequenced=False)
    await noisy.send_raw(b'{"kind":"x","pad":"' + b"a" * 100_000 + b'"}\n')
    await asyncio.wait_for(noisy.disconnected.wait(), 5)
    got = await collect(nc, subjects.frame(calm.shard, "ok"), 1, start=lambda: calm.send("ok"))
    assert len(got) == 1 and calm.shard in running.gateway.links


async def test_a_wrong_token_is_refused(gateway, unique):
    assert await refused(gateway, f"s{unique}", "wrong-token-0000")


async def test_a_shard_with_its_own_token_must_present_it(start_gateway, shard_sims, unique):
    own = f"own{unique}"
    running = await start_gateway(shard_tokens={own: "its-very-own-token"})
    assert await refused(running, own, TOKEN)  # the common token is not enough
    await shard_sims(running, own, token="its-very-own-token")
    await shard_sims(running, f"other{unique}")  # everybody else still uses the common one


async def test_a_reconnect_of_the_same_shard_replaces_the_old_connection(gateway, shard_sims, nc, unique):
    first = await shard_sims(gateway, f"s{unique}")
    old_link = gateway.gateway.links[first.shard]
    second = await shard_sims(gateway, f"s{unique}")
    await asyncio.wait_for(first.disconnected.wait(), 5)
    await wait_until(lambda: gateway.gateway.links.get(second.shard) not in (None, old_link))
    await asyncio.sleep(INTEREST_SETTLE_S)
    msg = await nc.request(subjects.command(second.shard, "item.catalog"), b"{}", timeout=5)
    assert json.loads(msg.data)["status"] == 200
    assert second.executed["item.catalog"] == 1 and first.executed["item.catalog"] == 0


async def test_a_silent_shard_is_disconnected_and_any_line_keeps_it_alive(start_gateway, shard_sims, unique):
    # A timeout of 1.5 s, not less: with the suite's four workers on two cores, a 0.5 s stall of
    # this process once let the pinging shard itself look silent.
    running = await start_gateway(ping_every_s=0.1, silence_timeout_s=1.5)
    mute = await shard_sims(running, f"m{unique}", answer_pings=False)
    alive = await shard_sims(running, f"a{unique}")  # answers every ping with a pong
    await asyncio.wait_for(mute.disconnected.wait(), 8)
    await wait_until(lambda: mute.shard not in running.gateway.links)
    await asyncio.sleep(1.6)
    assert alive.shard in running.gateway.links and not alive.disconnected.is_set()


async def test_the_status_request_shows_each_shard_and_the_time_of_its_last_line(
        gateway, shard_sims, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    before = gateway.gateway.status()
    entry = next(s for s in before["shards"] if s["shard"] == sim.shard)
    await asyncio.sleep(0.05)
    await sim.send("player.login", name="x")

    def last_line_at() -> int:
        return next(s for s in gateway.gateway.status()["shards"] if s["shard"] == sim.shard)["lastLineAt"]

    await wait_until(lambda: last_line_at() > entry["lastLineAt"])
    assert entry["protocol"] == 7 and entry["silentForS"] >= 0


async def test_frames_with_seq_are_acknowledged_and_a_resend_after_reconnect_is_not_duplicated(
        gateway, shard_sims, nc, unique):
    # The optional acknowledgement, beyond today's shards (the seed's frames carry no seq; docs/gateway.md, "Frames").
    sim = await shard_sims(gateway, f"s{unique}", sequenced=True)
    for i in range(50):
        await sim.send("vendor.listing", serial=i)
    await sim.wait_acked()
    # Pretend the acks of the last 10 were lost: the shard resends them after reconnecting.
    for seq in range(sim.next_seq - 10, sim.next_seq):
        sim.unacked[seq] = json.dumps({"kind": "vendor.listing", "seq": seq}).encode() + b"\n"
    await sim.drop()
    await sim.connect()
    await sim.wait_acked()
    got = await stored_frames(nc, sim.shard, 52)
    listings = [m for m in got if m.subject.endswith("vendor.listing")]
    assert len(listings) == 50 and len(got) == 52  # two hellos, every listing once


async def test_every_disconnect_is_logged_once_with_its_reason(start_gateway, shard_sims, unique, caplog):
    caplog.set_level("INFO", logger="shardbus.gateway")
    running = await start_gateway(ping_every_s=0.1, silence_timeout_s=0.5)
    mute = await shard_sims(running, f"m{unique}", answer_pings=False)
    leaving = await shard_sims(running, f"l{unique}")
    await leaving.send("bye")
    await leaving.close()
    await asyncio.wait_for(mute.disconnected.wait(), 5)
    await wait_until(lambda: not {mute.shard, leaving.shard} & set(running.gateway.links))
    ends = {r.shard: r.reason for r in caplog.records if r.getMessage() == "shard disconnected"}
    assert ends == {mute.shard: "silent for 0.5 s", leaving.shard: "the shard closed the connection"}
    assert not [r for r in caplog.records if r.getMessage() == "connection closed"]
