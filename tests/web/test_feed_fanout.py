"""The feed's fan-out (services/web/feed/fanout.py) over real WebSocket and a real nats-server:
clients with the same filter share one JetStream consumer and each gets every event in order;
a slow one is detached, then dropped with the usual reason, while the others get everything;
other filters get only theirs; resuming with ``since`` beside a live group loses nothing."""

# ruff: noqa: F811 — the fixtures imported from test_feed.py are parameters of every test

from __future__ import annotations

import asyncio
import json
import re
from typing import Any
from urllib.parse import urlencode

from websockets.asyncio.client import ClientConnection

from tests.gateway.conftest import wait_until
from tests.web.conftest import WEBSITE_TOKEN
from tests.web.test_feed import (  # noqa: F401 — fixtures
    WAIT_S,
    StalledClient,
    consumers,
    events_until,
    feed_door,
    hub,
    next_event,
    sockets,
)


async def publish(nc: Any, shard: str, first: int, count: int, pad: str = "") -> None:
    for i in range(first, first + count):
        await nc.publish(f"shard.{shard}.frame.mob.killed", json.dumps({"i": i, "pad": pad}).encode())
    await nc.flush()


async def numbers(ws: ClientConnection, count: int, timeout: float = WAIT_S) -> list[int]:
    """The ``i`` of the next ``count`` frames."""
    return [e["data"]["i"] for e in await events_until(ws, lambda g: len(g) == count, timeout)]


async def test_clients_with_one_filter_share_one_consumer_and_each_gets_every_event_in_order(
        feed_door, sockets, nc, unique):
    door = await feed_door()
    query = {"types": "frame", "shards": f"s{unique}"}
    clients = [await sockets(door, query) for _ in range(3)]
    for ws in clients:
        assert (await next_event(ws))["type"] == "hello"
    assert await consumers(nc, door.settings.web_feed_stream) == 1
    (group,) = hub(door).groups.values()
    assert len(group.members) == 3 and group.reader.created == 1

    await publish(nc, f"s{unique}", 0, 300)
    for ws in clients:
        assert await numbers(ws, 300) == list(range(300))


async def test_clients_with_other_filters_get_only_theirs(feed_door, sockets, nc, unique):
    door = await feed_door()
    a1, b, a2 = [await sockets(door, {"types": "frame", "shards": f"{s}{unique}"}) for s in ("a", "b", "a")]
    for ws in (a1, b, a2):
        await next_event(ws)
    assert await consumers(nc, door.settings.web_feed_stream) == 2
    await publish(nc, f"a{unique}", 0, 5)
    await publish(nc, f"b{unique}", 100, 5)
    await publish(nc, f"a{unique}", 5, 5)
    assert await numbers(a1, 10) == await numbers(a2, 10) == list(range(10))
    got = await events_until(b, lambda g: len(g) == 5)
    assert [(e["shard"], e["data"]["i"]) for e in got] == [(f"b{unique}", i) for i in range(100, 105)]


async def test_a_slow_client_sharing_a_consumer_is_dropped_and_the_others_get_everything(feed_door, sockets, nc,
                                                                                        unique):
    door = await feed_door(web_feed_queue_bytes=64 * 1024, web_feed_queue_messages=1000, web_feed_stall_s=1.0)
    shard = f"s{unique}"
    query = {"types": "frame", "shards": shard}
    stalled = StalledClient(door, "/ws?" + urlencode({"token": WEBSITE_TOKEN, **query}))
    try:
        await stalled.open()  # the hello; from now on it reads nothing
        readers = [await sockets(door, query) for _ in range(2)]
        for ws in readers:
            await next_event(ws)
        assert len(next(iter(hub(door).groups.values())).members) == 3
        got: list[list[int]] = [[], []]

        async def read(index: int, ws: ClientConnection) -> None:
            while True:
                got[index].append(json.loads(await ws.recv())["data"]["i"])

        tasks = [asyncio.create_task(read(i, ws)) for i, ws in enumerate(readers)]
        sent = 0
        try:
            async with asyncio.timeout(30):
                while not hub(door).dropped:
                    await publish(nc, shard, sent, 50, "x" * 2000)
                    sent += 50
                    await asyncio.sleep(0.02)
            await wait_until(lambda: all(len(g) == sent for g in got), timeout=WAIT_S)
        finally:
            for task in tasks:
                task.cancel()
        assert got == [list(range(sent))] * 2
        (dropped,) = hub(door).dropped  # the slow one only: no other client was held up into a drop
        assert re.fullmatch(r"too slow: \d+ KiB queued, none taken for 1 s; resume with since=\d+", dropped.dropped)
        assert dropped.transport == "ws" and hub(door).drops == 1
        assert dropped.queue.peak_bytes <= 64 * 1024
        await stalled.read_to_end()
        close = stalled.websocket.close_rcvd if stalled.websocket else None
        assert close is not None and (close.code, close.reason) == (1008, dropped.dropped)
    finally:
        stalled.sock.close()


async def test_resuming_beside_a_live_group_loses_and_repeats_nothing(feed_door, sockets, nc, unique):
    door = await feed_door()
    shard = f"s{unique}"
    query = {"types": "frame", "shards": shard}
    live, leaving = await sockets(door, query), await sockets(door, query)
    await next_event(live), await next_event(leaving)
    await publish(nc, shard, 0, 5)
    seen = await events_until(leaving, lambda g: len(g) == 5)
    await leaving.close()
    await publish(nc, shard, 5, 5)  # the group reads on past the leaver's cursor
    assert await numbers(live, 10) == list(range(10))

    again = await sockets(door, {**query, "since": seen[-1]["seq"]})
    hello = await next_event(again)
    assert (hello["seq"], hello["gap"]) == (seen[-1]["seq"], False)
    seen += await events_until(again, lambda g: len(g) == 5)
    await publish(nc, shard, 10, 5)  # then live, on the same socket
    seen += await events_until(again, lambda g: len(g) == 5)
    assert [e["data"]["i"] for e in seen] == list(range(15))
    assert [e["seq"] for e in seen] == sorted({e["seq"] for e in seen})
    assert await numbers(live, 5) == list(range(10, 15))


async def test_the_last_client_of_a_group_takes_its_consumer_with_it(feed_door, sockets, nc, unique):
    door = await feed_door()
    clients = [await sockets(door, {"types": "frame", "shards": f"s{unique}"}) for _ in range(2)]
    for ws in clients:
        await next_event(ws)
    await clients[0].close()
    await wait_until(lambda: len(hub(door).clients) == 1, timeout=WAIT_S)
    assert await consumers(nc, door.settings.web_feed_stream) == 1
    await clients[1].close()
    await wait_until(lambda: not hub(door).clients and not hub(door).groups, timeout=WAIT_S)
    async with asyncio.timeout(WAIT_S):
        while await consumers(nc, door.settings.web_feed_stream):
            await asyncio.sleep(0.05)
