"""Resources: reserve, confirm, record, fail; one live row per target; idempotent records;
each change with its run-log entry in the same transaction."""

from __future__ import annotations

from shared import subjects
from tests.ledger.conftest import log_kinds


async def test_a_reservation_is_pending_then_confirmed(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    reserved = await ledger.record(run, "gate-1", kind="gate", reserve=True, revert={"serial": 7})
    assert reserved["status"] == 200 and reserved["resource"]["status"] == "pending"
    assert reserved["resource"]["revert"] == {"serial": 7}
    confirmed = await ledger.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=reserved["resource"]["resourceId"])
    assert confirmed["status"] == 200 and confirmed["resource"]["status"] == "confirmed"
    assert (await log_kinds(db, run))[-2:] == ["resource.recorded", "resource.confirmed"]


async def test_a_record_is_confirmed_at_once(ledger, unique):
    await ledger.run(f"r{unique}", "running")
    reply = await ledger.record(f"r{unique}", "lease:spawn.rate", kind="lease", leaseDeadline=1_733_000_000_000,
                                revert={"key": "spawn.rate", "target": None, "expected": "2", "baseline": "1"})
    assert reply["resource"]["status"] == "confirmed"
    assert reply["resource"]["leaseDeadline"] == 1_733_000_000_000


async def test_a_retried_record_with_the_same_key_returns_the_first_row(ledger, db, unique):
    await ledger.run(f"r{unique}", "running")
    first = await ledger.record(f"r{unique}", "c1", key=f"k{unique}")
    again = await ledger.record(f"r{unique}", "c1", key=f"k{unique}")
    assert again == first
    assert await db.fetchval("SELECT count(*) FROM resources") == 1
    assert (await log_kinds(db, f"r{unique}")).count("resource.recorded") == 1


async def test_a_key_reused_for_another_target_is_a_conflict(ledger, db, unique):
    await ledger.run(f"r{unique}", "running")
    await ledger.record(f"r{unique}", "c1", key=f"k{unique}")
    reply = await ledger.record(f"r{unique}", "c2", key=f"k{unique}")
    assert reply["status"] == 409 and "idempotencyKey" in reply["error"]
    assert await db.fetchval("SELECT count(*) FROM resources") == 1


async def test_a_held_target_cannot_be_reserved_again(ledger, db, unique):
    await ledger.run(f"a{unique}", "running")
    await ledger.run(f"b{unique}", "running")
    held = await ledger.record(f"a{unique}", "spawn.rate", kind="lease", module="lease")
    reply = await ledger.record(f"b{unique}", "spawn.rate", kind="lease", module="lease", reserve=True)
    assert reply["status"] == 409
    assert f"resource {held['resource']['resourceId']}" in reply["error"] and "held" in reply["error"]
    assert await db.fetchval("SELECT count(*) FROM resources") == 1


async def test_the_same_ref_of_another_kind_or_module_is_another_target(ledger, unique):
    await ledger.run(f"r{unique}", "running")
    assert (await ledger.record(f"r{unique}", "x", kind="gate"))["status"] == 200
    assert (await ledger.record(f"r{unique}", "x", kind="creature"))["status"] == 200
    assert (await ledger.record(f"r{unique}", "x", kind="gate", module="other"))["status"] == 200


async def test_a_resolved_row_releases_its_target(ledger, unique):
    await ledger.run(f"r{unique}", "running")
    first = await ledger.record(f"r{unique}", "spawn.rate", kind="lease", module="lease")
    await ledger.ask(subjects.ledger_expired("lease"), kind="lease", ref="spawn.rate")
    again = await ledger.record(f"r{unique}", "spawn.rate", kind="lease", module="lease", key=f"k2{unique}")
    assert again["status"] == 200 and again["resource"]["resourceId"] != first["resource"]["resourceId"]


async def test_a_failed_reservation_frees_its_target_and_keeps_the_error(ledger, db, unique):
    await ledger.run(f"r{unique}", "running")
    reserved = await ledger.record(f"r{unique}", "boss-1", reserve=True)
    failed = await ledger.ask(subjects.LEDGER_RESOURCE_FAIL, resourceId=reserved["resource"]["resourceId"],
                              error="spawn over the shard's ceiling")
    assert failed["status"] == 200
    assert failed["resource"]["status"] == "reverted"
    assert failed["resource"]["lastError"] == "spawn over the shard's ceiling"
    assert (await ledger.record(f"r{unique}", "boss-1", reserve=True, key=f"k2{unique}"))["status"] == 200
    assert "resource.failed" in await log_kinds(db, f"r{unique}")


async def test_confirming_a_row_that_is_not_pending_is_a_conflict(ledger, unique):
    await ledger.run(f"r{unique}", "running")
    recorded = await ledger.record(f"r{unique}", "c1")
    reply = await ledger.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=recorded["resource"]["resourceId"])
    assert reply["status"] == 409 and "confirmed" in reply["error"]


async def test_an_unknown_resource_is_not_found(ledger):
    reply = await ledger.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=987654)
    assert reply["status"] == 404 and "987654" in reply["error"]


async def test_a_run_that_is_over_takes_no_new_reservation(ledger, db, unique):
    await ledger.run(f"r{unique}", "completed")
    reply = await ledger.record(f"r{unique}", "c1", reserve=True)
    assert reply["status"] == 409 and "completed" in reply["error"]
    assert await db.fetchval("SELECT count(*) FROM resources") == 0


async def test_a_record_for_a_finished_run_is_kept_and_reopens_its_cleanup(ledger, unique):
    await ledger.run(f"r{unique}", "completed")
    assert (await ledger.ask(subjects.LEDGER_SWEEP_SETTLE))["settled"] >= 1
    reply = await ledger.record(f"r{unique}", "late-spawn")
    assert reply["status"] == 200 and reply["resource"]["status"] == "confirmed"
    console = await ledger.console(f"r{unique}")
    assert console["run"]["cleanupStatus"] == "pending" and console["unresolved"] == 1


async def test_a_resource_of_an_unknown_run_is_not_found(ledger, db, unique):
    reply = await ledger.record(f"nope{unique}", "c1")
    assert reply["status"] == 404
    assert await db.fetchval("SELECT count(*) FROM resources") == 0
