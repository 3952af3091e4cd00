"""Gateway processes scale out: each replica answers commands only for the shards it holds,
and ``gateway.status`` is answered by every replica. Also the ``shardbus shard-sim`` command."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
from nats.errors import NoRespondersError

from shardbus.embedded import stop_process
from shared import subjects
from simulator.shard import ShardSimulator
from tests.gateway.conftest import TOKEN

TOKEN_SETTINGS = {"shard_token": TOKEN, "shard_port": "0"}


def shard_port(proc) -> int:
    for line in proc.log().splitlines():
        if '"listening for shards"' in line:
            return int(json.loads(line)["addr"].rsplit(":", 1)[1])
    raise AssertionError(f"gateway did not say where it listens:\n{proc.log()}")


async def gather_replies(nc, subject: str, wait: float = 0.5) -> list[dict]:
    """Every reply to one request within ``wait`` seconds (a scatter-gather request)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subject, b"{}", reply=inbox)
    replies = []
    try:
        while True:
            replies.append(json.loads((await sub.next_msg(timeout=wait)).data))
    except Exception:
        pass
    await sub.unsubscribe()
    return replies


async def test_two_gateways_each_answer_only_for_their_own_shard(services, nc, unique):
    first = services.start("gateway", **TOKEN_SETTINGS)
    second = services.start("gateway", **TOKEN_SETTINGS)
    a = ShardSimulator("127.0.0.1", shard_port(first), f"a{unique}", TOKEN)
    b = ShardSimulator("127.0.0.1", shard_port(second), f"b{unique}", TOKEN)
    await a.connect()
    await b.connect()
    try:
        async with asyncio.timeout(10):
            while True:
                held = {s["shard"] for r in await gather_replies(nc, subjects.GATEWAY_STATUS)
                        for s in r.get("shards", [])}
                if {a.shard, b.shard} <= held:
                    break
        for _ in range(5):
            for sim in (a, b):
                msg = await nc.request(subjects.command(sim.shard, "item.catalog"), b"{}", timeout=5)
                assert json.loads(msg.data)["status"] == 200
        assert a.executed["item.catalog"] == 5 and b.executed["item.catalog"] == 5
        replies = await gather_replies(nc, subjects.GATEWAY_STATUS)
        assert {r["status"] for r in replies} == {200}  # an integer on the wire (FastStream's encoding)
        holders = {s["shard"]: r for r in replies for s in r.get("shards", [])}
        assert holders[a.shard] is not holders[b.shard]
        with pytest.raises(NoRespondersError):
            await nc.request(subjects.command(f"z{unique}", "item.catalog"), b"{}", timeout=5)
    finally:
        await a.close()
        await b.close()


async def test_the_shard_sim_command_connects_and_answers_commands(services, nc, unique, tmp_path):
    gateway = services.start("gateway", **TOKEN_SETTINGS)
    shard = f"cli{unique}"
    env = {**os.environ, "SHARDBUS_SHARD_TOKEN": TOKEN}
    with open(tmp_path / "shard-sim.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "shardbus", "shard-sim", "--addr",
                                 f"127.0.0.1:{shard_port(gateway)}", "--shard", shard],
                                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        async with asyncio.timeout(15):
            while True:
                try:
                    msg = await nc.request(subjects.command(shard, "world.spawn"),
                                           json.dumps({"runId": "r", "what": "gate"}).encode(), timeout=2)
                    break
                except NoRespondersError:
                    await asyncio.sleep(0.1)
        assert json.loads(msg.data)["status"] == 200
        assert TOKEN not in (tmp_path / "shard-sim.log").read_text()
    finally:
        assert stop_process(proc, signal.SIGINT, 10) is not None
