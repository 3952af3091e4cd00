"""The shard simulator speaks protocol 7 honestly: each verb as a shard answers it, through a
real gateway, with the statuses SPEC section 2 maps them to."""

from __future__ import annotations

import asyncio

from simulator.world import ShardWorld
from tests.gateway.test_command_plane import ask


async def test_world_spawn_owned_and_despawn_answer_removed_gone_and_refused(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    spawned = await ask(nc, sim.shard, "world.spawn", {"runId": "r1", "what": "creature", "count": 3})
    refs = spawned["body"]["refs"]
    owned = await ask(nc, sim.shard, "world.owned", {"runId": "r1"})
    assert sorted(i["ref"] for i in owned["body"]["items"]) == sorted(refs)
    sim.world.kill(refs[1])  # a player kills one
    results = [(await ask(nc, sim.shard, "world.despawn", {"runId": "r1", "ref": ref}))["body"]["result"]
               for ref in refs[:2]]
    assert results == ["removed", "gone"]
    other = await ask(nc, sim.shard, "world.despawn", {"runId": "r2", "ref": refs[2]})
    assert other["status"] == 200 and other["body"]["result"] == "refused"
    assert (await ask(nc, sim.shard, "world.owned", {"runId": "r1"}))["body"]["items"] == [
        {"ref": refs[2], "what": "creature"}]


async def test_a_run_owning_nothing_is_an_empty_list_and_200(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "world.owned", {"runId": "nothing"})
    assert reply["status"] == 200 and reply["body"]["items"] == []


async def test_a_spawn_over_the_ceiling_or_of_an_unknown_what_is_400(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}", world=ShardWorld(spawn_ceiling=2))
    assert (await ask(nc, sim.shard, "world.spawn", {"runId": "r", "what": "boss", "count": 3}))["status"] == 400
    assert (await ask(nc, sim.shard, "world.spawn", {"runId": "r", "what": "dragon"}))["status"] == 400


async def test_a_lease_is_applied_listed_and_released_with_compare_and_set(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    applied = await ask(nc, sim.shard, "lease.apply",
                        {"runId": "r1", "key": "spawn.rate", "value": "2", "holdMs": 60_000, "idempotencyKey": "a1"})
    assert applied["status"] == 200 and applied["body"]["baseline"] == "1"
    listed = await ask(nc, sim.shard, "lease.list", {"key": "spawn.rate"})
    assert [(i["key"], i["value"], i["runId"]) for i in listed["body"]["items"]] == [("spawn.rate", "2", "r1")]
    released = await ask(nc, sim.shard, "lease.release", {"runId": "r1", "key": "spawn.rate", "expected": "2",
                                                          "baseline": "1", "idempotencyKey": "x1"})
    assert released["status"] == 200 and released["body"]["kind"] == "lease.released"
    assert sim.world.value("spawn.rate") == "1"
    assert (await ask(nc, sim.shard, "lease.list", {}))["body"]["items"] == []


async def test_a_value_staff_changed_by_hand_is_never_overwritten_and_answers_drifted_200(
        gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    await ask(nc, sim.shard, "lease.apply", {"runId": "r1", "key": "weather", "value": "storm", "holdMs": 60_000})
    sim.world.set_value("weather", "snow")  # a GM changes it by hand
    reply = await ask(nc, sim.shard, "lease.release", {"runId": "r1", "key": "weather", "expected": "storm",
                                                       "baseline": "clear", "idempotencyKey": "w1"})
    assert reply["status"] == 200 and reply["body"]["kind"] == "lease.drifted"
    assert reply["body"]["current"] == "snow" and sim.world.value("weather") == "snow"


async def test_a_lease_key_not_offered_is_404(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "lease.apply", {"runId": "r", "key": "gravity", "value": "0", "holdMs": 5})
    assert reply["status"] == 404 and "no lease offered" in reply["body"]["reason"]


async def test_the_baseline_is_restored_at_the_lease_deadline(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    await ask(nc, sim.shard, "lease.apply", {"runId": "r1", "key": "loot.multiplier", "value": "3", "holdMs": 150})
    assert sim.world.value("loot.multiplier") == "3"
    async with asyncio.timeout(5):
        while sim.world.value("loot.multiplier") != "1":
            await asyncio.sleep(0.02)
    assert (await ask(nc, sim.shard, "lease.list", {}))["body"]["items"] == []


async def test_participation_ledgers_and_item_grants(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    assert (await ask(nc, sim.shard, "participation.snapshot", {"runId": "r1"}))["status"] == 404
    assert (await ask(nc, sim.shard, "item.grant", {"runId": "r1", "item": "gold"}))["status"] == 404
    assert (await ask(nc, sim.shard, "participation.open", {"runId": "r1"}))["status"] == 200
    empty = await ask(nc, sim.shard, "item.grant", {"runId": "r1", "item": "gold"})
    assert empty["status"] == 200 and empty["body"]["granted"] == 0
    sim.world.participate("r1", "alice", 5)
    sim.world.participate("r1", "bob")
    snap = await ask(nc, sim.shard, "participation.snapshot", {"runId": "r1"})
    assert snap["body"]["participants"] == [{"name": "alice", "points": 5}, {"name": "bob", "points": 1}]
    await ask(nc, sim.shard, "participation.close", {"runId": "r1"})
    sim.world.participate("r1", "carol")  # not counted once closed
    granted = await ask(nc, sim.shard, "item.grant", {"runId": "r1", "item": "trophy"})
    assert granted["body"]["granted"] == 2
    catalog = await ask(nc, sim.shard, "item.catalog")
    assert {"gold", "trophy"} <= {i["id"] for i in catalog["body"]["items"]}


async def test_a_save_too_soon_after_the_last_is_429(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}", world=ShardWorld(save_interval_s=60))
    assert (await ask(nc, sim.shard, "world.save"))["status"] == 200
    reply = await ask(nc, sim.shard, "world.save")
    assert reply["status"] == 429 and "too soon" in reply["body"]["reason"]


async def test_a_disabled_event_plane_is_403(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}", world=ShardWorld(event_plane_enabled=False))
    assert (await ask(nc, sim.shard, "world.spawn", {"runId": "r", "what": "npc"}))["status"] == 403


async def test_a_repeated_keyed_command_is_replayed_not_executed_again(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    spawned = await ask(nc, sim.shard, "world.spawn", {"runId": "r1", "what": "npc"})
    ref = spawned["body"]["refs"][0]
    body = {"runId": "r1", "ref": ref, "idempotencyKey": "revert-1"}
    first = await ask(nc, sim.shard, "world.despawn", body)
    again = await ask(nc, sim.shard, "world.despawn", body)
    assert first["body"]["result"] == again["body"]["result"] == "removed"
    assert again["status"] == 200 and again["body"]["replayed"] is True and "replayed" not in first["body"]
    assert (sim.executed["world.despawn"], sim.replayed["world.despawn"]) == (1, 1)


async def test_a_keyed_command_still_in_flight_answers_bridge_busy_425(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    sim.answer_delay_s["lease.apply"] = 0.5
    body = {"runId": "r1", "key": "skill.gain", "value": "2", "holdMs": 60_000, "idempotencyKey": "k-busy"}
    slow = asyncio.create_task(ask(nc, sim.shard, "lease.apply", body))
    await asyncio.sleep(0.15)
    busy = await ask(nc, sim.shard, "lease.apply", body)
    assert busy["status"] == 425 and busy["body"]["kind"] == "bridge.busy"
    assert (await slow)["status"] == 200
    assert sim.executed["lease.apply"] == 1 and sim.busy["lease.apply"] == 1


async def test_staff_and_account_verbs_map_to_their_plane_statuses(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    assert (await ask(nc, sim.shard, "admin.ban", {"actor": "gm", "account": "admin"}))["status"] == 403
    assert (await ask(nc, sim.shard, "admin.unban", {"actor": "gm", "account": "nobody"}))["status"] == 404
    assert (await ask(nc, sim.shard, "admin.broadcast", {"actor": "gm", "message": "hi"}))["status"] == 200
    assert (await ask(nc, sim.shard, "account.create", {"name": "alice"}))["status"] == 409
    for i in range(3):
        assert (await ask(nc, sim.shard, "account.create", {"name": f"n{i}", "ip": "10.0.0.1"}))["status"] == 200
    assert (await ask(nc, sim.shard, "account.create", {"name": "n9", "ip": "10.0.0.1"}))["status"] == 429


async def test_a_big_guild_roster_is_sent_in_chunks(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}", sequenced=False)
    sent: list[bytes] = []
    send_raw = sim.send_raw
    sim.send_raw = lambda data: (sent.append(data), send_raw(data))[1]
    await sim.send_guild(7, "Big", [{"id": i, "name": f"m{i}"} for i in range(1200)], chunk=500)
    rosters = [line for line in sent if b'"guild.roster"' in line]
    assert len(rosters) == 3 and b'"more":true' in rosters[0] and b'"more":false' in rosters[2]


async def test_fields_of_the_wrong_type_are_a_400_and_the_shard_carries_on(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "lease.apply", {"runId": "r", "key": {"a": 1}, "value": "2", "holdMs": 5})
    assert reply["status"] == 400
    assert (await ask(nc, sim.shard, "item.catalog"))["status"] == 200
