"""The shard simulator speaks protocol 7 as the sidecar seed quotes it
(docs/contracts.md, "Gateway command plane", and docs/gateway.md, "Statuses"): each verb as a
shard answers it, through a real gateway, with the statuses the seed maps them to, and no kind
or sentence of its own."""

from __future__ import annotations

import asyncio

from simulator.seed_wire import SENTENCE_EXAMPLES
from simulator.world import ShardWorld
from tests.gateway.test_command_plane import ask


async def test_world_spawn_owned_and_despawn_answer_removed_gone_and_refused(gateway, shard_sims, nc, unique):
    # Removed was found and deleted; gone was owned but already absent (a success); refused was
    # never this run's (docs/contracts.md, "Gateway command plane").
    sim = await shard_sims(gateway, f"s{unique}")
    spawned = await ask(nc, sim.shard, "world.spawn", {"runId": "42", "what": "creature", "count": 3,
                                                       "map": "Felucca", "x": 1, "y": 2})
    assert spawned["status"] == 200 and spawned["body"]["kind"] == "world.spawn.ok"
    serials = spawned["body"]["serials"]
    owned = await ask(nc, sim.shard, "world.owned", {"runId": "42"})
    assert owned["body"]["kind"] == "world.owned.ok"
    assert sorted(o["serial"] for o in owned["body"]["owned"]) == sorted(serials)
    sim.world.kill(serials[1])  # a player kills one
    other = await ask(nc, sim.shard, "world.despawn", {"runId": "77", "serials": [serials[2]]})
    assert other["status"] == 200 and other["body"]["refused"] == [serials[2]]
    gone = await ask(nc, sim.shard, "world.despawn", {"runId": "42", "serials": serials[:2]})
    assert (gone["body"]["removed"], gone["body"]["gone"], gone["body"]["refused"]) == ([serials[0]], [serials[1]], [])
    assert (await ask(nc, sim.shard, "world.owned", {"runId": "42"}))["body"]["owned"] == [
        {"serial": serials[2], "what": "creature"}]


async def test_a_despawn_with_no_serials_gives_back_everything_the_run_owns(gateway, shard_sims, nc, unique):
    # No serials at all means everything the run owns (docs/contracts.md, "Gateway command plane").
    sim = await shard_sims(gateway, f"s{unique}")
    serials = (await ask(nc, sim.shard, "world.spawn", {"runId": "42", "what": "decor", "count": 4}))["body"]["serials"]
    mine = (await ask(nc, sim.shard, "world.spawn", {"runId": "43", "what": "gate"}))["body"]["serials"]
    reply = await ask(nc, sim.shard, "world.despawn", {"runId": "42"})
    assert sorted(reply["body"]["removed"]) == sorted(serials)
    assert list(sim.world.objects) == mine


async def test_world_owned_prunes_what_the_world_lost_and_a_later_despawn_says_gone(gateway, shard_sims, nc,
                                                                                     unique):
    # The shard prunes rows whose object the world has lost as it walks (docs/contracts.md, "Gateway command plane").
    sim = await shard_sims(gateway, f"s{unique}")
    serial = (await ask(nc, sim.shard, "world.spawn", {"runId": "42", "what": "boss"}))["body"]["serials"][0]
    sim.world.kill(serial)
    owned = await ask(nc, sim.shard, "world.owned", {"runId": "42"})
    assert (owned["body"]["owned"], owned["body"]["pruned"]) == ([], 1)
    assert (await ask(nc, sim.shard, "world.despawn", {"runId": "42", "serials": [serial]}))["body"]["gone"] == [serial]


async def test_a_run_owning_nothing_is_an_empty_list_and_200(gateway, shard_sims, nc, unique):
    # A run owning nothing is an empty list and 200, never 404 (docs/contracts.md, "Gateway command plane").
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "world.owned", {"runId": "77"})
    assert reply["status"] == 200 and reply["body"] == {"t": reply["body"]["t"], "kind": "world.owned.ok",
                                                        "runId": "77", "owned": [], "pruned": 0,
                                                        "reqId": reply["body"]["reqId"]}


