"""Bad input on the wire, fuzzed: random bytes, huge lines, deep nesting, wrong types and
unicode tricks get a dead letter or a clean refusal — never a crash — and other shards'
frames keep flowing."""

from __future__ import annotations

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.gateway.shard_link.wire import (
    DeadLetter,
    Frame,
    HelloRefused,
    LineTooLong,
    check_hello,
    is_safe_kind,
    read_line,
    sort_line,
)
from shared import subjects
from simulator.shard import ShardSimulator
from tests.gateway.conftest import TOKEN, collect, wait_until

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
tricky_kinds = st.one_of(st.text(max_size=40), st.sampled_from(
    ["a.*", ">", "a..b", ".a", "a.", " a", "a\u00a0b", "a\u200bb", "ａ.b", "guild.update\n", "x" * 129]),
    json_values)
NO_EXAMPLES_DB = settings(max_examples=150, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])


@NO_EXAMPLES_DB
@given(st.binary(max_size=300))
def test_random_bytes_are_a_frame_or_a_dead_letter_never_an_exception(data):
    result = sort_line(data)
    assert isinstance(result, (Frame, DeadLetter))
    assert result.data == data


@NO_EXAMPLES_DB
@given(tricky_kinds, json_values)
def test_only_a_safe_kind_becomes_a_frame(kind, payload):
    line = json.dumps({"kind": kind, "payload": payload}).encode()
    result = sort_line(line)
    if isinstance(result, Frame):
        assert is_safe_kind(kind) and "*" not in kind and ">" not in kind and ".." not in kind
        assert subjects.frame("s", kind).count(" ") == 0
    else:
        assert not is_safe_kind(kind)


def test_deep_nesting_is_a_dead_letter():
    assert isinstance(sort_line(b'{"kind":"a","x":' + b"[" * 50_000 + b"]" * 50_000 + b"}"), DeadLetter)


@NO_EXAMPLES_DB
@given(st.dictionaries(st.sampled_from(["kind", "shard", "protocol", "token", "t"]), json_values, max_size=5)
       | json_values)
def test_a_bad_hello_is_refused_cleanly_and_never_echoes_the_token(hello):
    line = json.dumps(hello).encode()
    try:
        check_hello(line, "the-real-token")
    except HelloRefused as exc:
        assert "the-real-token" not in str(exc)
    else:
        assert hello["token"] == "the-real-token"


@NO_EXAMPLES_DB
@given(st.lists(st.binary(max_size=3000).filter(lambda b: b"\n" not in b), max_size=6))
def test_the_line_reader_returns_each_line_or_refuses_a_long_one(lines):
    async def read_all() -> list[bytes | str]:
        reader = asyncio.StreamReader(limit=1025)
        reader.feed_data(b"".join(line + b"\n" for line in lines))
        reader.feed_eof()
        out: list[bytes | str] = []
        while True:
            try:
                line = await read_line(reader, 1024)
            except LineTooLong:
                out.append("too long")
                return out
            if line is None:
                return out
            out.append(line)

    got = asyncio.run(read_all())
    expected: list[bytes | str] = []
    for line in lines:
        if len(line) > 1024:
            expected.append("too long")
            break
        expected.append(line.rstrip(b"\r"))
    assert got == expected


async def test_a_shard_sending_garbage_never_stops_the_gateway_or_other_shards(gateway, shard_sims, nc, unique):
    noisy = await shard_sims(gateway, f"n{unique}", sequenced=False)
    calm = await shard_sims(gateway, f"c{unique}", sequenced=False)
    garbage = [bytes(range(256)), b"\x00" * 500, b'{"kind":"\xed\xa0\x80"}', b'{"kind":"a\\ud800"}',
               b"{" * 3000, b'{"kind":{"nested":true}}', b'{"kind":"ok","n":1e999999}',
               b'{"kind":"ok","n":' + b"9" * 5000 + b"}", b"\r", b"\t\t"]
    for line in garbage:
        await noisy.send_raw(line + b"\n")
    got = await collect(nc, subjects.frame(calm.shard, "still.flowing"), 1,
                        start=lambda: calm.send("still.flowing"))
    assert len(got) == 1
    await wait_until(lambda: gateway.gateway.links[noisy.shard].dead_letters >= 8)
    assert noisy.shard in gateway.gateway.links  # garbage is dead-lettered, not fatal


