"""Away, transient, and the attempts bound. A give-back that meets nobody — no gateway holds the
shard (NATS no responders), the gateway's own 504, no module subscribed — spends no attempt:
the row backs off in time and the run stays ``pending`` however many sweeps run, until the
shard or module is back and a sweep gives it back, with nobody retrying. Only an answer from
the shard or module itself ("not now": a module's 503) costs an attempt; once attempts reach
the bound the run's cleanup is incomplete, and a person's manual retry resets the attempts and
sweeps it now."""

from __future__ import annotations

import asyncio

from shared import subjects
from tests.cleanup.conftest import (
    ask,
    connect_shard,
    ok,
    shard_answers,
    shard_gone_from_gateway,
    start_cleanup,
    wait_for,
)

BACKOFF = {"away_backoff_s": "0.2", "away_backoff_max_s": "0.4"}
"""A back-off short enough that every sweep below finds the row due again."""

DUE_S = 0.6
"""Longer than the back-off's cap: after this the row may be claimed again."""


async def _waiting(nc) -> dict[str, dict]:
    return {r["runId"]: r for r in (await ok(nc, subjects.LEDGER_SWEEP_WAITING, {}))["runs"]}


async def test_a_shard_away_spends_no_attempt_however_many_sweeps_and_is_given_back_once_it_returns(
        nc, shard, ledger, services, unique):
    await start_cleanup(services, max_attempts="2", **BACKOFF)
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    (ref,) = (await shard.command("world.spawn", {"runId": run, "what": "boss"}))["body"]["serials"]
    await ledger.record(run, "boss", ref)
    await ledger.end(run, "completed")
    await shard.sim.drop()
    await shard_gone_from_gateway(nc, shard)

    # Three times the attempts bound: no responders each time, and nothing spent.
    for sweep_number in range(1, 7):
        await asyncio.sleep(DUE_S)
        sweep = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
        assert (sweep["claimed"], sweep["away"], sweep["transient"], sweep["failed"]) == (1, 1, 0, 0), sweep
        console = await ledger.console(run)
        (row,) = console["resources"]
        assert (row["status"], row["attempts"], row["gaveUp"]) == ("confirmed", 0, False)
        assert "503" in row["lastError"] and shard.id in row["lastError"]
        assert console["run"]["cleanupStatus"] == "pending"
        waiting = (await _waiting(nc))[run]
        assert (waiting["shard"], waiting["rows"], waiting["away"]) == (shard.id, 1, sweep_number)

    await shard.sim.connect()
    await wait_for(lambda: shard_answers(shard), "the shard is back", timeout=10)
    await asyncio.sleep(DUE_S)
    swept = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
    assert (swept["claimed"], swept["reverted"], swept["away"]) == (1, 1, 0), swept
    assert (await ledger.console(run))["run"]["cleanupStatus"] == "complete"
    assert ref not in shard.world.objects
    assert shard.sim.executed["world.despawn"] == 1
    assert run not in await _waiting(nc)


async def test_a_shard_that_does_not_answer_the_gateway_in_time_spends_no_attempt(nc, services, ledger, unique):
    # The gateway gives the shard 1 s, cleanup gives the gateway 5 s: the gateway's own 504.
    shard = await connect_shard(nc, services, f"c{unique}", command_timeout_s="1")
    try:
        await start_cleanup(services, max_attempts="1", command_timeout_s="5", **BACKOFF)
        run = f"run-{unique}"
        await ledger.run(run, shard.id)
        (ref,) = (await shard.command("world.spawn", {"runId": run, "what": "boss"}))["body"]["serials"]
        await ledger.record(run, "boss", ref)
        await ledger.end(run, "completed")
        shard.sim.mute.add("world.despawn")  # it acts, and its answer never comes
        sweep = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
        assert (sweep["claimed"], sweep["away"], sweep["transient"]) == (1, 1, 0), sweep
        console = await ledger.console(run)
        (row,) = console["resources"]
        assert "504" in row["lastError"] and "did not answer world.despawn" in row["lastError"]
        # One attempt allowed, none spent: still pending.
        assert (row["attempts"], console["run"]["cleanupStatus"]) == (0, "pending")

        # Due again: the same idempotency key, so the shard answers from what it did.
        await asyncio.sleep(DUE_S)
        swept = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
        assert swept["reverted"] == 1 and (await ledger.console(run))["run"]["cleanupStatus"] == "complete"
        assert shard.sim.executed["world.despawn"] == 1 and shard.sim.replayed["world.despawn"] == 1
    finally:
        await shard.sim.close()


