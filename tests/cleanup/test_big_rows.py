"""Runs and modules whose rows add up to more than one NATS message: the sweep follows the
ledger's claim pages (``more``) and the reconcile its live-row pages (``next``), so every row
is given back or checked. A row written before the ledger capped ``revert`` (hundreds of
kilobytes) comes back without it (``revertOmitted``): a world object is still despawned (its
ref is all a despawn needs), anything else fails with a reason a person can act on, never
sent with a revert it does not have."""

from __future__ import annotations

import json

import asyncpg

from shared import subjects
from tests.cleanup.conftest import DespawnTally, ok, start_cleanup

FULL_REVERT = {"blob": "x" * 8000}
"""A revert just under the ledger's 8 KiB cap: 150 of them are 1.2 MB."""


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def _statuses(nc, run: str) -> dict[str, str]:
    """Each of the run's rows' ref → status, from every page of its console."""
    found: dict[str, str] = {}
    page = await ok(nc, subjects.LEDGER_CONSOLE, {"runId": run})
    while True:
        found.update({row["ref"]: row["status"] for row in page["resources"]})
        if page["next"] is None:
            return found
        page = await ok(nc, subjects.LEDGER_CONSOLE, {"runId": run, "after": page["next"]})


async def _spawn(shard, run: str, count: int) -> list[str]:
    serials: list[str] = []
    while len(serials) < count:
        reply = await shard.command("world.spawn", {"runId": run, "what": "creature",
                                                    "count": min(30, count - len(serials))})
        assert reply["status"] == 200, reply
        serials += reply["body"]["serials"]
    return serials


async def _legacy_row(database_url: str, run: str, module: str, kind: str, ref: str, revert_bytes: int) -> None:
    """A row as a ledger before the cap could have stored it."""
    conn = await asyncpg.connect(_plain(database_url))
    try:
        await conn.execute(
            "INSERT INTO resources (run_id, module, kind, ref, status, revert, idempotency_key) "
            "VALUES ($1, $2, $3, $4, 'confirmed', $5::jsonb, $6)",
            run, module, kind, ref, json.dumps({"blob": "y" * revert_bytes}), f"legacy:{run}:{ref}")
    finally:
        await conn.close()


async def test_a_run_holding_megabytes_is_swept_claim_page_after_claim_page(
        nc, shard, ledger, services, database_url, unique):
    await start_cleanup(services)
    run, module = f"fat-{unique}", f"zone{unique}"
    serials = await _spawn(shard, run, 151)
    await ledger.run(run, shard.id)
    await ledger.record_many([(run, "creature", serial, FULL_REVERT) for serial in serials[:150]])
    await _legacy_row(database_url, run, "arena", "creature", serials[150], 600_000)
    for ref in ("north", "south"):
        await _legacy_row(database_url, run, module, "zone", ref, 600_000)
    sent_to_module: list[bytes] = []

    async def module_revert(msg) -> None:
        sent_to_module.append(msg.data)
        await msg.respond(json.dumps({"status": 200, "result": "removed"}).encode())

    await nc.subscribe(subjects.module_revert(module), cb=module_revert)
    await ledger.end(run, "completed")
    tally = DespawnTally(shard.world)

    reply = await ok(nc, subjects.CLEANUP_SWEEP, {"runId": run}, timeout=60)

    swept = reply["run"]
    assert swept["claimed"] == 153 and swept["reverted"] == 151 and swept["failed"] == 2, swept
    # One world.despawn per claim page (each page's world rows together), 151 serials in all.
    assert tally.per_serial() == dict.fromkeys(serials, 1)
    assert shard.sim.executed["world.despawn"] == len(tally.commands) < 151
    assert not any(obj.present for obj in shard.world.objects.values() if obj.serial in serials)
    assert sent_to_module == []
    reasons = [f["reason"] for f in swept["failures"]]
    assert len(reasons) == 2 and all("too large" in r and "by hand" in r for r in reasons), reasons
    assert swept["cleanupStatus"] == "incomplete"
    statuses = await _statuses(nc, run)
    assert len(statuses) == 153 and statuses["north"] == statuses["south"] == "confirmed"
    assert sum(1 for status in statuses.values() if status == "reverted") == 151


async def test_a_reconcile_reads_every_live_row_of_a_module_page_after_page(
        nc, shard, ledger, services, unique):
    await start_cleanup(services)
    run, module = f"live-{unique}", f"siege{unique}"
    serials = await _spawn(shard, run, 150)
    await ledger.run(run, shard.id)
    await ledger.record_many([(run, "creature", serial, FULL_REVERT) for serial in serials], module=module)
    gone = serials[::50]
    for serial in gone:
        shard.world.kill(serial)

    report = await ok(nc, subjects.CLEANUP_RECONCILE, {"modules": [module]}, timeout=60)

    assert report["errors"] == [] and report["unanswered"] == []
    assert report["runs"] == 1 and report["orphaned"] == len(gone), report
    statuses = await _statuses(nc, run)
    assert len(statuses) == 150
    assert sorted(ref for ref, status in statuses.items() if status == "orphaned") == sorted(gone)


async def test_a_request_body_python_cannot_read_is_a_400(nc, services):
    await start_cleanup(services)
    for subject, payload, named in [
            (subjects.CLEANUP_SWEEP, b"[" * 100_000, "request: Input should be a valid dictionary"),
            (subjects.CLEANUP_RECONCILE, b'{"modules": ' + b"[" * 100_000, "request: Input should be"),
            (subjects.CLEANUP_SWEEP, b'{"runId": ' + b"5" * 5000 + b"}", "runId"),
            (subjects.CLEANUP_RETRY, b'{"runId": "a\\u0000b"}', "runId"),
            (subjects.CLEANUP_SWEEP, b'{"runId": "a.b"}', "runId"),
            (subjects.CLEANUP_RECONCILE, b'{"modules": ["\\ud800"]}', "modules.0")]:
        msg = await nc.request(subject, payload, timeout=10)
        reply = json.loads(msg.data)
        assert reply["status"] == 400 and named in reply["error"], (payload[:40], reply)
    health = json.loads((await nc.request(subjects.health("cleanup"), b"[" * 100_000, timeout=10)).data)
    assert health["status"] == 200 and health["service"] == "cleanup", health
