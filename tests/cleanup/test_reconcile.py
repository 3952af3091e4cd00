"""Reconcile: the ledger's live rows against what the shard says each run still owns. A row
the shard no longer lists becomes `orphaned` (and a later sweep gives it back: finding
nothing there is a success); a shard that does not answer is counted as unanswered and its
rows are left alone."""

from __future__ import annotations

from shared import subjects
from tests.cleanup.conftest import ok, start_cleanup, wait_for

MODULE = "arena"


async def test_what_the_shard_no_longer_lists_becomes_orphaned_and_is_later_given_back(
        nc, shard, ledger, services, unique):
    await start_cleanup(services)
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    kept, killed = (await shard.command("world.spawn", {"runId": run, "what": "creature", "count": 2}))["body"]["refs"]
    for target in ("east", "west"):
        await shard.command("lease.apply", {"runId": run, "key": "weather", "target": target, "value": "storm",
                                            "holdMs": 600_000})
    for ref in (kept, killed):
        await ledger.record(run, "creature", ref)
    for target in ("east", "west"):
        await ledger.record(run, "lease", f"weather@{target}", revert={"key": "weather", "target": target,
                                                                       "expected": "storm", "baseline": "clear"})
    await ledger.record(run, "zone", "pit", revert={"radius": 5})   # a kind the shard plane does not know
    shard.world.kill(killed)                        # gone without anybody asking
    del shard.world.holds[("weather", "west")]      # the shard no longer holds this lease

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {"modules": [MODULE]}, timeout=30)

    assert report["orphaned"] == 2 and report["unanswered"] == [] and report["skipped"] == 1
    assert await ledger.statuses(run) == {kept: "confirmed", killed: "orphaned", "weather@east": "confirmed",
                                          "weather@west": "orphaned", "pit": "confirmed"}

    await ledger.end(run, "completed")
    await ok(nc, subjects.CLEANUP_SWEEP, {"runId": run}, timeout=30)
    statuses = await ledger.statuses(run)
    assert statuses[killed] == "reverted" and statuses["weather@west"] == "reverted"


async def test_a_shard_that_does_not_answer_is_counted_and_its_rows_left_alone(nc, shard, ledger, services, unique):
    await start_cleanup(services, command_timeout_s="2", claim_timeout_s="5")
    here, away = f"here-{unique}", f"away-{unique}"
    await ledger.run(here, shard.id)
    await ledger.run(away, f"gone{unique}")          # no gateway holds this shard
    (ref,) = (await shard.command("world.spawn", {"runId": here, "what": "npc"}))["body"]["refs"]
    await ledger.record(here, "npc", ref)
    await ledger.record(away, "npc", "0x7777")

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {"modules": [MODULE]}, timeout=30)

    assert report["orphaned"] == 0
    assert [(u["runId"], u["shard"]) for u in report["unanswered"]] == [(away, f"gone{unique}")]
    assert await ledger.statuses(away) == {"0x7777": "confirmed"}
    assert await ledger.statuses(here) == {ref: "confirmed"}


async def test_the_periodic_reconcile_checks_the_configured_modules(nc, shard, ledger, services, unique):
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    (ref,) = (await shard.command("world.spawn", {"runId": run, "what": "decor"}))["body"]["refs"]
    await ledger.record(run, "decor", ref)
    shard.world.kill(ref)
    await start_cleanup(services, reconcile_modules=MODULE, reconcile_period_s="0.2")

    async def orphaned() -> bool:
        return (await ledger.statuses(run))[ref] == "orphaned"

    await wait_for(orphaned, "the periodic reconcile orphaned the killed decor", timeout=20)