async def test_a_spawn_over_the_ceiling_or_of_a_what_not_placed_is_400_in_the_seeds_words(gateway, shard_sims, nc,
                                                                                            unique):
    sim = await shard_sims(gateway, f"s{unique}")
    over = await ask(nc, sim.shard, "world.spawn", {"runId": "42", "what": "creature", "count": 80})
    assert over["status"] == 400 and over["body"]["kind"] == "world.error" and over["body"]["action"] == "spawn"
    assert over["body"]["reason"] == SENTENCE_EXAMPLES["spawn over the ceiling"].value
    assert (await ask(nc, sim.shard, "world.spawn", {"runId": "42", "what": "dragon"}))["status"] == 400


async def test_a_lease_is_applied_listed_and_released_with_compare_and_set(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    applied = await ask(nc, sim.shard, "lease.apply", {"key": "PlayerCaps.SkillCap", "value": "1300",
                                                       "holdMs": 60_000, "runId": "42", "idempotencyKey": "a1"})
    assert applied["status"] == 200 and applied["body"]["kind"] == "lease.ok"
    listed = await ask(nc, sim.shard, "lease.list", {"key": "PlayerCaps.SkillCap"})
    assert listed["body"]["kind"] == "lease.list.ok"
    assert listed["body"]["leases"] == [{"key": "PlayerCaps.SkillCap", "current": "1300", "held": True}]
    assert [(h["key"], h["runId"], h["expired"]) for h in listed["body"]["holds"]] == [
        ("PlayerCaps.SkillCap", "42", False)]
    released = await ask(nc, sim.shard, "lease.release", {"key": "PlayerCaps.SkillCap", "expected": "1300",
                                                          "baseline": "1200", "idempotencyKey": "x1"})
    assert released["status"] == 200 and released["body"]["kind"] == "lease.ok"
    assert sim.world.value("PlayerCaps.SkillCap") == "1200"
    assert (await ask(nc, sim.shard, "lease.list", {}))["body"]["holds"] == []


async def test_a_value_staff_changed_by_hand_is_never_overwritten_and_answers_drifted_200(
        gateway, shard_sims, nc, unique):
    # lease.drifted: 200, the value left as somebody set it (docs/gateway.md, "Statuses").
    sim = await shard_sims(gateway, f"s{unique}")
    await ask(nc, sim.shard, "lease.apply", {"key": "Weather.Season", "value": "winter", "holdMs": 60_000})
    sim.world.set_value("Weather.Season", "autumn")  # a GM changes it by hand
    reply = await ask(nc, sim.shard, "lease.release", {"key": "Weather.Season", "expected": "winter",
                                                       "baseline": "summer", "idempotencyKey": "w1"})
    assert reply["status"] == 200 and reply["body"]["kind"] == "lease.drifted"
    assert reply["body"]["current"] == "autumn" and sim.world.value("Weather.Season") == "autumn"


async def test_a_lease_key_not_offered_is_404_and_a_hold_that_is_not_positive_400(gateway, shard_sims, nc, unique):
    # No such lease 404, a hold that is not positive 400 (docs/gateway.md, "Statuses").
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "lease.apply", {"key": "Loot.MaxProps", "value": "9", "holdMs": 5})
    assert reply["status"] == 404 and reply["body"]["reason"] == SENTENCE_EXAMPLES["no such lease"].value
    reply = await ask(nc, sim.shard, "lease.apply", {"key": "PlayerCaps.SkillCap", "value": "9", "holdMs": 0})
    assert reply["status"] == 400 and reply["body"]["reason"] == SENTENCE_EXAMPLES["hold must be positive"].value


