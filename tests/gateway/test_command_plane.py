"""The command plane: a request on shard.<shard>.cmd.<verb> reaches the shard as one line and
its answer comes back with a status (docs/gateway.md, "Commands" and "Statuses")."""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.errors import NoRespondersError

from shared import subjects
from tests.gateway.conftest import INTEREST_SETTLE_S, wait_until


async def ask(nc, shard: str, verb: str, body: object = None, *, raw: bytes | None = None,
              headers: dict | None = None, timeout: float = 5.0) -> dict:
    payload = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
    msg = await nc.request(subjects.command(shard, verb), payload, timeout=timeout, headers=headers)
    return json.loads(msg.data)


async def test_a_command_reaches_the_shard_with_its_fields_verbatim_and_a_fresh_req_id(
        gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    body = {"runId": "r1", "what": "creature", "idempotencyKey": {"odd": ["k", 1]}, "extra": "ü"}
    seen: list[dict] = []
    execute = sim.world.execute
    sim.world.execute = lambda verb, b: (seen.append(b), execute(verb, b))[1]
    first = await ask(nc, sim.shard, "world.spawn", body)
    body["idempotencyKey"] = "another"
    second = await ask(nc, sim.shard, "world.spawn", body)
    assert first["status"] == 200 and first["body"]["kind"] == "world.spawn.ok"
    assert seen[0]["idempotencyKey"] == {"odd": ["k", 1]} and seen[0]["extra"] == "ü"
    assert first["body"]["reqId"] != second["body"]["reqId"]


async def test_a_shard_with_no_connection_gets_no_responders_at_once(nc, unique):
    # No responders is the command plane's 503: nobody holds the shard, and nobody waits
    # (a wait would end in a TimeoutError, not this).
    with pytest.raises(NoRespondersError):
        await nc.request(subjects.command(f"gone{unique}", "world.save"), b"{}", timeout=5)


async def test_a_disconnected_shard_stops_answering_commands(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    assert (await ask(nc, sim.shard, "item.catalog"))["status"] == 200
    await sim.drop()
    await wait_until(lambda: sim.shard not in gateway.gateway.links)
    await asyncio.sleep(INTEREST_SETTLE_S)
    with pytest.raises(NoRespondersError):
        await ask(nc, sim.shard, "item.catalog")


@pytest.mark.parametrize("raw", [b"[1,2]", b'"text"', b"42", b"{not json"])
async def test_a_body_that_is_not_a_json_object_is_400(gateway, shard_sims, nc, unique, raw):
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "world.save", raw=raw)
    assert reply["status"] == 400 and "JSON object" in reply["error"]
    assert sim.executed["world.save"] == 0


async def test_an_empty_body_is_an_empty_object(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "item.catalog", raw=b"")
    assert reply["status"] == 200 and reply["body"]["kind"] == "item.catalog.ok"


async def test_a_staff_verb_without_an_actor_is_400_and_never_reaches_the_shard(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "admin.ban", {"account": "alice"})
    assert reply["status"] == 400 and "actor" in reply["error"]
    assert sim.executed["admin.ban"] == 0
    reply = await ask(nc, sim.shard, "admin.ban", {"account": "alice", "actor": "gm-tom"})
    assert reply["status"] == 200 and reply["body"]["kind"] == "admin.ok"
    assert sim.world.accounts["alice"]["banned"] is True


async def test_an_event_verb_needs_no_actor(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    assert (await ask(nc, sim.shard, "world.owned", {"runId": "r"}))["status"] == 200


async def test_a_shard_that_does_not_answer_in_time_is_504_and_its_late_reply_is_dropped(
        start_gateway, shard_sims, nc, unique):
    running = await start_gateway(command_timeout_s=0.3)
    sim = await shard_sims(running, f"s{unique}")
    sim.answer_delay_s["world.save"] = 0.6
    reply = await ask(nc, sim.shard, "world.save")
    assert reply["status"] == 504 and "did not answer" in reply["error"]
    sim.answer_delay_s.clear()
    # The late world.saved arrives while this call waits: it must not be taken as this answer.
    reply = await ask(nc, sim.shard, "item.catalog")
    assert reply["status"] == 200 and reply["body"]["kind"] == "item.catalog.ok"
    await asyncio.sleep(0.4)
    assert sim.executed["world.save"] == 1


async def test_a_caller_expecting_another_protocol_gets_409(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "item.catalog", headers={"Shard-Protocol": "8"})
    assert reply["status"] == 409 and "protocol 7" in reply["error"]
    reply = await ask(nc, sim.shard, "item.catalog", headers={"Shard-Protocol": "7"})
    assert reply["status"] == 200


async def test_a_shard_speaking_an_older_protocol_is_gated(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}", protocol=6)
    reply = await ask(nc, sim.shard, "world.save", headers={"Shard-Protocol": "7"})
    assert reply["status"] == 409
    assert sim.executed["world.save"] == 0


async def test_many_concurrent_commands_are_each_answered_with_their_own_reply(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    replies = await asyncio.gather(*(ask(nc, sim.shard, "world.spawn", {"runId": f"r{i}", "what": "npc"})
                                     for i in range(50)))
    assert [r["body"]["runId"] for r in replies] == [f"r{i}" for i in range(50)]


async def test_a_verb_the_gateway_has_never_heard_of_is_still_carried_to_the_shard(start_gateway, shard_sims, nc,
                                                                                   unique):
    # The forwarder property: the gateway keeps no list of verbs. The seed's shard answers no
    # verb its routes do not reach (nor does the simulator), so the caller gets the 504.
    running = await start_gateway(command_timeout_s=0.3)
    sim = await shard_sims(running, f"s{unique}")
    seen: list[str] = []
    execute = sim.world.execute
    sim.world.execute = lambda verb, b: (seen.append(verb), execute(verb, b))[1]
    reply = await ask(nc, sim.shard, "guild.rename", {"id": 7})
    assert reply["status"] == 504 and seen == ["guild.rename"]
