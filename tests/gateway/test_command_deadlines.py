"""The commands waiting for a shard's answers (the link's reqId map): one deadline sweeper gives
each its 504 at about its own timeout, a link that closes gives each its 503 at once, and a
link has room for ``max_pending_commands`` of them (503 beyond, naming the limit); a shard
that stops reading has its commands refused once too much waits to be written to it. No task,
no future and no timer per command (issue 15)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from nats.aio.msg import Msg

from services.gateway.commands.command_relay import UNSENT_LIMIT
from shared import subjects
from tests.gateway.conftest import INTEREST_SETTLE_S, TOKEN, wait_until


class Inbox:
    """Replies to commands published with one reply subject, each with when it arrived."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.subject = nc.new_inbox()
        self.replies: list[tuple[float, dict[str, Any], Msg]] = []

    async def open(self) -> Inbox:
        async def on_reply(msg: Msg) -> None:
            self.replies.append((time.monotonic(), json.loads(msg.data), msg))

        self.sub = await self.nc.subscribe(self.subject, cb=on_reply)
        await self.nc.flush()
        await asyncio.sleep(INTEREST_SETTLE_S)
        return self

    async def send(self, shard: str, verb: str, body: object = None) -> float:
        """Publish a command asking for a reply here; when it was sent."""
        sent = time.monotonic()
        await self.nc.publish(subjects.command(shard, verb), json.dumps(body or {}).encode(), reply=self.subject)
        await self.nc.flush()
        return sent


async def test_a_command_nobody_answers_gets_its_504_at_about_the_timeout(start_gateway, shard_sims, nc, unique):
    running = await start_gateway(command_timeout_s=0.5)
    sim = await shard_sims(running, f"s{unique}")
    sim.mute.add("world.save")
    inbox = await Inbox(nc).open()
    sent = await inbox.send(sim.shard, "world.save")
    await wait_until(lambda: len(inbox.replies) == 1)
    arrived, reply, _ = inbox.replies[0]
    assert reply == {"status": 504, "error": f"shard {sim.shard} did not answer world.save within 0.5 s"}
    assert 0.5 <= arrived - sent < 1.5, arrived - sent  # not early; late by the sweeper's grain only
    assert running.gateway.links[sim.shard].pending == {}


async def test_commands_sent_one_after_another_each_get_their_504_at_their_own_deadline(
        start_gateway, shard_sims, nc, unique):
    # One sweeper for all of them: each is answered at its own deadline, none early, none kept.
    running = await start_gateway(command_timeout_s=0.6)
    sim = await shard_sims(running, f"s{unique}")
    sim.mute.update({"world.save", "item.catalog"})
    inbox = await Inbox(nc).open()
    sent = []
    for i in range(4):
        sent.append(await inbox.send(sim.shard, "world.save" if i % 2 else "item.catalog", {"n": i}))
        await asyncio.sleep(0.25)
    await wait_until(lambda: len(inbox.replies) == 4)
    for (arrived, reply, _), at, verb in zip(inbox.replies, sent, ["item.catalog", "world.save"] * 2, strict=True):
        assert reply == {"status": 504, "error": f"shard {sim.shard} did not answer {verb} within 0.6 s"}
        assert 0.6 <= arrived - at < 1.6, arrived - at
    assert running.gateway.links[sim.shard].pending == {}


async def test_an_answer_in_time_is_not_also_answered_by_the_sweeper(start_gateway, shard_sims, nc, unique):
    running = await start_gateway(command_timeout_s=0.4)
    sim = await shard_sims(running, f"s{unique}")
    sim.answer_delay_s["world.save"] = 0.1
    inbox = await Inbox(nc).open()
    await inbox.send(sim.shard, "world.save")
    await wait_until(lambda: len(inbox.replies) == 1)
    await asyncio.sleep(0.6)  # past the deadline: nothing more comes
    assert [reply["status"] for _, reply, _ in inbox.replies] == [200]


async def test_every_command_waiting_on_a_link_that_closes_gets_its_503_at_once(start_gateway, shard_sims, nc,
                                                                                 unique):
    running = await start_gateway(command_timeout_s=30)
    sim = await shard_sims(running, f"s{unique}")
    sim.mute.add("world.save")
    inbox = await Inbox(nc).open()
    for i in range(5):
        await inbox.send(sim.shard, "world.save", {"n": i})
    link = running.gateway.links[sim.shard]
    await wait_until(lambda: len(link.pending) == 5)
    dropped = time.monotonic()
    await sim.drop()
    await wait_until(lambda: len(inbox.replies) == 5)
    for arrived, reply, _ in inbox.replies:
        assert reply["status"] == 503 and reply["error"].startswith(f"shard {sim.shard} disconnected (")
        assert reply["error"].endswith(") before answering")
        assert arrived - dropped < 5  # the disconnect, not the 30 s timeout
    assert link.pending == {}


async def test_commands_waiting_when_the_gateway_stops_get_their_503(start_gateway, shard_sims, nc, unique):
    running = await start_gateway(command_timeout_s=30)
    sim = await shard_sims(running, f"s{unique}")
    sim.mute.add("world.save")
    inbox = await Inbox(nc).open()
    await inbox.send(sim.shard, "world.save")
    await wait_until(lambda: bool(running.gateway.links[sim.shard].pending))
    await running.stack.aclose()  # the gateway stops; its NATS connection stays
    await wait_until(lambda: len(inbox.replies) == 1)
    assert inbox.replies[0][1] == {"status": 503,
                                   "error": f"shard {sim.shard} disconnected (gateway stopping) before answering"}


