"""Fault: one replica of each service is SIGKILLed in turn while work goes on.

Runs keep being created on a simulated shard, recording what they really hold there, and
ended, while three cleanup replicas give it back. One of two ledger replicas is killed:
requests in flight to it time out and are sent again (same idempotency key) to the other.
Then a cleanup replica is killed mid-revert: its `reverting` rows are claimed again after
the claim timeout, and what it had already sent is replayed from the shard's idempotency
cache. Every resource is executed on the shard exactly once; no row is left unresolved.

One of two installers is killed mid-upgrade, holding the site lock: the other keeps
answering, takes the lock once its lease expires, and the retried upgrade succeeds; the
volume holds exactly one module and no scratch."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import nats
import nats.js.errors
import pytest

from services.installer import modules_dir
from shared import subjects
from tests.cleanup.conftest import Ledger, ask, connect_shard, start_cleanup, wait_for
from tests.cleanup.test_replicas import _all_clean
from tests.faults.shard_traffic import ShardTraffic
from tests.faults.workload import Retrying, Workload, keep_listing, lock_holder, scratch
from tests.installer.conftest import ca_file, releases, service_settings, settings  # noqa: F401 (fixtures)
from tests.processes import ServiceProcesses

pytestmark = pytest.mark.faults

RUNS, CREATURES, LEASES = 40, 20, 5
"""Runs the workload creates, populates and ends; world objects and leases each one holds."""

EVERY_S = 0.35
"""A new run starts this often, so the workload spans both kills."""

CLEANUP = {"sweep_period_s": "0.3", "claim_timeout_s": "3", "command_timeout_s": "2", "ledger_timeout_s": "2",
           "sweep_batch_size": "5", "sweep_runs_in_flight": "2", "give_back_concurrency": "8"}
"""Short periods so recovery takes seconds; a replica holds at most 2 runs × 5 rows at once."""

SLOW_DESPAWN_S = 1.0
"""How long a despawn takes while the cleanup kill is prepared (a backlog builds up)."""

HELD_BY_TWO = 2 * 2 * 5
"""The most rows two cleanup replicas can hold: with more `reverting`, the third holds some."""


async def _kill_a_cleanup_mid_revert(procs: ServiceProcesses, victim, work: Workload) -> tuple[int, float, int]:
    """Kill ``victim`` while all three replicas hold rows; (rows it stranded, seconds until
    they were all given back by the others, replays the shard answered meanwhile)."""
    sim = work.shard.sim
    sim.answer_delay_s["world.despawn"] = SLOW_DESPAWN_S
    await wait_for(lambda: work.reverting_more_than(HELD_BY_TWO), "a backlog held by all three", timeout=20, every=0.05)
    at_kill, replays = await work.reverting(), sim.replayed["world.despawn"]
    procs.stop(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    sim.answer_delay_s.pop("world.despawn")
    # The survivors' give-backs finish within the slow despawn; what is still `reverting`
    # after that (and was before the kill) was the dead replica's.
    await asyncio.sleep(SLOW_DESPAWN_S + 0.3)
    stranded = at_kill & await work.reverting()
    await wait_for(lambda: work.none_reverting(stranded), "stranded rows given back", timeout=20, every=0.1)
    return len(stranded), time.monotonic() - killed_at, sim.replayed["world.despawn"] - replays


@pytest.mark.timeout(180)
async def test_sigkill_of_a_ledger_then_a_cleanup_replica_gives_everything_back_once(
        nats_url, database_url, tmp_path, unique):
    procs = ServiceProcesses(tmp_path, nats_url)
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    answered, shard, producing, traffic = Retrying(nc), None, None, None
    try:
        traffic = await ShardTraffic.start(procs)
        ledgers = [procs.start("ledger", database_url=database_url) for _ in range(2)]
        shard = await connect_shard(nc, procs, f"rk{unique}")
        cleanups = [await start_cleanup(procs, **CLEANUP) for _ in range(3)]
        work = Workload(shard, Ledger(answered, ledgers[1]), f"w{unique}", CREATURES, LEASES)
        producing = asyncio.create_task(work.produce(RUNS, EVERY_S))

        await work.wait_ended(RUNS // 4)
        answered.busy.clear()  # kill the ledger while a run's records are in flight
        await asyncio.wait_for(answered.busy.wait(), 10)
        # Frozen first, then killed: the requests NATS hands it meanwhile are delivered and never
        # answered, as in a crash mid-request. (A bare kill after a few milliseconds found nothing
        # in flight once the ledger answered within them.)
        ledgers[0].proc.send_signal(signal.SIGSTOP)
        await asyncio.sleep(0.3)
        procs.stop(ledgers[0], signal.SIGKILL)
        ledger_killed_at = time.monotonic()
        await work.wait_ended(RUNS // 2)
        ledger_back = max(answered.recovered_times, default=ledger_killed_at) - ledger_killed_at

        stranded, takeover, replays = await _kill_a_cleanup_mid_revert(procs, cleanups[0], work)
        await asyncio.wait_for(producing, 60)
        await wait_for(lambda: _all_clean(answered, work.ended), "every run's cleanup complete", timeout=30,
                       every=0.5)
        consoles = await work.consoles()
        await traffic.finish(nc)
    finally:
        if producing:
            producing.cancel()
            await asyncio.gather(producing, return_exceptions=True)
        if shard:
            await shard.sim.close()
        await nc.close()
        if traffic:
            traffic.stop()
        procs.stop_all()

    resources = RUNS * (CREATURES + LEASES)
    despawned = shard.world.despawned  # by serial: one world.despawn gives back a run's creatures
    executed = sum(despawned.values()) + shard.sim.executed["lease.release"]
    stuck = sum(console["unresolved"] for console in consoles)
    print(f"\nledger and cleanup replicas SIGKILLed: runs {len(work.ended)}, resources {resources}, "
          f"executed {executed}, duplicated {max(0, executed - resources)}, stuck {stuck}; ledger requests "
          f"{answered.requests}, failed during kills {answered.failed} ({answered.retried_ok} retried OK); "
          f"all answered {ledger_back:.2f} s after the ledger kill; cleanup kill stranded {stranded} "
          f"rows, taken over in {takeover:.2f} s ({replays} replays); {traffic.line()}")
    assert len(work.ended) == RUNS
    assert len(despawned) == RUNS * CREATURES and set(despawned.values()) == {1}
    assert shard.sim.executed["lease.release"] == RUNS * LEASES
    assert not any(obj.present for obj in shard.world.objects.values()) and shard.world.holds == {}
    assert stuck == 0 and all(c["counts"]["reverted"] == CREATURES + LEASES for c in consoles)
    assert stranded > 0, "the cleanup replica was killed holding no row"
    assert answered.failed >= 1, "the ledger replica was killed with no request in flight"
    assert ledger_back < 5.0
    traffic.check()


LOCK_LEASE_S = 3
"""The installers' site-lock lease: a dead holder's lock expires this long after its last renewal."""

SLOW_ARTIFACT_S = 4.0
"""The upgrade's artifact is this slow to come, so the kill lands mid-install."""


