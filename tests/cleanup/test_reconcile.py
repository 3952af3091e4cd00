"""Reconcile: the ledger's live rows against what the shard says each run still owns
(`world.owned.ok`'s `owned`, `lease.list.ok`'s `holds`). A row the shard no longer lists
becomes `orphaned` (and a later sweep gives it back: finding nothing there is a success); a
lease the shard lists `expired: true` ended at its deadline as it was told to and becomes
`expired`, never `orphaned`; a shard that does not answer is counted as unanswered and its
rows are left alone. With no modules named, every module owning a live row is reconciled."""

from __future__ import annotations

import json
from typing import Any

import nats
import pytest

from shared import subjects
from simulator.world import ShardWorld
from tests.cleanup.conftest import connect_shard, ok, shard_with, start_cleanup, wait_for

MODULE = "arena"


async def _spawn(shard, run: str, what: str, count: int = 1) -> list[str]:
    reply = await shard.command("world.spawn", {"runId": run, "what": what, "count": count})
    assert reply["status"] == 200 and reply["body"]["kind"] == "world.spawn.ok", reply
    return reply["body"]["serials"]


async def _lease(shard, run: str, key: str, value: str, hold_ms: int, target: str | None = None) -> dict:
    body: dict[str, Any] = {"runId": run, "key": key, "value": value, "holdMs": hold_ms}
    if target is not None:
        body["target"] = target
    reply = await shard.command("lease.apply", body)
    assert reply["status"] == 200 and reply["body"]["kind"] == "lease.ok", reply
    return reply["body"]


async def _published(sub) -> list[tuple[str, str]]:
    """(type, resource ref) of every update event the ledger published on ``sub`` so far."""
    seen = []
    while True:
        try:
            event = json.loads((await sub.next_msg(timeout=1)).data)
        except nats.errors.TimeoutError:
            return seen
        seen.append((event["type"], (event.get("resource") or {}).get("ref")))


async def test_what_the_shard_no_longer_lists_becomes_orphaned_and_is_later_given_back(
        nc, shard, ledger, services, unique):
    await start_cleanup(services)
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    kept, killed = await _spawn(shard, run, "creature", 2)
    for target in ("0x4000EEEE", "0x4000FFFF"):
        await _lease(shard, run, "Spawner.MaxCount", "25", 600_000, target)
    for ref in (kept, killed):
        await ledger.record(run, "creature", ref)
    for target in ("0x4000EEEE", "0x4000FFFF"):
        await ledger.record(run, "lease", f"Spawner.MaxCount@{target}",
                            revert={"key": "Spawner.MaxCount", "target": target, "expected": "25", "baseline": "10"})
    await ledger.record(run, "zone", "pit", revert={"radius": 5})   # a kind the shard plane does not know
    shard.world.kill(killed)                                        # gone without anybody asking
    del shard.world.holds[("Spawner.MaxCount", "0x4000FFFF")]       # the shard no longer holds this lease

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {"modules": [MODULE]}, timeout=30)

    assert (report["orphaned"], report["expired"], report["unanswered"], report["skipped"]) == (2, 0, [], 1)
    assert report["byModule"] == {MODULE: {"runs": 1, "orphaned": 2, "expired": 0, "skipped": 1, "unanswered": 0}}
    assert await ledger.statuses(run) == {kept: "confirmed", killed: "orphaned",
                                          "Spawner.MaxCount@0x4000EEEE": "confirmed",
                                          "Spawner.MaxCount@0x4000FFFF": "orphaned", "pit": "confirmed"}

    await ledger.end(run, "completed")
    await ok(nc, subjects.CLEANUP_SWEEP, {"runId": run}, timeout=30)
    statuses = await ledger.statuses(run)
    assert statuses[killed] == "reverted" and statuses["Spawner.MaxCount@0x4000FFFF"] == "reverted"


