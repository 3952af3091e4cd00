"""The walking skeleton: a shard dials the gateway, says hello, sends a frame, and a website
subscribed on NATS receives the exact bytes of that line."""

from __future__ import annotations

import asyncio
import json

import nats

from shared import subjects

TOKEN = "skeleton-token-1234"


async def _dial(addr: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = addr.rsplit(":", 1)
    return await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)


def _gateway_addr(proc) -> str:
    for line in proc.log().splitlines():
        if '"listening for shards"' in line:
            return json.loads(line)["addr"]
    raise AssertionError(f"gateway did not say where it listens:\n{proc.log()}")


async def test_a_frame_from_a_shard_arrives_on_nats_byte_for_byte(services, nc: nats.NATS, unique):
    gateway = services.start("gateway", shard_token=TOKEN, shard_port="0")
    shard = f"uo{unique}"
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_frame(msg) -> None:
        await received.put((msg.subject, msg.data))

    await nc.subscribe(subjects.frame(shard, ">"), cb=on_frame)
    await nc.flush()
    _reader, writer = await _dial(_gateway_addr(gateway))
    hello = {"t": 1733000000000, "kind": "server.hello", "shard": shard, "protocol": 7, "token": TOKEN}
    # Odd spacing and key order on purpose: the frame must arrive exactly as sent.
    line = b'{"kind":"guild.update",  "t":1733000000001,"guild":{"id":7,"name":"\xc3\x84gis"}}'
    writer.write(json.dumps(hello).encode() + b"\n" + line + b"\n")
    await writer.drain()

    got = [await asyncio.wait_for(received.get(), 5) for _ in range(2)]
    assert got[0][0] == subjects.frame(shard, "server.hello")
    assert got[1] == (subjects.frame(shard, "guild.update"), line)
    writer.close()


async def test_a_wrong_token_closes_the_connection_and_is_not_logged(services, nc, unique):
    gateway = services.start("gateway", shard_token=TOKEN, shard_port="0")
    reader, writer = await _dial(_gateway_addr(gateway))
    wrong = "not-the-token-98765"
    hello = {"t": 1, "kind": "server.hello", "shard": "uo1", "protocol": 7, "token": wrong}
    writer.write(json.dumps(hello).encode() + b"\n")
    await writer.drain()
    # One line saying why, then the gateway closes.
    said = await asyncio.wait_for(reader.read(), 5)
    assert json.loads(said) == {"kind": "gateway.hello.refused", "reason": "server.hello: wrong or missing token"}
    assert said.endswith(b"\n") and said.count(b"\n") == 1
    await asyncio.sleep(0.2)
    log = gateway.log()
    assert "hello refused" in log
    assert wrong not in log and TOKEN not in log
