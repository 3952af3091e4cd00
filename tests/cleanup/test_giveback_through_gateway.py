"""Giving one row back through the real gateway to the shard simulator (and to module revert
subjects over real NATS): what each kind of answer becomes, and that the idempotency key makes
a repeat a replay at the shard, never a second execution."""

from __future__ import annotations

from services.cleanup import giveback
from services.cleanup.classify import Verdict
from services.cleanup.requester import NatsRequester
from tests.cleanup.conftest import Shard, connect_shard

TIMEOUT_S = 5.0


def _row(run_id: str, resource_id: int, kind: str, ref: str, module: str = "arena", **revert) -> dict:
    return {"resourceId": resource_id, "runId": run_id, "module": module, "kind": kind, "ref": ref,
            "status": "reverting", "attempts": 0, "revert": revert}


async def _spawn(shard: Shard, run_id: str, count: int, what: str = "creature") -> list[str]:
    reply = await shard.command("world.spawn", {"runId": run_id, "what": what, "count": count})
    assert reply["status"] == 200, reply
    assert reply["body"]["kind"] == "world.spawn.ok", reply
    return reply["body"]["serials"]


async def test_a_live_creature_is_despawned_and_a_killed_one_counts_as_given_back(shard, nc):
    live, killed, bystander = await _spawn(shard, "run-a", 3)
    shard.world.kill(killed)
    requester = NatsRequester(nc)
    assert (await giveback.give_back(requester, _row("run-a", 1, "creature", live), shard.id, TIMEOUT_S)).verdict \
        is Verdict.REVERTED
    assert (await giveback.give_back(requester, _row("run-a", 2, "creature", killed), shard.id, TIMEOUT_S)).verdict \
        is Verdict.REVERTED
    assert live not in shard.world.objects and killed not in shard.world.objects
    # One row, one serial: the run's other creature is not despawned with it.
    assert shard.world.objects[bystander].present


async def test_a_creature_despawned_once_already_is_gone_when_asked_again_under_another_key(shard, nc):
    (ref,) = await _spawn(shard, "run-a", 1)
    requester = NatsRequester(nc)
    assert (await giveback.give_back(requester, _row("run-a", 1, "creature", ref), shard.id, TIMEOUT_S)).verdict \
        is Verdict.REVERTED
    again = await giveback.give_back(requester, _row("run-a", 2, "creature", ref), shard.id, TIMEOUT_S)
    assert again.verdict is Verdict.REVERTED
    assert shard.sim.executed["world.despawn"] == 2 and shard.sim.replayed["world.despawn"] == 0


async def test_giving_the_same_row_back_twice_executes_once_and_replays_once(shard, nc):
    (ref,) = await _spawn(shard, "run-a", 1)
    requester, row = NatsRequester(nc), _row("run-a", 7, "gate", ref)
    first = await giveback.give_back(requester, row, shard.id, TIMEOUT_S)
    again = await giveback.give_back(requester, {**row, "attempts": 1}, shard.id, TIMEOUT_S)
    assert first.verdict is again.verdict is Verdict.REVERTED
    assert shard.sim.executed["world.despawn"] == 1
    assert shard.sim.replayed["world.despawn"] == 1


async def test_another_runs_object_is_refused_and_stays(shard, nc):
    (ref,) = await _spawn(shard, "run-owner", 1)
    outcome = await giveback.give_back(NatsRequester(nc), _row("run-thief", 3, "creature", ref), shard.id, TIMEOUT_S)
    assert outcome.verdict is Verdict.FAILED
    assert "never this run's" in outcome.reason and ref in outcome.reason
    assert shard.world.objects[ref].present


async def test_a_serial_the_shard_never_placed_is_refused(shard, nc):
    outcome = await giveback.give_back(NatsRequester(nc), _row("run-a", 3, "creature", "0x7FFFFFFF"), shard.id,
                                       TIMEOUT_S)
    assert outcome.verdict is Verdict.FAILED and "never this run's" in outcome.reason


async def test_a_lease_is_released_to_its_baseline_unless_staff_changed_it(shard, nc):
    baselines = {}
    for target in ("0x4000AAAA", "0x4000BBBB"):
        reply = await shard.command("lease.apply", {"runId": "run-a", "key": "Spawner.MaxCount", "target": target,
                                                    "value": "25", "holdMs": 600_000})
        assert reply["status"] == 200 and reply["body"]["kind"] == "lease.ok", reply
        baselines[target] = reply["body"]["baseline"]
    assert baselines == {"0x4000AAAA": "10", "0x4000BBBB": "10"}
    shard.world.set_value("Spawner.MaxCount", "40", target="0x4000BBBB")  # staff, by hand
    requester = NatsRequester(nc)
    released = await giveback.give_back(requester, _row("run-a", 1, "lease", "Spawner.MaxCount@0x4000AAAA",
                                                   key="Spawner.MaxCount", target="0x4000AAAA", expected="25",
                                                   baseline="10"), shard.id, TIMEOUT_S)
    drifted = await giveback.give_back(requester, _row("run-a", 2, "lease", "Spawner.MaxCount@0x4000BBBB",
                                                  key="Spawner.MaxCount", target="0x4000BBBB", expected="25",
                                                  baseline="10"), shard.id, TIMEOUT_S)
    assert released.verdict is Verdict.REVERTED and shard.world.value("Spawner.MaxCount", "0x4000AAAA") == "10"
    assert drifted.verdict is Verdict.DRIFTED and '"40"' in drifted.reason
    assert shard.world.value("Spawner.MaxCount", "0x4000BBBB") == "40"
    assert shard.world.holds == {}  # teardown collected both verdicts