FUZZ_CAP = 4096
"""The line cap of the fuzzed gateway: small, so sizes around it are cheap to send."""


def _fuzz_line(rng, n: int) -> tuple[bytes, str]:
    """One random line and what the gateway must make of it: frame, dead, blank or over."""
    choice = rng.random()
    if choice < 0.35:
        body = {"t": n, "kind": rng.choice(["fz.a", "fz.b-c", "fz_d.e.f", "x"]), "n": n,
                "v": rng.choice([None, True, 1.5, "ü", [1, {"a": []}], "\u2028"])}
        return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode(), "frame"
    if choice < 0.45:
        pad = FUZZ_CAP - len(b'{"kind":"fz.edge","p":""}') - rng.choice([0, 1, 2])
        return b'{"kind":"fz.edge","p":"' + b"e" * pad + b'"}', "frame"
    if choice < 0.50:
        return b"o" * (FUZZ_CAP + rng.choice([1, 2, 500])), "over"
    if choice < 0.55:
        return rng.choice([b"", b"\r", b"  \t"]), "blank"
    return rng.choice([bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 60))).replace(b"\n", b"") or b"{",
                       b'{"kind":"fz.a","kind":"fz.b"}', b'{"kind":"fz.nan","x":NaN}', b"[1,2]",
                       '\ufeff{"kind":"fz.bom"}'.encode(), b'{"kind":"fz.nl\\n"}', b'{"kind":"a.*"}',
                       b'{"no":"kind"}', b"{" * 2000, b"d" * FUZZ_CAP]), "dead"


def _fuzz_hello(rng, shard: str) -> tuple[bytes, bool]:
    good = {"t": 1, "kind": "server.hello", "shard": shard, "protocol": 7, "token": TOKEN}
    bad = rng.choice([{**good, "token": "nope"}, {**good, "shard": shard + "\n"}, {**good, "protocol": "7"},
                      {**good, "kind": "server.helo"}, {k: v for k, v in good.items() if k != "token"}, None])
    if rng.random() < 0.7:
        return json.dumps(good).encode(), True
    return (b"not json at all" if bad is None else json.dumps(bad).encode()), False


async def test_the_shard_link_fuzzed_loses_nothing_it_accepted_and_still_serves_a_good_shard(start_gateway, nc,
                                                                                              unique):
    import random

    from tests.gateway.test_listener import stored_frames

    rng = random.Random(20261201)
    running = await start_gateway(max_line_bytes=FUZZ_CAP)
    assert running.gateway.line_cap == FUZZ_CAP
    js = nc.jetstream()
    for round_no in range(24):
        shard = f"fz{unique}{round_no}"
        hello, accepted = _fuzz_hello(rng, shard)
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        lines = [_fuzz_line(rng, n) for n in range(rng.randint(5, 25))]
        writer.write(hello + b"\n" + b"".join(line + b"\n" for line, _ in lines))
        try:
            await writer.drain()
        except ConnectionError:
            pass
        # What the gateway must have taken: everything before the first over-long line.
        taken = []
        for _line, fate in lines:
            if fate == "over":
                break
            taken.append(fate)
        if not accepted:
            said = await asyncio.wait_for(reader.readline(), 5)
            assert json.loads(said)["kind"] == "gateway.hello.refused"
            writer.close()
            continue
        frames, dead = 1 + taken.count("frame"), taken.count("dead")  # the hello is a frame too
        got_frames = await stored_frames(nc, shard, frames)
        assert len(got_frames) == frames, (round_no, taken)
        assert [m.data for m in got_frames[1:]] == [line for line, fate in lines[:len(taken)] if fate == "frame"]
        if dead:
            sub = await js.subscribe(subjects.deadletter(shard), ordered_consumer=True)
            letters = [await sub.next_msg(timeout=10) for _ in range(dead)]
            await sub.unsubscribe()
            assert all(m.headers.get("Shardbus-Reason") for m in letters)
        writer.close()
    good = ShardSimulator("127.0.0.1", running.port, f"ok{unique}", TOKEN)
    try:
        await good.connect()
        got = await collect(nc, subjects.frame(f"ok{unique}", "still.served"), 1,
                            start=lambda: good.send("still.served"))
        assert len(got) == 1 and running.nc.is_connected
    finally:
        await good.close()