async def test_at_its_deadline_the_baseline_comes_back_and_the_hold_is_listed_expired_until_collected(
        gateway, shard_sims, nc, unique):
    # A lease whose deadline fired stays listed, expired: true, until teardown collects its
    # verdict (docs/contracts.md, "Gateway command plane").
    sim = await shard_sims(gateway, f"s{unique}")
    await ask(nc, sim.shard, "lease.apply", {"key": "Loot.RareChance", "value": "3", "holdMs": 150, "runId": "42"})
    assert sim.world.value("Loot.RareChance") == "3"
    async with asyncio.timeout(5):
        while sim.world.value("Loot.RareChance") != "1":
            await asyncio.sleep(0.02)
    listed = (await ask(nc, sim.shard, "lease.list", {}))["body"]
    assert [(h["key"], h["expired"]) for h in listed["holds"]] == [("Loot.RareChance", True)]
    assert {"key": "Loot.RareChance", "current": "1", "held": True, "expired": True} in listed["leases"]
    collected = await ask(nc, sim.shard, "lease.release", {"key": "Loot.RareChance", "expected": "3",
                                                           "baseline": "1"})
    assert collected["body"]["kind"] == "lease.ok"
    assert (await ask(nc, sim.shard, "lease.list", {}))["body"]["holds"] == []


async def test_a_targeted_lease_is_one_row_per_target(gateway, shard_sims, nc, unique):
    # Spawner.MaxCount has no single current; key and target narrow it to one row
    # (docs/contracts.md, "Gateway command plane").
    sim = await shard_sims(gateway, f"s{unique}")
    await ask(nc, sim.shard, "lease.apply", {"key": "Spawner.MaxCount", "target": "0x4001", "value": "40",
                                             "holdMs": 60_000, "runId": "42"})
    whole = (await ask(nc, sim.shard, "lease.list", {}))["body"]
    assert {"key": "Spawner.MaxCount", "targeted": True, "current": None, "held": True} in whole["leases"]
    assert [(h["key"], h["target"]) for h in whole["holds"]] == [("Spawner.MaxCount", "0x4001")]
    one = (await ask(nc, sim.shard, "lease.list", {"key": "Spawner.MaxCount", "target": "0x4001"}))["body"]
    assert one["leases"] == [{"key": "Spawner.MaxCount", "current": "40", "held": True, "targeted": True,
                              "target": "0x4001"}]


async def test_participation_ledgers_and_item_grants(gateway, shard_sims, nc, unique):
    # A run never counted is 404; a counted run nobody attended is 200, granted 0
    # (docs/contracts.md, "Gateway command plane").
    sim = await shard_sims(gateway, f"s{unique}")
    not_counted = await ask(nc, sim.shard, "participation.snapshot", {"runId": "42"})
    assert not_counted["status"] == 404 and not_counted["body"]["reason"] == SENTENCE_EXAMPLES["run not counted"].value
    no_ledger = await ask(nc, sim.shard, "item.grant", {"runId": "42", "item": "gold", "amount": 5})
    assert no_ledger["status"] == 404
    assert no_ledger["body"]["reason"] == SENTENCE_EXAMPLES["no ledger for a grant"].value
    opened = await ask(nc, sim.shard, "participation.open", {"runId": "42", "map": "Felucca", "x": 1, "y": 1,
                                                             "radius": 30})
    assert opened["status"] == 200 and opened["body"]["kind"] == "participation.ok"
    empty = await ask(nc, sim.shard, "item.grant", {"runId": "42", "item": "gold", "amount": 5})
    assert empty["status"] == 200 and empty["body"]["kind"] == "item.grant.ok"
    assert (empty["body"]["granted"], empty["body"]["missed"]) == (0, [])
    sim.world.participate("42", "0x1", "Ada", "ada-acct")
    sim.world.participate("42", "0x2", "Bo")
    snap = await ask(nc, sim.shard, "participation.snapshot", {"runId": "42", "idempotencyKey": "snap-1"})
    assert snap["body"]["kind"] == "participation.snapshot.ok"
    assert [p["serial"] for p in snap["body"]["participants"]] == ["0x1", "0x2"]
    await ask(nc, sim.shard, "participation.close", {"runId": "42"})
    sim.world.participate("42", "0x3", "Cy")  # not counted once closed
    granted = await ask(nc, sim.shard, "item.grant", {"runId": "42", "item": "trophy", "amount": 1})
    assert granted["body"]["granted"] == 2
    refused = await ask(nc, sim.shard, "item.grant", {"runId": "42", "item": "castle", "amount": 1})
    assert refused["status"] == 400 and refused["body"]["reason"] == SENTENCE_EXAMPLES["not granted here"].value
    catalog = await ask(nc, sim.shard, "item.catalog")
    assert {"gold", "trophy"} <= {i["item"] for i in catalog["body"]["items"]}


