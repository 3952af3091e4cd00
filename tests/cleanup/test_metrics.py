"""The cleanup service's /metrics (services/cleanup/metrics.py): a cleanup process scraped over
HTTP while it sweeps a run whose give-backs end reverted and drifted."""

from __future__ import annotations

from shardbus.embedded import free_port
from shared import subjects
from tests.cleanup.conftest import ok, start_cleanup
from tests.scrape import scrape, value


async def test_a_sweep_moves_the_give_back_run_and_duration_series(nc, shard, ledger, services, unique) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    await start_cleanup(services, metrics_port=port)
    run = f"run-{unique}"
    await ledger.run(run, shard.id)
    spawned = await shard.command("world.spawn", {"runId": run, "what": "creature", "count": 2})
    for ref in spawned["body"]["serials"]:
        await ledger.record(run, "creature", ref)
    leased = await shard.command("lease.apply", {"runId": run, "key": "PlayerCaps.SkillCap", "value": "1300",
                                                 "holdMs": 600_000})
    await ledger.record(run, "lease", "PlayerCaps.SkillCap",
                        revert={"key": "PlayerCaps.SkillCap", "target": None, "expected": "1300",
                                "baseline": leased["body"]["baseline"]})
    shard.world.set_value("PlayerCaps.SkillCap", "1250")  # changed by hand: the give-back drifts
    await ledger.end(run, "cancelled")
    before = await scrape(url)
    assert value(before, "shardbus_nats_connected", service="cleanup") == 1

    sweep = await ok(nc, subjects.CLEANUP_SWEEP, {}, timeout=30)
    assert sweep["reverted"] == 2 and sweep["drifted"] == 1
    after = await scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("shardbus_cleanup_givebacks_total", verdict="reverted") == 2
    assert delta("shardbus_cleanup_givebacks_total", verdict="drifted") == 1
    assert delta("shardbus_cleanup_runs_finished_total", status="incomplete") == 1
    assert delta("shardbus_cleanup_sweep_duration_seconds_count") == 1
    assert value(after, "shardbus_cleanup_runs_waiting") == 0
