"""Transient failures and the attempts bound: a shard that is away costs a row one attempt
per sweep and leaves the run pending; once attempts reach the bound the run's cleanup is
incomplete, and a person's manual retry resets the attempts and sweeps it now."""

from __future__ import annotations

import asyncio

from shared import subjects
from tests.cleanup.conftest import ask, ok, start_cleanup, wait_for


async def _shard_gone_from_gateway(nc, shard) -> None:
    async def gone() -> bool:
        health = await ask(nc, subjects.health("gateway"))
        return shard.id not in health.get("shards", [shard.id])

    await wait_for(gone, "the gateway noticed the shard left", timeout=10)


async def test_a_shard_away_costs_one_attempt_per_sweep_until_the_bound_then_retry_gives_it_back(
        nc, shard, ledger, services, unique):
    await start_cleanup(services, max_attempts="3")
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    (ref,) = (await shard.command("world.spawn", {"runId": run, "what": "boss"}))["body"]["serials"]
    await ledger.record(run, "boss", ref)
    await ledger.end(run, "completed")
    await shard.sim.drop()
    await _shard_gone_from_gateway(nc, shard)

    for attempt in (1, 2, 3):
        sweep = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
        assert sweep["transient"] == 1
        console = await ledger.console(run)
        (row,) = console["resources"]
        assert (row["status"], row["attempts"]) == ("confirmed", attempt)
        assert "503" in row["lastError"]
        assert console["run"]["cleanupStatus"] == ("incomplete" if attempt == 3 else "pending")

    # Spent: a fourth sweep leaves it alone.
    assert (await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30))["claimed"] == 0

    await shard.sim.connect()
    await wait_for(lambda: _answers(shard), "the shard is back", timeout=10)
    retried = await ok(nc, subjects.CLEANUP_RETRY, {"runId": run}, timeout=30)
    assert retried["run"]["reverted"] == 1 and retried["run"]["cleanupStatus"] == "complete"
    assert ref not in shard.world.objects
    assert shard.sim.executed["world.despawn"] == 1


async def _answers(shard) -> bool:
    try:
        return (await shard.command("lease.list", {})).get("status") == 200
    except Exception:  # noqa: BLE001 — no responders while the gateway re-attaches
        await asyncio.sleep(0.05)
        return False


async def test_retry_of_a_cleanup_that_is_not_incomplete_is_refused(nc, shard, ledger, services, unique):
    await start_cleanup(services)
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    reply = await ask(nc, subjects.CLEANUP_RETRY, {"runId": run})
    assert reply["status"] == 409 and "incomplete" in reply["error"]


async def test_a_module_that_starts_later_gets_its_rows_on_retry(nc, shard, ledger, services, unique):
    await start_cleanup(services)
    run, module = f"run-{unique}", f"m{unique}"
    await ledger.run(run, shard.id)
    await ledger.record(run, "zone", "arena-north", module=module, revert={"radius": 20})
    await ledger.end(run, "cancelled")
    await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
    assert (await ledger.console(run))["run"]["cleanupStatus"] == "incomplete"

    asked: list[bytes] = []

    async def module_revert(msg) -> None:
        asked.append(msg.data)
        await msg.respond(b'{"status": 200, "result": "removed"}')

    await nc.subscribe(subjects.module_revert(module), cb=module_revert)
    await nc.flush()
    retried = await ok(nc, subjects.CLEANUP_RETRY, {"runId": run}, timeout=30)

    assert retried["run"]["reverted"] == 1 and retried["run"]["cleanupStatus"] == "complete"
    assert len(asked) == 1 and b'"radius":20' in asked[0]