async def test_a_lease_the_game_ended_at_its_deadline_is_expired_never_orphaned(nc, shard, ledger, services, unique):
    await start_cleanup(services)
    run = f"run-{unique}"
    events = await nc.subscribe(subjects.ledger_run_events(run))
    await ledger.run(run, shard.id)
    timed = await _lease(shard, run, "PlayerCaps.SkillCap", "1300", 300)           # a short lease: it fires
    await _lease(shard, run, "Weather.Season", "winter", 600_000)
    await _lease(shard, run, "Loot.RareChance", "5", 600_000)
    for key, value, baseline in (("PlayerCaps.SkillCap", "1300", timed["baseline"]),
                                 ("Weather.Season", "winter", "summer"), ("Loot.RareChance", "5", "1")):
        await ledger.record(run, "lease", key, revert={"key": key, "target": None, "expected": value,
                                                       "baseline": baseline})
    del shard.world.holds[("Loot.RareChance", "")]                                  # vanished, nobody asking

    async def fired() -> bool:
        return shard.world.holds[("PlayerCaps.SkillCap", "")].expired

    await wait_for(fired, "the shard's lease clock fired the short lease", timeout=10, every=0.05)
    assert shard.world.value("PlayerCaps.SkillCap") == "1200"  # the shard restored it by itself
    listed = await shard.command("lease.list", {})
    assert {(h["key"], h["expired"]) for h in listed["body"]["holds"]} >= {("PlayerCaps.SkillCap", True)}

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {"modules": [MODULE]}, timeout=30)

    assert (report["expired"], report["orphaned"], report["unanswered"]) == (1, 1, []), report
    assert await ledger.statuses(run) == {"PlayerCaps.SkillCap": "expired", "Weather.Season": "confirmed",
                                          "Loot.RareChance": "orphaned"}
    published = await _published(events)
    assert [ref for kind, ref in published if kind == "resource.expired"] == ["PlayerCaps.SkillCap"]
    assert [ref for kind, ref in published if kind == "resource.orphaned"] == ["Loot.RareChance"]  # never the other

    # Expired is terminal and green: the sweep never gives it back, and it leaves no cleanup unfinished.
    await ledger.end(run, "completed")
    swept = await ok(nc, subjects.CLEANUP_SWEEP, {"runId": run}, timeout=30)
    assert swept["run"]["reverted"] == 2 and swept["run"]["cleanupStatus"] == "complete", swept
    assert await ledger.statuses(run) == {"PlayerCaps.SkillCap": "expired", "Weather.Season": "reverted",
                                          "Loot.RareChance": "reverted"}
    assert shard.sim.executed["lease.release"] == 2
    assert shard.world.value("Weather.Season") == "summer"


async def test_another_runs_hold_on_the_same_key_is_not_this_runs_lease(nc, shard, ledger, services, unique):
    await start_cleanup(services)
    mine, theirs = f"mine-{unique}", f"theirs-{unique}"
    for run in (mine, theirs):
        await ledger.run(run, shard.id)
    await _lease(shard, mine, "Weather.Season", "winter", 600_000)
    await ledger.record(mine, "lease", "Weather.Season@mine",
                        revert={"key": "Weather.Season", "expected": "winter", "baseline": "summer"})
    await _lease(shard, theirs, "Weather.Season", "autumn", 600_000)   # the shard's hold is now theirs

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {"modules": [MODULE]}, timeout=30)

    assert report["orphaned"] == 1
    assert await ledger.statuses(mine) == {"Weather.Season@mine": "orphaned"}


async def test_a_shard_that_does_not_answer_is_counted_and_its_rows_left_alone(nc, shard, ledger, services, unique):
    await start_cleanup(services, command_timeout_s="2", claim_timeout_s="5")
    here, away = f"here-{unique}", f"away-{unique}"
    await ledger.run(here, shard.id)
    await ledger.run(away, f"gone{unique}")          # no gateway holds this shard
    (ref,) = await _spawn(shard, here, "npc")
    await ledger.record(here, "npc", ref)
    await ledger.record(away, "npc", "0x7777")

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {"modules": [MODULE]}, timeout=30)

    assert report["orphaned"] == 0
    assert [(u["runId"], u["shard"]) for u in report["unanswered"]] == [(away, f"gone{unique}")]
    assert report["byModule"][MODULE]["unanswered"] == 1
    assert await ledger.statuses(away) == {"0x7777": "confirmed"}
    assert await ledger.statuses(here) == {ref: "confirmed"}


class OldDialectWorld(ShardWorld):
    """A shard answering ``world.owned`` and ``lease.list`` in a shape the seed never wrote."""

    def _world_owned(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "world.owned", "runId": body.get("runId"), "items": []}

    def _lease_list(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "lease.list.ok", "leases": [], "holds": "none"}


@pytest.fixture
async def odd_shard(nc, services, unique):
    async with shard_with(nc, services, f"o{unique}", OldDialectWorld()) as linked:
        yield linked


