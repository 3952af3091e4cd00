"""Bad input on the wire, fuzzed: random bytes, huge lines, deep nesting, wrong types and
unicode tricks get a dead letter or a clean refusal — never a crash — and other shards'
frames keep flowing."""

from __future__ import annotations

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.gateway.wire import DeadLetter, Frame, HelloRefused, LineTooLong, check_hello, is_safe_kind, \
    read_line, sort_line
from shared import subjects
from tests.gateway.conftest import collect, wait_until

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
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
