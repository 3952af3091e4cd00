"""Bad input never crashes a sweep: a shard answering garbage or without the fields expected,
a module revert subject nobody answers or answered with garbage, a lease without its baseline
— each becomes a failed row with a reason a person can act on, and other runs' cleanups go on.
A request that is not valid gets a 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from shared import subjects
from simulator.world import ShardWorld
from tests.cleanup.conftest import ask, ok, shard_with, start_cleanup


class GarbledWorld(ShardWorld):
    """A shard whose despawn answers are broken for any command naming some serials (a run's
    world objects go in one command, so the broken answer is the whole command's)."""

    def __init__(self) -> None:
        super().__init__()
        self.garbled: dict[str, dict[str, Any]] = {}

    def _world_despawn(self, body: dict[str, Any]) -> dict[str, Any]:
        for serial in body.get("serials") or []:
            if serial in self.garbled:
                return self.garbled[serial]
        return super()._world_despawn(body)


@pytest.fixture
async def garbled_shard(nc, services, unique):
    async with shard_with(nc, services, f"g{unique}", GarbledWorld()) as linked:
        yield linked


async def test_broken_answers_become_failed_rows_with_reasons_and_other_runs_go_on(
        nc, garbled_shard, ledger, services, unique):
    shard = garbled_shard
    cleanup = await start_cleanup(services)
    bad, good = f"bad-{unique}", f"good-{unique}"
    silent_module, garbage_module = f"silent{unique}", f"garbage{unique}"

    async def garbage(msg) -> None:
        await msg.respond(b"<html>502 Bad Gateway</html>")

    await nc.subscribe(subjects.module_revert(garbage_module), cb=garbage)
    odd = f"odd-{unique}"  # its own run: a broken answer is every serial's in its command
    for run in (bad, good, odd):
        await ledger.run(run, shard.id)
    unnamed, fine = (await shard.command(
        "world.spawn", {"runId": bad, "what": "creature", "count": 2}))["body"]["serials"]
    (odd_lists,) = (await shard.command("world.spawn", {"runId": odd, "what": "creature"}))["body"]["serials"]
    # A 200 that names the other serial of the command and some serial never sent, but not
    # this one; and one whose lists are not lists.
    shard.world.garbled[unnamed] = {"kind": "world.despawn.ok", "runId": bad, "removed": ["0x1", fine], "gone": [],
                                    "refused": []}
    shard.world.garbled[odd_lists] = {"kind": "world.despawn.ok", "runId": odd, "removed": 42}
    (good_ref,) = (await shard.command("world.spawn", {"runId": good, "what": "npc"}))["body"]["serials"]
    for ref in (unnamed, fine):
        await ledger.record(bad, "creature", ref)
    await ledger.record(odd, "creature", odd_lists)
    await ledger.record(bad, "zone", "north-field", module=silent_module)
    await ledger.record(bad, "zone", "south-field", module=garbage_module)
    await ledger.record(bad, "lease", "PlayerCaps.SkillCap", revert={"key": "PlayerCaps.SkillCap", "expected": "1300"})
    await ledger.record(good, "npc", good_ref)
    for run in (bad, good, odd):
        await ledger.end(run, "completed")

    sweep = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)

    # The silent module's row met nobody: away (no attempt spent), not failed.
    assert sweep["reverted"] == 2 and sweep["failed"] == 4 and sweep["away"] == 1
    rows = {row["ref"]: row for run in (bad, odd) for row in (await ledger.console(run))["resources"]}
    reasons = {ref: row["lastError"] for ref, row in rows.items() if row["status"] != "reverted"}
    assert rows[fine]["status"] == "reverted"
    assert f"does not name {unnamed}" in reasons[unnamed] and '"0x1"' in reasons[unnamed]
    assert "'removed' is not a list" in reasons[odd_lists] and "42" in reasons[odd_lists]
    assert f"nothing answers modules.{silent_module}.revert" in reasons["north-field"]
    assert "502 Bad Gateway" in reasons["south-field"]
    assert "lacks 'baseline'" in reasons["PlayerCaps.SkillCap"] and "by hand" in reasons["PlayerCaps.SkillCap"]
    # Its silent module's row still waits for the module: the run's cleanup stays pending.
    assert rows["north-field"]["attempts"] == 0 and rows["north-field"]["status"] == "confirmed"
    assert (await ledger.console(bad))["run"]["cleanupStatus"] == "pending"
    good_console = await ledger.console(good)
    assert good_console["run"]["cleanupStatus"] == "complete"
    assert good_console["counts"]["reverted"] == 1
    # The lease was never sent; the service is still up and answering.
    assert shard.sim.executed["lease.release"] == 0
    assert cleanup.proc.poll() is None
    assert (await ask(nc, subjects.health("cleanup")))["status"] == 200


@pytest.mark.parametrize("subject, payload, names", [
    (subjects.CLEANUP_SWEEP, {"runId": 5}, "runId"),
    (subjects.CLEANUP_SWEEP, {"runId": ""}, "runId"),
    (subjects.CLEANUP_RETRY, {}, "runId"),
    (subjects.CLEANUP_RECONCILE, {"modules": ["arena.north"]}, "modules"),
    (subjects.CLEANUP_RECONCILE, {"modules": "arena"}, "modules"),
])
async def test_an_invalid_request_is_a_400_naming_the_field(nc, services, subject, payload, names):
    await start_cleanup(services)
    reply = await ask(nc, subject, payload)
    assert reply["status"] == 400 and names in reply["error"]


async def test_sweeping_or_retrying_a_run_the_ledger_does_not_know_says_so(nc, ledger, services, unique):
    await start_cleanup(services)
    for subject in (subjects.CLEANUP_SWEEP, subjects.CLEANUP_RETRY):
        reply = await ask(nc, subject, {"runId": f"nope-{unique}"})
        assert reply == {"status": 404, "error": f"no run 'nope-{unique}'"}  # no made-up run beside it


async def test_a_sweep_with_the_ledger_down_is_a_503_and_the_service_stays_up(nc, services):
    cleanup = await start_cleanup(services, ledger_timeout_s="1")
    reply = await ask(nc, subjects.CLEANUP_SWEEP, {})
    assert reply["status"] == 503 and "no ledger is running" in reply["error"]
    assert cleanup.proc.poll() is None
