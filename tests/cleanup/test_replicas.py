"""Scaling and crashes: three cleanup processes sweeping one ledger at once give each of a
few thousand resources back exactly once (the shard simulator counts executions apart from
replays), and a sweeper SIGKILLed mid-revert leaves `reverting` rows another one recovers
after the claim timeout — without the shard executing anything twice."""

from __future__ import annotations

import asyncio
import json
import signal

from shared import subjects
from simulator.world import PLACES_AT_MOST
from tests.cleanup.conftest import DespawnTally, Ledger, Shard, ok, start_cleanup, wait_for

RUNS = 40
"""Runs in the exactly-once test."""

CREATURES_PER_RUN = 50
"""World objects each of those runs holds."""

LEASES_PER_RUN = 10
"""Leases (one key, distinct targets) each of those runs holds."""


async def _populate(shard: Shard, ledger: Ledger, prefix: str, runs: int, creatures: int, leases: int) -> list[str]:
    """Runs that spawned ``creatures`` and leased ``leases`` values through the shard, recorded."""
    run_ids, rows = [], []
    for index in range(runs):
        run = f"{prefix}-{index}"
        run_ids.append(run)
        await ledger.run(run, shard.id)
        for placed in range(0, creatures, PLACES_AT_MOST):  # a shard places at most 30 at a time
            count = min(PLACES_AT_MOST, creatures - placed)
            spawned = await shard.command("world.spawn", {"runId": run, "what": "creature", "count": count})
            assert spawned["status"] == 200 and len(spawned["body"]["serials"]) == count, spawned
            rows += [(run, "creature", ref, None) for ref in spawned["body"]["serials"]]
        for lease in range(leases):
            target = f"{run}-t{lease}"  # one spawner per lease: Spawner.MaxCount is a targeted key
            applied = await shard.command("lease.apply", {"runId": run, "key": "Spawner.MaxCount", "target": target,
                                                          "value": "25", "holdMs": 3_600_000})
            assert applied["status"] == 200 and applied["body"]["kind"] == "lease.ok", applied
            rows.append((run, "lease", f"Spawner.MaxCount@{target}",
                         {"key": "Spawner.MaxCount", "target": target, "expected": "25",
                          "baseline": applied["body"]["baseline"]}))
    await ledger.record_many(rows)
    return run_ids


async def _all_clean(nc, runs: list[str]) -> bool:
    reply = await ok(nc, subjects.LEDGER_RUNS, {"cleanupStatus": "complete", "limit": 1000})
    return {run["runId"] for run in reply["runs"]} >= set(runs)


async def test_three_replicas_give_each_of_thousands_of_resources_back_exactly_once(
        nc, shard, ledger, services, unique):
    runs = await _populate(shard, ledger, f"r{unique}", RUNS, CREATURES_PER_RUN, LEASES_PER_RUN)
    swept_by: dict[int, int] = {}

    async def on_swept(msg) -> None:
        event = json.loads(msg.data)
        swept_by[event["pid"]] = swept_by.get(event["pid"], 0) + event["claimed"]

    await nc.subscribe(subjects.CLEANUP_SWEPT, cb=on_swept)
    tally = DespawnTally(shard.world)
    for _ in range(3):  # small batches and a short period, so the three really race
        await start_cleanup(services, sweep_period_s="0.3", sweep_batch_size="20", sweep_runs_per_batch="5")
    await asyncio.gather(*(ledger.end(run) for run in runs))

    await wait_for(lambda: _all_clean(nc, runs), "every run's cleanup complete", timeout=120, every=0.5)

    # Each serial carried out by exactly one world.despawn (a batch's world rows in one command).
    despawned = tally.per_serial()
    assert len(despawned) == RUNS * CREATURES_PER_RUN and set(despawned.values()) == {1}
    assert shard.sim.executed["world.despawn"] == len(tally.commands) < RUNS * CREATURES_PER_RUN
    assert shard.sim.executed["lease.release"] == RUNS * LEASES_PER_RUN
    assert not any(obj.present for obj in shard.world.objects.values())
    assert shard.world.holds == {}
    for run in runs[:3]:
        console = await ledger.console(run)
        assert console["counts"]["reverted"] == CREATURES_PER_RUN + LEASES_PER_RUN
    assert len([pid for pid, claimed in swept_by.items() if claimed]) >= 2, swept_by


