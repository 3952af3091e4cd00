"""The issue's end-to-end scenario through every service on real servers: a run spawns
creatures and leases a value through the shard simulator, a player kills a creature, staff
change the leased value by hand, a third resource expires while the run is going, the run is
cancelled and the sweep runs. Then the console says exactly what docs/cleanup.md, "A sweep", demands."""

from __future__ import annotations

from shared import subjects
from tests.cleanup.conftest import ok, start_cleanup

MODULE = "arena"


async def test_a_cancelled_run_gives_back_what_it_can_and_leaves_the_drifted_lease_to_a_person(
        nc, shard, ledger, services, unique):
    cleanup = await start_cleanup(services)
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    spawned = await shard.command("world.spawn", {"runId": run, "what": "creature", "count": 3})
    creatures = spawned["body"]["serials"]
    (gate,) = (await shard.command("world.spawn", {"runId": run, "what": "gate"}))["body"]["serials"]
    leased = await shard.command("lease.apply", {"runId": run, "key": "PlayerCaps.SkillCap", "value": "1300",
                                                 "holdMs": 600_000})
    assert leased["body"]["kind"] == "lease.ok" and leased["body"]["baseline"] == "1200", leased
    for ref in creatures:
        await ledger.record(run, "creature", ref)
    await ledger.record(run, "gate", gate)
    await ledger.record(run, "lease", "PlayerCaps.SkillCap",
                        revert={"key": "PlayerCaps.SkillCap", "target": None, "expected": "1300",
                                "baseline": leased["body"]["baseline"]})

    shard.world.kill(creatures[0])                          # a player kills one creature
    shard.world.set_value("PlayerCaps.SkillCap", "1250")    # staff change the leased value by hand
    assert await ledger.expire(MODULE, "gate", gate) == 1  # the module: the gate's time ran out
    await ledger.end(run, "cancelled")

    sweep = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
    assert sweep["reverted"] == 3 and sweep["drifted"] == 1

    console = await ledger.console(run)
    by_ref = {row["ref"]: row["status"] for row in console["resources"]}
    assert by_ref == {creatures[0]: "reverted", creatures[1]: "reverted", creatures[2]: "reverted",
                      gate: "expired", "PlayerCaps.SkillCap": "drifted"}
    assert console["counts"]["reverted"] == 3 and console["counts"]["drifted"] == 1
    assert console["unresolved"] == 1
    # A drifted row wants a person: the sweep cannot finish this run's cleanup.
    assert console["run"]["cleanupStatus"] == "incomplete"
    # The world: every creature gone, the staff's value kept, never overwritten.
    assert not any(ref in shard.world.objects for ref in creatures)
    assert shard.world.objects[gate].present                 # expired in the ledger: never despawned
    assert shard.world.value("PlayerCaps.SkillCap") == "1250"
    # The three creatures in one world.despawn; the expired gate was never given back.
    assert shard.sim.executed["world.despawn"] == 1
    assert cleanup.proc.poll() is None


async def test_a_run_whose_only_resource_expired_while_it_ran_ends_complete(nc, shard, ledger, services, unique):
    await start_cleanup(services)
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    (gate,) = (await shard.command("world.spawn", {"runId": run, "what": "gate"}))["body"]["serials"]
    await ledger.record(run, "gate", gate)
    assert await ledger.expire(MODULE, "gate", gate) == 1
    await ledger.end(run, "completed")
    assert (await ledger.console(run))["run"]["cleanupStatus"] == "pending"

    sweep = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)

    assert sweep["settled"] >= 1
    console = await ledger.console(run)
    assert console["run"]["cleanupStatus"] == "complete"
    assert console["unresolved"] == 0
    assert shard.sim.executed["world.despawn"] == 0