async def test_an_answer_in_another_shape_is_unanswered_not_evidence_that_everything_is_gone(
        nc, odd_shard, ledger, services, unique):
    await start_cleanup(services)
    run = f"run-{unique}"
    await ledger.run(run, odd_shard.id)
    (ref,) = await _spawn(odd_shard, run, "creature")
    await ledger.record(run, "creature", ref)
    await ledger.record(run, "lease", "Weather.Season",
                        revert={"key": "Weather.Season", "expected": "winter", "baseline": "summer"})

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {"modules": [MODULE]}, timeout=30)

    assert report["orphaned"] == 0 and len(report["unanswered"]) == 1
    assert "world.owned.ok" in report["unanswered"][0]["reason"]
    assert await ledger.statuses(run) == {ref: "confirmed", "Weather.Season": "confirmed"}


class PlainSerialsWorld(ShardWorld):
    """A shard listing what a run owns as plain serials rather than ``{"serial", "what"}``."""

    def _world_owned(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = super()._world_owned(body)
        return {**answer, "owned": [item["serial"] for item in answer["owned"]]}


async def test_owned_serials_given_as_plain_strings_are_read_too(nc, services, ledger, unique):
    plain = await connect_shard(nc, services, f"p{unique}", world=PlainSerialsWorld())
    try:
        await start_cleanup(services)
        run = f"run-{unique}"
        await ledger.run(run, plain.id)
        kept, killed = await _spawn(plain, run, "npc", 2)
        for ref in (kept, killed):
            await ledger.record(run, "npc", ref)
        plain.world.kill(killed)

        report = await ok(nc, subjects.CLEANUP_RECONCILE, {"modules": [MODULE]}, timeout=30)

        assert (report["orphaned"], report["unanswered"]) == (1, [])
        assert await ledger.statuses(run) == {kept: "confirmed", killed: "orphaned"}
    finally:
        await plain.sim.close()


async def test_reconcile_all_asks_every_module_owning_a_live_row_and_counts_a_silent_one_unanswered(
        nc, shard, ledger, services, unique):
    await start_cleanup(services, command_timeout_s="2", claim_timeout_s="5")
    here, away, done = f"here-{unique}", f"away-{unique}", f"done-{unique}"
    arena, siege, faded = f"arena{unique}", f"siege{unique}", f"faded{unique}"
    await ledger.run(here, shard.id)
    await ledger.run(away, f"gone{unique}")                      # nobody answers for this shard
    await ledger.run(done, shard.id)
    kept, killed = await _spawn(shard, here, "creature", 2)
    for ref in (kept, killed):
        await ledger.record(here, "creature", ref, module=arena)
    await ledger.record(away, "boss", "0x5555", module=siege)
    (gate,) = await _spawn(shard, done, "gate")
    await ledger.record(done, "gate", gate, module=faded)
    assert await ledger.expire(faded, "gate", gate) == 1        # resolved: faded owns no live row
    shard.world.kill(killed)

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {}, timeout=30)   # no modules named: all of them

    assert sorted(report["byModule"]) == sorted([arena, siege])
    assert report["byModule"][arena] == {"runs": 1, "orphaned": 1, "expired": 0, "skipped": 0, "unanswered": 0}
    assert report["byModule"][siege]["unanswered"] == 1         # silent: counted, its rows left alone
    assert report["modules"] == 2 and report["orphaned"] == 1
    assert await ledger.statuses(here) == {kept: "confirmed", killed: "orphaned"}
    assert await ledger.statuses(away) == {"0x5555": "confirmed"}
    assert await ledger.statuses(done) == {gate: "expired"}


async def test_a_configured_module_is_reconciled_besides_those_with_live_rows(nc, shard, ledger, services, unique):
    await start_cleanup(services, reconcile_modules=f"quiet{unique}")
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    (ref,) = await _spawn(shard, run, "npc")
    await ledger.record(run, "npc", ref)

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {}, timeout=30)

    assert sorted(report["byModule"]) == sorted([MODULE, f"quiet{unique}"])
    assert report["byModule"][f"quiet{unique}"]["runs"] == 0


async def test_the_periodic_reconcile_checks_every_module_owning_a_live_row(nc, shard, ledger, services, unique):
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    (ref,) = await _spawn(shard, run, "decor")
    await ledger.record(run, "decor", ref)
    shard.world.kill(ref)
    await start_cleanup(services, reconcile_period_s="0.2")   # no module configured

    async def orphaned() -> bool:
        return (await ledger.statuses(run))[ref] == "orphaned"

    await wait_for(orphaned, "the periodic reconcile orphaned the killed decor", timeout=20)