async def test_a_save_too_soon_after_the_last_is_429_and_a_save_rides_the_stream(gateway, shard_sims, nc, unique):
    # world.save starts a save (its frames follow) and is rate limited: 429
    # (docs/contracts.md, "Gateway command plane").
    sim = await shard_sims(gateway, f"s{unique}", world=ShardWorld(save_interval_s=300))
    sent: list[str] = []
    send = sim.send
    sim.send = lambda kind, **fields: (sent.append(kind), send(kind, **fields))[1]
    assert (await ask(nc, sim.shard, "world.save", {"idempotencyKey": "save-1"}))["status"] == 200
    reply = await ask(nc, sim.shard, "world.save")
    assert reply["status"] == 429 and reply["body"]["kind"] == "oneshot.error"
    assert reply["body"]["reason"] == "this shard saves at most every 300 seconds, and the last save was 0 seconds ago"
    assert sent == ["world.save.before", "world.save.after"]


async def test_a_disabled_event_plane_is_403_on_every_event_verb(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}", world=ShardWorld(event_plane_enabled=False))
    for verb, kind in [("world.spawn", "world.error"), ("lease.apply", "lease.error"),
                       ("participation.open", "participation.error"), ("item.grant", "oneshot.error"),
                       ("world.save", "oneshot.error")]:
        reply = await ask(nc, sim.shard, verb, {"runId": "42", "what": "npc"})
        assert (reply["status"], reply["body"]["kind"]) == (403, kind), verb
        assert reply["body"]["reason"] == SENTENCE_EXAMPLES["event plane disabled"].value


async def test_a_repeated_keyed_command_is_replayed_not_executed_again(gateway, shard_sims, nc, unique):
    # The replay is the original answer, marked replayed, under a new reqId (docs/gateway.md, "Statuses").
    sim = await shard_sims(gateway, f"s{unique}")
    serial = (await ask(nc, sim.shard, "world.spawn", {"runId": "42", "what": "npc"}))["body"]["serials"][0]
    body = {"runId": "42", "serials": [serial], "idempotencyKey": "revert-1"}
    first = await ask(nc, sim.shard, "world.despawn", body)
    again = await ask(nc, sim.shard, "world.despawn", body)
    assert first["body"]["removed"] == again["body"]["removed"] == [serial]
    assert again["status"] == 200 and again["body"]["replayed"] is True and "replayed" not in first["body"]
    assert first["body"]["reqId"] != again["body"]["reqId"]
    assert (sim.executed["world.despawn"], sim.replayed["world.despawn"]) == (1, 1)


