"""The door's NATS calls share one reply subscription (nats-py's request mux: every call's reply
subject is ``<one wildcard inbox>.<token>``), over real HTTP and a real nats-server: many
concurrent calls each get their own reply, one that times out disturbs none of the others, and
the mux works on after NATS restarts. The test's subscriber stands in for the gateway."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import nats

from tests.gateway.conftest import wait_until
from tests.gateway.test_no_loss import own_nats  # noqa: F401 — a fixture

CALLS = 64


async def gateway_standin(nc: nats.NATS, shard: str, replies: list[str], silent: str = "") -> Any:
    """Answers ``world.spawn`` with the request's own ``tag``, after a random pause (so replies
    come back out of order); never answers a request whose tag is ``silent``."""

    async def answer(msg: Any) -> None:
        replies.append(msg.reply)
        tag = json.loads(msg.data)["tag"]
        if tag == silent:
            return
        await asyncio.sleep(random.uniform(0, 0.05))
        await msg.respond(json.dumps({"status": 200, "body": ok(tag)[1]}).encode())

    async def spread(msg: Any) -> None:
        asyncio.get_running_loop().create_task(answer(msg))

    sub = await nc.subscribe(f"shard.{shard}.cmd.world.spawn", cb=spread)
    await nc.flush()
    return sub


async def spawn_all(http: Any, shard: str, tags: list[str]) -> list[tuple[int, Any]]:
    async def one(tag: str) -> tuple[int, Any]:
        response = await http.post(f"/shards/{shard}/world", json={"tag": tag})
        return response.status_code, response.json()

    return list(await asyncio.gather(*(one(t) for t in tags)))


def ok(tag: str) -> tuple[int, dict[str, str]]:
    """The answer to the call tagged ``tag``: the shard's line, passed on."""
    return 200, {"kind": "world.spawned", "reqId": tag, "tag": tag}


def one_inbox(replies: list[str]) -> bool:
    """Every reply subject under one wildcard subscription: same prefix, a token each."""
    prefixes = {r.rsplit(".", 1)[0] for r in replies}
    return len(prefixes) == 1 and len(set(replies)) == len(replies)


async def test_concurrent_calls_each_get_their_own_reply_through_one_inbox(start_door, nc, unique):
    door = await start_door()
    replies: list[str] = []
    await gateway_standin(nc, f"s{unique}", replies)
    tags = [f"t{i}" for i in range(CALLS)]
    async with door.client() as http:
        answers = await spawn_all(http, f"s{unique}", tags)
    assert answers == [ok(t) for t in tags]
    assert len(replies) == CALLS and one_inbox(replies)


async def test_a_call_that_times_out_disturbs_none_of_the_others(start_door, nc, unique):
    door = await start_door(web_request_timeout_s=1.0)
    replies: list[str] = []
    await gateway_standin(nc, f"s{unique}", replies, silent="t7")
    tags = [f"t{i}" for i in range(CALLS)]
    async with door.client() as http:
        answers = await spawn_all(http, f"s{unique}", tags)
        assert answers == [(504, {"error": "shard did not reply in time"}) if t == "t7" else ok(t)
                           for t in tags]
        after = await spawn_all(http, f"s{unique}", ["u1", "u2"])  # and the mux serves on
    assert after == [ok("u1"), ok("u2")]
    assert one_inbox(replies)


async def test_the_mux_works_on_after_nats_restarts(own_nats, start_door, unique):  # noqa: F811
    servers, restart = own_nats
    url = servers[0].url
    door = await start_door(nats_url=url)
    standin = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2, connect_timeout=5)
    try:
        replies: list[str] = []
        await gateway_standin(standin, f"s{unique}", replies)
        async with door.client() as http:
            assert await spawn_all(http, f"s{unique}", ["a", "b"]) == [ok("a"), ok("b")]
            reconnects = (door.nc.stats["reconnects"], standin.stats["reconnects"])
            restart()
            await wait_until(lambda: door.nc.is_connected and standin.is_connected
                             and (door.nc.stats["reconnects"], standin.stats["reconnects"]) > reconnects,
                             timeout=30)
            await wait_until(lambda: standin.stats["reconnects"] > reconnects[1], timeout=30)
            await standin.flush(timeout=5)
            tags = [f"t{i}" for i in range(CALLS)]
            answers = await spawn_all(http, f"s{unique}", tags)
        assert answers == [ok(t) for t in tags]
        assert one_inbox(replies[2:])
    finally:
        await standin.close()