@pytest.mark.timeout(150)
async def test_sigkill_of_an_installer_replica_mid_install_leaves_one_module_and_no_scratch(
        nats_url, releases, settings, tmp_path, unique):  # noqa: F811  fixtures, imported above
    bucket, volume = f"FAULTS_{unique}", Path(settings.modules_dir)
    config = {**service_settings(settings), "installer_lock_bucket": bucket,
              "installer_lock_lease_s": str(LOCK_LEASE_S)}
    procs = ServiceProcesses(tmp_path, nats_url)
    nc = await nats.connect(nats_url, connect_timeout=5)
    stop, seen, lister, doomed, traffic = asyncio.Event(), {"answered": 0, "failed": 0}, None, None, None
    try:
        traffic = await ShardTraffic.start(procs)
        replicas = {handle.proc.pid: handle for handle in [procs.start("installer", **config) for _ in range(2)]}
        urls = {version: releases.release(f"/{unique}", "uo-alpha", version) for version in ("1.0.0", "1.1.0")}
        beta = releases.release(f"/{unique}", "uo-beta", "1.0.0")
        assert (await ask(nc, subjects.INSTALLER_INSTALL, {"url": urls["1.0.0"]}, 20))["status"] == 200
        slow = releases.routes[f"/{unique}/uo-alpha-1.1.0.tar.gz"]
        slow.delay_s = SLOW_ARTIFACT_S
        doomed = asyncio.create_task(ask(nc, subjects.INSTALLER_INSTALL, {"url": urls["1.1.0"]}, 6))
        holder = await wait_for(lambda: lock_holder(nc, bucket, settings.installer_site), "the lock taken", 10, 0.02)
        await wait_for(lambda: scratch(volume), "the upgrade's scratch dir", 10, 0.02)
        lister = asyncio.create_task(keep_listing(nc, seen, stop))
        procs.stop(replicas[holder], signal.SIGKILL)
        killed_at = time.monotonic()
        slow.delay_s = 0.0

        retried = await ask(nc, subjects.INSTALLER_INSTALL, {"url": urls["1.1.0"]}, 20)  # same request again
        takeover = time.monotonic() - killed_at
        refused = await ask(nc, subjects.INSTALLER_INSTALL, {"url": beta}, 20)
        stop.set()
        await asyncio.wait_for(lister, 5)
        with pytest.raises(nats.errors.TimeoutError):
            await doomed  # it was the dead replica's
        await traffic.finish(nc)
    finally:
        stop.set()
        tasks = [task for task in (lister, doomed) if task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if traffic:
            traffic.stop()
        procs.stop_all()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream().delete_key_value(bucket)
        await nc.close()

    print(f"\ninstaller replica SIGKILLed mid-upgrade: retried upgrade {retried['status']} {retried.get('action')} "
          f"{takeover:.2f} s after the kill; lists answered {seen['answered']}, failed {seen['failed']}; "
          f"volume {sorted(p.name for p in volume.iterdir())}; {traffic.line()}")
    assert retried["status"] == 200 and retried["action"] == "upgraded", retried
    assert not retried["replica"].endswith(f":{holder}")
    assert refused["status"] == 409 and "uo-alpha 1.1.0 is installed" in refused["error"], refused
    assert [(m.id, m.version) for m in modules_dir.installed(volume)] == [("uo-alpha", "1.1.0")]
    assert sorted(p.name for p in volume.iterdir()) == ["uo-alpha"], "scratch or set-aside left behind"
    assert seen["answered"] > 10 and seen["failed"] <= 1
    traffic.check()