async def test_a_keyed_command_still_in_flight_answers_bridge_busy_425(gateway, shard_sims, nc, unique):
    # bridge.busy: nothing run, come back; its shape is {"kind":"bridge.busy"} (docs/gateway.md, "Statuses").
    sim = await shard_sims(gateway, f"s{unique}")
    sim.answer_delay_s["participation.snapshot"] = 0.5
    await ask(nc, sim.shard, "participation.open", {"runId": "42"})
    body = {"runId": "42", "idempotencyKey": "snap-busy"}
    slow = asyncio.create_task(ask(nc, sim.shard, "participation.snapshot", body))
    await asyncio.sleep(0.15)
    busy = await ask(nc, sim.shard, "participation.snapshot", body)
    assert busy["status"] == 425 and set(busy["body"]) == {"t", "kind", "reqId"}
    assert busy["body"]["kind"] == "bridge.busy"
    assert (await slow)["status"] == 200
    assert sim.executed["participation.snapshot"] == 1 and sim.busy["participation.snapshot"] == 1


async def test_staff_account_and_page_verbs_map_to_their_plane_statuses(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    assert (await ask(nc, sim.shard, "admin.ban", {"actor": "gm", "account": "admin"}))["status"] == 403
    assert (await ask(nc, sim.shard, "admin.unban", {"actor": "gm", "account": "nobody"}))["status"] == 404
    broadcast = await ask(nc, sim.shard, "admin.broadcast", {"actor": "gm", "text": "hi", "hue": 33})
    assert broadcast["status"] == 200 and sim.world.broadcasts == ["hi"]
    assert (await ask(nc, sim.shard, "account.create", {"account": "alice"}))["status"] == 409
    assert (await ask(nc, sim.shard, "account.create", {"account": "carol"}))["status"] == 200
    assert (await ask(nc, sim.shard, "account.unlink", {"account": "carol"}))["status"] == 404
    assert (await ask(nc, sim.shard, "account.link", {"account": "carol", "userId": 12}))["status"] == 200
    assert (await ask(nc, sim.shard, "account.unlink", {"account": "carol"}))["status"] == 200
    sim.world.page("p1", "bob", "stuck in a wall")
    pages = await ask(nc, sim.shard, "pages.list")
    assert pages["body"]["kind"] == "pages.list" and [p["id"] for p in pages["body"]["pages"]] == ["p1"]
    assert (await ask(nc, sim.shard, "pages.respond", {"id": "p1", "actor": "gm", "text": "freed"}))["status"] == 200
    assert (await ask(nc, sim.shard, "pages.list"))["body"]["pages"] == []


async def test_a_big_guild_roster_is_sent_in_chunks(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    sent: list[bytes] = []
    send_raw = sim.send_raw
    sim.send_raw = lambda data: (sent.append(data), send_raw(data))[1]
    await sim.send_guild(7, "Big", [{"serial": f"0x{i:x}", "name": f"m{i}"} for i in range(1200)], chunk=500)
    rosters = [line for line in sent if b'"guild.roster"' in line]
    assert len(rosters) == 3 and b'"id":7' in rosters[0]
    assert b'"seq":0' in rosters[0] and b'"more":true' in rosters[0] and b'"more":false' in rosters[2]


async def test_a_field_of_the_wrong_type_never_wedges_the_shard(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    reply = await ask(nc, sim.shard, "lease.apply", {"runId": "r", "key": {"a": 1}, "value": "2", "holdMs": 5})
    assert reply["status"] == 404
    assert (await ask(nc, sim.shard, "item.catalog"))["status"] == 200


async def test_only_the_seeds_verbs_are_answered_and_a_malformed_serials_despawns_nothing(gateway, shard_sims, nc,
                                                                                           unique):
    sim = await shard_sims(gateway, f"s{unique}")
    assert sim.world.execute("staff.target", {"account": "alice"}) is None  # an internal helper is no verb
    serials = (await ask(nc, sim.shard, "world.spawn", {"runId": "42", "what": "npc", "count": 2}))["body"]["serials"]
    reply = await ask(nc, sim.shard, "world.despawn", {"runId": "42", "serials": serials[0]})
    assert (reply["body"]["removed"], reply["body"]["refused"]) == ([], [])
    assert sorted(sim.world.objects) == sorted(serials)