async def test_a_link_holds_at_most_max_pending_commands_and_refuses_more_with_a_503(start_gateway, shard_sims, nc,
                                                                                      unique):
    running = await start_gateway(command_timeout_s=1.0, max_pending_commands=3)
    sim = await shard_sims(running, f"s{unique}")
    sim.mute.add("world.save")
    inbox = await Inbox(nc).open()
    for i in range(3):
        await inbox.send(sim.shard, "world.save", {"n": i})
    link = running.gateway.links[sim.shard]
    await wait_until(lambda: len(link.pending) == 3 and sim.executed["world.save"] == 3)
    for verb in ("world.save", "item.catalog"):  # the limit is the link's, whatever the verb
        reply = json.loads((await nc.request(subjects.command(sim.shard, verb), b"{}", timeout=5)).data)
        assert reply == {"status": 503, "error": f"shard {sim.shard} already has 3 commands waiting for its answers "
                                                 f"(the gateway's limit, SHARDBUS_MAX_PENDING_COMMANDS); try again "
                                                 f"once some are answered"}
    assert sim.executed["world.save"] == 3 and sim.executed["item.catalog"] == 0  # never reached the shard
    assert len(link.pending) == 3
    await wait_until(lambda: len(inbox.replies) == 3)  # their 504s free the room
    assert {reply["status"] for _, reply, _ in inbox.replies} == {504}
    reply = json.loads((await nc.request(subjects.command(sim.shard, "item.catalog"), b"{}", timeout=5)).data)
    assert reply["status"] == 200 and reply["body"]["kind"] == "item.catalog.ok"


async def test_a_flood_of_callers_never_grows_the_req_id_map_past_the_limit(start_gateway, shard_sims, nc, unique):
    running = await start_gateway(command_timeout_s=2.0, max_pending_commands=20)
    sim = await shard_sims(running, f"s{unique}")
    sim.mute.add("world.save")
    link = running.gateway.links[sim.shard]
    most = [0]
    inbox = await Inbox(nc).open()
    for i in range(200):
        await nc.publish(subjects.command(sim.shard, "world.save"), b"{}", reply=inbox.subject)
        if i % 10 == 0:
            await nc.flush()
            most[0] = max(most[0], len(link.pending))
    await wait_until(lambda: len(inbox.replies) == 200)
    statuses = [reply["status"] for _, reply, _ in inbox.replies]
    assert statuses.count(504) == 20 and statuses.count(503) == 180, statuses
    assert most[0] <= 20 and sim.executed["world.save"] == 20


async def test_no_task_is_started_per_command(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    sim.mute.add("item.catalog")  # a verb whose execution sends no frames (no task in the simulator)
    tasks_before = len(asyncio.all_tasks())
    inbox = await Inbox(nc).open()
    for _ in range(30):
        await inbox.send(sim.shard, "item.catalog")
    link = gateway.gateway.links[sim.shard]
    await wait_until(lambda: len(link.pending) == 30)
    # The deadline sweeper (one per gateway) and the inbox's subscription at most.
    assert len(asyncio.all_tasks()) <= tasks_before + 2


async def test_a_reply_carries_the_request_headers_back_as_before(gateway, shard_sims, nc, unique):
    # Msg.respond sent the request's headers with the reply; the reqId map keeps them for it.
    sim = await shard_sims(gateway, f"s{unique}")
    msg = await nc.request(subjects.command(sim.shard, "item.catalog"), b"{}", timeout=5,
                           headers={"Shard-Protocol": "7", "X-Trace": "t1"})
    assert msg.data.startswith(b'{"status":200,"body":{')
    assert msg.headers == {"Shard-Protocol": "7", "X-Trace": "t1"}
    refused = await nc.request(subjects.command(sim.shard, "item.catalog"), b"{}", timeout=5,
                               headers={"Shard-Protocol": "8"})
    assert json.loads(refused.data)["status"] == 409 and refused.headers == {"Shard-Protocol": "8"}


async def test_commands_for_a_shard_that_stops_reading_are_refused_once_its_backlog_is_too_big(
        gateway, nc, unique):
    # A shard that keeps its connection but reads nothing: the command lines would pile up in the
    # gateway's memory. Past UNSENT_LIMIT bytes waiting, a command gets a 503 at once.
    shard = f"r{unique}"
    _reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(json.dumps({"t": 1, "kind": "server.hello", "shard": shard, "protocol": 7,
                             "token": TOKEN}).encode() + b"\n")
    await writer.drain()
    try:
        await wait_until(lambda: shard in gateway.gateway.links)
        await asyncio.sleep(INTEREST_SETTLE_S)
        inbox = await Inbox(nc).open()
        for _ in range(60):  # 30 MB: far past the limit and any socket buffer
            await inbox.send(shard, "item.catalog", {"pad": "p" * 500_000})
        await wait_until(lambda: bool(inbox.replies))
        refusal = inbox.replies[0][1]
        assert refusal["status"] == 503, refusal
        assert refusal["error"].startswith(f"shard {shard} is not reading what the gateway writes to it (")
        assert gateway.gateway.links[shard].unsent_bytes() <= UNSENT_LIMIT + 1_000_000
    finally:
        writer.close()