async def test_an_untargeted_lease_is_released_and_a_repeat_is_a_replay(shard, nc):
    applied = await shard.command("lease.apply", {"runId": "run-a", "key": "PlayerCaps.SkillCap", "value": "1300",
                                                  "holdMs": 600_000})
    assert applied["body"]["baseline"] == "1200", applied
    requester, row = NatsRequester(nc), _row("run-a", 4, "lease", "PlayerCaps.SkillCap", key="PlayerCaps.SkillCap",
                                   target=None, expected="1300", baseline="1200")
    assert (await giveback.give_back(requester, row, shard.id, TIMEOUT_S)).verdict is Verdict.REVERTED
    assert (await giveback.give_back(requester, row, shard.id, TIMEOUT_S)).verdict is Verdict.REVERTED
    assert shard.world.value("PlayerCaps.SkillCap") == "1200"
    assert (shard.sim.executed["lease.release"], shard.sim.replayed["lease.release"]) == (1, 1)


async def test_a_lease_key_the_shard_does_not_offer_fails_with_the_shards_sentence(shard, nc):
    row = _row("run-a", 5, "lease", "Loot.MaxProps", key="Loot.MaxProps", expected="3", baseline="1")
    outcome = await giveback.give_back(NatsRequester(nc), row, shard.id, TIMEOUT_S)
    assert outcome.verdict is Verdict.FAILED
    assert "404" in outcome.reason and "no lease is offered for key 'Loot.MaxProps'" in outcome.reason


async def test_a_lease_without_baseline_never_reaches_the_shard(shard, nc):
    outcome = await giveback.give_back(NatsRequester(nc), _row("run-a", 1, "lease", "PlayerCaps.SkillCap",
                                                          key="PlayerCaps.SkillCap", expected="1300"),
                                       shard.id, TIMEOUT_S)
    assert outcome.verdict is Verdict.FAILED and "'baseline'" in outcome.reason
    assert shard.sim.executed["lease.release"] == 0


async def test_a_shard_no_gateway_holds_is_away_like_a_503(shard, nc, unique):
    row = _row("run-a", 1, "creature", "0x1")
    outcome = await giveback.give_back(NatsRequester(nc), row, f"away{unique}", TIMEOUT_S)
    assert outcome.verdict is Verdict.AWAY
    assert "503" in outcome.reason and f"away{unique}" in outcome.reason


async def test_a_shard_that_does_not_answer_in_time_is_away(shard, nc):
    (ref,) = await _spawn(shard, "run-a", 1)
    shard.sim.mute.add("world.despawn")
    outcome = await giveback.give_back(NatsRequester(nc), _row("run-a", 1, "creature", ref), shard.id, 1.0)
    assert outcome.verdict is Verdict.AWAY and "504" in outcome.reason


async def test_the_gateways_own_504_is_away(nc, services, unique):
    # The gateway gives the shard 0.5 s; the give-back waits longer, so the 504 is the gateway's.
    shard = await connect_shard(nc, services, f"g{unique}", command_timeout_s="0.5")
    try:
        (ref,) = await _spawn(shard, "run-a", 1)
        shard.sim.mute.add("world.despawn")
        outcome = await giveback.give_back(NatsRequester(nc), _row("run-a", 1, "creature", ref), shard.id, TIMEOUT_S)
        assert outcome.verdict is Verdict.AWAY
        assert "world.despawn answered 504" in outcome.reason and "did not answer world.despawn" in outcome.reason
    finally:
        await shard.sim.close()


async def test_a_module_kind_without_a_responder_is_away_with_what_to_do(nc, unique):
    outcome = await giveback.give_back(NatsRequester(nc), _row("run-a", 1, "zone", "arena-north", module=f"m{unique}"),
                                       "uo1", TIMEOUT_S)
    assert outcome.verdict is Verdict.AWAY
    assert f"modules.m{unique}.revert" in outcome.reason and "start it" in outcome.reason


async def test_a_module_answering_garbage_fails_with_the_garbage_quoted(nc, unique):
    async def garbage(msg) -> None:
        await msg.respond(b"\x00not json at all")

    await nc.subscribe(f"modules.m{unique}.revert", cb=garbage)
    await nc.flush()
    outcome = await giveback.give_back(NatsRequester(nc), _row("run-a", 1, "zone", "z", module=f"m{unique}"),
                                       "uo1", TIMEOUT_S)
    assert outcome.verdict is Verdict.FAILED
    assert "not json at all" in outcome.reason


async def test_a_module_revert_gets_the_rows_revert_data_and_key(nc, unique):
    seen: list[bytes] = []

    async def module(msg) -> None:
        seen.append(msg.data)
        await msg.respond(b'{"status": 200, "result": "removed"}')

    await nc.subscribe(f"modules.m{unique}.revert", cb=module)
    await nc.flush()
    outcome = await giveback.give_back(NatsRequester(nc), _row("run-a", 5, "zone", "z", module=f"m{unique}", radius=20),
                                       "uo1", TIMEOUT_S)
    assert outcome.verdict is Verdict.REVERTED
    assert b'"revert":{"radius":20}' in seen[0] and b'"idempotencyKey":"cleanup:run-a:5"' in seen[0]
