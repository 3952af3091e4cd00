"""Waiting made visible and actionable (issue 29): a run whose give-backs meet no shard stays
``pending`` (docs/adr/0006-away-is-never-incomplete.md); once it has waited longer than
``SHARDBUS_AWAY_ALERT_S`` cleanup counts it (``shardbus_cleanup_runs_waiting_too_long``) and logs
it once, not on every sweep; and ``cleanup.retry`` of a waiting run tries it now instead of
after its back-off."""

from __future__ import annotations

import asyncio
import json

from shardbus.embedded import free_port
from shared import subjects
from tests.cleanup.conftest import ask, ok, shard_answers, shard_gone_from_gateway, start_cleanup, wait_for
from tests.scrape import scrape, value

BACKOFF = {"away_backoff_s": "0.2", "away_backoff_max_s": "0.4"}
DUE_S = 0.6
"""Longer than the back-off's cap: after this the row may be claimed again."""

LOGGED = "for its shard: start the shard or module"
"""What cleanup's line about a run waiting too long says."""


def _alerts(log: str, run: str) -> list[dict]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [line for line in lines if LOGGED in line.get("msg", "") and line.get("runId") == run]


async def _waiting_run(ledger, run: str, shard: str = "nobody-here") -> None:
    """A finished run on a shard no gateway holds, holding one creature."""
    await ledger.run(run, shard)
    await ledger.record(run, "creature", "c1")
    await ledger.end(run, "completed")


async def test_a_run_waiting_longer_than_the_alert_is_counted_and_logged_once(nc, ledger, services, unique):
    port = free_port()
    cleanup = await start_cleanup(services, metrics_port=port, away_alert_s="0", **BACKOFF)
    run = f"run-{unique}"
    await _waiting_run(ledger, run)
    for _sweep in range(3):
        swept = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
        assert (swept["away"], swept["failed"]) == (1, 0), swept
        metrics = await scrape(f"http://127.0.0.1:{port}/metrics")
        assert value(metrics, "shardbus_cleanup_runs_waiting_too_long") == 1
        await asyncio.sleep(DUE_S)
    (line,) = _alerts(cleanup.log(), run)  # three sweeps, one line
    assert line["level"] == "warning" and line["shard"] == "nobody-here" and line["rows"] == 1
    waiting = (await ok(nc, subjects.LEDGER_SWEEP_WAITING, {"runId": run}))["runs"]
    assert [(w["runId"], w["away"], w["waitingSince"]) for w in waiting] == [(run, 3, line["waitingSince"])]
    assert (await ledger.console(run))["run"]["cleanupStatus"] == "pending"  # never incomplete for absence


async def test_a_run_waiting_less_than_the_alert_is_neither_counted_nor_logged(nc, ledger, services, unique):
    port = free_port()
    cleanup = await start_cleanup(services, metrics_port=port, **BACKOFF)  # the default: 900 s
    run = f"run-{unique}"
    await _waiting_run(ledger, run)
    swept = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
    assert swept["away"] == 1, swept
    metrics = await scrape(f"http://127.0.0.1:{port}/metrics")
    assert value(metrics, "shardbus_cleanup_runs_waiting") == 1
    assert value(metrics, "shardbus_cleanup_runs_waiting_too_long") == 0
    assert _alerts(cleanup.log(), run) == []


async def test_a_retry_of_a_run_waiting_for_its_shard_gives_it_back_at_once_once_the_shard_is_back(
        nc, shard, ledger, services, unique):
    # Ten minutes of back-off: without the retry nothing would be tried again during the test.
    await start_cleanup(services, away_backoff_s="600", away_backoff_max_s="600")
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    (ref,) = (await shard.command("world.spawn", {"runId": run, "what": "boss"}))["body"]["serials"]
    await ledger.record(run, "boss", ref)
    await ledger.end(run, "completed")
    await shard.sim.drop()

    await shard_gone_from_gateway(nc, shard)
    swept = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
    assert (swept["claimed"], swept["away"]) == (1, 1), swept

    await shard.sim.connect()
    await wait_for(lambda: shard_answers(shard), "the shard is back", timeout=10)
    swept = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
    assert swept["claimed"] == 0, swept  # backing off: a sweep alone does not try it yet

    retried = await ok(nc, subjects.CLEANUP_RETRY, {"runId": run}, timeout=30)
    assert (retried["run"]["reverted"], retried["run"]["cleanupStatus"]) == (1, "complete"), retried
    assert shard.sim.executed["world.despawn"] == 1 and ref not in shard.world.objects
    log = (await ok(nc, subjects.LEDGER_LOG, {"runId": run}))["entries"]
    assert [e["detail"] for e in log if e["kind"] == "cleanup.retried"] == [{"dueNow": 1}]
    # Given back: nothing waits, and a retry now is refused as before (not incomplete).
    assert (await ok(nc, subjects.LEDGER_SWEEP_WAITING, {"runId": run}))["runs"] == []
    assert (await ask(nc, subjects.CLEANUP_RETRY, {"runId": run}))["status"] == 409