async def test_a_sweeper_killed_mid_revert_is_recovered_after_the_claim_timeout_without_a_second_execution(
        nc, shard, ledger, services, unique):
    runs = await _populate(shard, ledger, f"k{unique}", 8, 50, 0)
    # A run's 50 creatures go in one world.despawn: two runs at a time and a slow answer, so
    # the kill lands with some runs given back, some in flight at the shard, some not started.
    shard.sim.answer_delay_s["world.despawn"] = 0.2
    tally = DespawnTally(shard.world)
    doomed = await start_cleanup(services, sweep_period_s="0.3", claim_timeout_s="3", command_timeout_s="2",
                                 give_back_concurrency="16", sweep_runs_in_flight="2")
    await asyncio.gather(*(ledger.end(run) for run in runs))

    async def reverting() -> int:
        counts = [(await ledger.console(run))["counts"] for run in runs]
        return sum(c["reverting"] for c in counts) if sum(c["reverted"] for c in counts) >= 50 else 0

    await wait_for(reverting, "rows being reverted", timeout=60, every=0.05)
    # Killed while the shard holds some of its commands (their 0.1 s answer delay): those are
    # carried out after it died, and their second sending must be a replay. Without this wait a
    # loaded machine could land the kill between two batches, with no command at the shard.
    async with asyncio.timeout(10):
        while not shard.sim.in_flight:
            await asyncio.sleep(0.002)
    services.stop(doomed, signal.SIGKILL)
    stranded = sum([(await ledger.console(run))["counts"]["reverting"] for run in runs])
    assert stranded > 0

    await start_cleanup(services, sweep_period_s="0.3", claim_timeout_s="3", command_timeout_s="2")
    await wait_for(lambda: _all_clean(nc, runs), "every run's cleanup complete", timeout=90, every=0.5)

    despawned = tally.per_serial()
    assert len(despawned) == 400 and set(despawned.values()) == {1}
    # The killed sweeper's commands the shard had already carried out were answered again
    # from its idempotency cache, not executed again.
    assert shard.sim.replayed["world.despawn"] >= 1
    for run in runs:
        console = await ledger.console(run)
        assert console["counts"]["reverted"] == 50 and console["unresolved"] == 0


async def test_rows_queued_past_their_claims_deadline_are_deferred_not_sent_while_another_sweeper_may_take_them(
        nc, shard, ledger, services, unique):
    # One give-back slot and slow despawns (one per run: its creatures in one command): most
    # of the runs claimed at once wait behind the slot longer than their claims last. Sent
    # anyway, another sweeper would reclaim them mid-flight and the shard would see one key
    # twice at once (bridge.busy: a spent attempt).
    runs = await _populate(shard, ledger, f"d{unique}", 6, 2, 0)
    shard.sim.answer_delay_s["world.despawn"] = 0.5
    tally = DespawnTally(shard.world)
    deferred: list[int] = []

    async def on_swept(msg) -> None:
        deferred.append(json.loads(msg.data)["deferred"])

    await nc.subscribe(subjects.CLEANUP_SWEPT, cb=on_swept)
    for _ in range(2):
        await start_cleanup(services, sweep_period_s="0.3", sweep_batch_size="12", give_back_concurrency="1",
                            claim_timeout_s="2", command_timeout_s="1")
    await asyncio.gather(*(ledger.end(run) for run in runs))
    await wait_for(lambda: _all_clean(nc, runs), "every run's cleanup complete", timeout=60, every=0.3)

    despawned = tally.per_serial()
    assert len(despawned) == 12 and set(despawned.values()) == {1}
    assert shard.sim.busy["world.despawn"] == 0
    for run in runs:
        console = await ledger.console(run)
        assert console["counts"]["reverted"] == 2
        assert [r["attempts"] for r in console["resources"]] == [0] * 2
    assert sum(deferred) > 0  # the situation really arose