async def test_a_module_that_answers_not_now_costs_one_attempt_per_sweep_until_the_bound_then_retry_gives_it_back(
        nc, shard, ledger, services, unique):
    await start_cleanup(services, max_attempts="3", **BACKOFF)
    run, module = f"run-{unique}", f"m{unique}"
    await ledger.run(run, shard.id)
    await ledger.record(run, "zone", "arena-north", module=module, revert={"radius": 20})
    await ledger.end(run, "completed")
    answer = {"data": b'{"status": 503, "error": "module restarting"}'}

    async def module_revert(msg) -> None:
        await msg.respond(answer["data"])

    await nc.subscribe(subjects.module_revert(module), cb=module_revert)
    await nc.flush()

    for attempt in (1, 2, 3):
        sweep = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
        assert (sweep["transient"], sweep["away"]) == (1, 0), sweep
        console = await ledger.console(run)
        (row,) = console["resources"]
        assert (row["status"], row["attempts"]) == ("confirmed", attempt)
        assert "module restarting" in row["lastError"]
        assert console["run"]["cleanupStatus"] == ("incomplete" if attempt == 3 else "pending")

    # Spent: a fourth sweep leaves it alone.
    assert (await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30))["claimed"] == 0

    answer["data"] = b'{"status": 200, "result": "removed"}'
    retried = await ok(nc, subjects.CLEANUP_RETRY, {"runId": run}, timeout=30)
    assert retried["run"]["reverted"] == 1 and retried["run"]["cleanupStatus"] == "complete"


async def test_retry_of_a_cleanup_that_is_not_incomplete_is_refused(nc, shard, ledger, services, unique):
    await start_cleanup(services)
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    reply = await ask(nc, subjects.CLEANUP_RETRY, {"runId": run})
    assert reply["status"] == 409 and "incomplete" in reply["error"]


async def test_a_module_that_starts_later_gets_its_rows_without_a_retry(nc, shard, ledger, services, unique):
    await start_cleanup(services, **BACKOFF)
    run, module = f"run-{unique}", f"m{unique}"
    await ledger.run(run, shard.id)
    await ledger.record(run, "zone", "arena-north", module=module, revert={"radius": 20})
    await ledger.end(run, "cancelled")
    for _ in range(4):  # more sweeps than the 3 attempts: nobody answers, nothing is spent
        sweep = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
        assert sweep["away"] == 1, sweep
        await asyncio.sleep(DUE_S)
    console = await ledger.console(run)
    assert console["run"]["cleanupStatus"] == "pending"
    (row,) = console["resources"]
    assert row["attempts"] == 0 and f"modules.{module}.revert" in row["lastError"] and "start it" in row["lastError"]
    # Not incomplete; a person's retry tries it at once: the module is still not there, so it
    # meets nobody again, spends nothing and the run stays pending.
    retried = await ok(nc, subjects.CLEANUP_RETRY, {"runId": run}, timeout=30)
    assert (retried["run"]["away"], retried["run"]["cleanupStatus"]) == (1, "pending"), retried
    assert (await ledger.console(run))["resources"][0]["attempts"] == 0
    await asyncio.sleep(DUE_S)

    asked: list[bytes] = []

    async def module_revert(msg) -> None:
        asked.append(msg.data)
        await msg.respond(b'{"status": 200, "result": "removed"}')

    await nc.subscribe(subjects.module_revert(module), cb=module_revert)
    await nc.flush()
    swept = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)

    assert swept["reverted"] == 1 and (await ledger.console(run))["run"]["cleanupStatus"] == "complete"
    assert len(asked) == 1 and b'"radius":20' in asked[0]
