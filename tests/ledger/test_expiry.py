"""Expiry (docs/ledger.md, "Expiry"), one test per rule: which rows expire, which are left, what a malformed
expiry does, the log entry, and when a run's cleanup becomes complete."""

from __future__ import annotations

import pytest

from shared import subjects
from tests.ledger.conftest import log_kinds


async def _expire(ledger, module: str = "world", **body) -> int:
    reply = await ledger.ask(subjects.ledger_expired(module), **body)
    assert reply["status"] == 200, reply
    return reply["expired"]


async def _status(db, resource_id: int) -> str:
    return await db.fetchval("SELECT status FROM resources WHERE id = $1", resource_id)


async def _claim(ledger, run_id: str) -> list[dict]:
    reply = await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run_id, maxAttempts=3, limit=10, claimTimeoutS=60)
    assert reply["status"] == 200, reply
    return reply["resources"]


@pytest.mark.parametrize("how", ["pending", "confirmed", "orphaned"])
async def test_a_pending_confirmed_or_orphaned_row_expires(ledger, db, unique, how):
    run = f"r{unique}"
    await ledger.run(run, "running")
    row = (await ledger.record(run, "c1", reserve=how == "pending"))["resource"]
    if how == "orphaned":
        await ledger.ask(subjects.ledger_reconcile("world"), runId=run, present=[])
        assert await _status(db, row["resourceId"]) == "orphaned"
    assert await _expire(ledger, kind="creature", ref="c1") == 1
    assert await _status(db, row["resourceId"]) == "expired"


async def test_a_reverting_row_is_left_to_its_revert(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    row = (await ledger.record(run, "c1"))["resource"]
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    assert len(await _claim(ledger, run)) == 1
    assert await _expire(ledger, kind="creature", ref="c1") == 0
    assert await _status(db, row["resourceId"]) == "reverting"


@pytest.mark.parametrize("resolved", ["reverted", "expired", "drifted"])
async def test_a_row_that_is_resolved_or_drifted_stays_as_it_is(ledger, db, unique, resolved):
    run = f"r{unique}"
    await ledger.run(run, "running")
    row = (await ledger.record(run, "c1"))["resource"]
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    if resolved == "expired":
        await _expire(ledger, kind="creature", ref="c1")
    else:
        await _claim(ledger, run)
        await ledger.ask(f"ledger.sweep.{resolved}", resourceId=row["resourceId"])
    before = await log_kinds(db, run)
    assert await _expire(ledger, kind="creature", ref="c1") == 0
    assert await _status(db, row["resourceId"]) == resolved
    assert await log_kinds(db, run) == before


@pytest.mark.parametrize("body", [
    {"ref": "c1"},
    {"kind": "creature"},
    {"kind": 5, "ref": "c1"},
    {"kind": "creature", "ref": ["c1"]},
    {"kind": "creature", "ref": None},
    {"kind": "k" * 65, "ref": "c1"},
    {"kind": "creature", "ref": "r" * 191},
    {"kind": "", "ref": "c1"},
    {"kind": "creature", "ref": "nothing-by-that-ref"},
], ids=["no-kind", "no-ref", "kind-not-text", "ref-a-list", "ref-null", "kind-too-long", "ref-too-long",
        "kind-empty", "unmatched"])
async def test_a_malformed_or_unmatched_expiry_answers_zero_and_writes_nothing(ledger, db, unique, body):
    run = f"r{unique}"
    await ledger.run(run, "running")
    await ledger.record(run, "c1")
    before = await db.fetch("SELECT * FROM run_log ORDER BY id")
    assert await _expire(ledger, **body) == 0
    assert await db.fetch("SELECT * FROM run_log ORDER BY id") == before
    assert await db.fetchval("SELECT status FROM resources") == "confirmed"


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b'"creature"', b"null", b""])
async def test_an_expiry_that_is_not_a_json_object_answers_zero(ledger, db, unique, payload):
    await ledger.run(f"r{unique}", "running")
    await ledger.record(f"r{unique}", "c1")
    assert await ledger.raw(subjects.ledger_expired("world"), payload) == {"status": 200, "expired": 0}
    assert await db.fetchval("SELECT status FROM resources") == "confirmed"


async def test_each_expired_row_writes_a_resource_expired_log_entry(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    row = (await ledger.record(run, "c1"))["resource"]
    await _expire(ledger, kind="creature", ref="c1")
    entry = await db.fetchrow("SELECT * FROM run_log WHERE kind = 'resource.expired'")
    assert entry["run_id"] == run and entry["resource_id"] == row["resourceId"]


@pytest.mark.parametrize("cleanup", ["pending", "incomplete"])
async def test_the_last_unresolved_row_of_a_finished_run_completes_its_cleanup(ledger, db, unique, cleanup):
    run = f"r{unique}"
    await ledger.run(run, "running")
    await ledger.record(run, "c1")
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    await db.execute("UPDATE runs SET cleanup_status = $1 WHERE run_id = $2", cleanup, run)
    assert await _expire(ledger, kind="creature", ref="c1") == 1
    assert await db.fetchval("SELECT cleanup_status FROM runs WHERE run_id = $1", run) == "complete"


async def test_a_finished_run_with_rows_left_keeps_its_cleanup(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    await ledger.record(run, "c1")
    await ledger.record(run, "c2")
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    assert await _expire(ledger, kind="creature", ref="c1") == 1
    assert await db.fetchval("SELECT cleanup_status FROM runs WHERE run_id = $1", run) == "pending"


async def test_a_running_run_is_left_to_its_own_end(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    await ledger.record(run, "c1")
    assert await _expire(ledger, kind="creature", ref="c1") == 1
    assert await db.fetchval("SELECT cleanup_status FROM runs WHERE run_id = $1", run) == "pending"
    assert await db.fetchval("SELECT status FROM runs WHERE run_id = $1", run) == "running"


async def test_a_module_expires_only_its_own_rows(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    mine = (await ledger.record(run, "same-ref", module="mine"))["resource"]
    theirs = (await ledger.record(run, "same-ref", module="theirs"))["resource"]
    assert await _expire(ledger, "mine", kind="creature", ref="same-ref") == 1
    assert await _status(db, mine["resourceId"]) == "expired"
    assert await _status(db, theirs["resourceId"]) == "confirmed"


async def test_a_module_expires_only_the_target_it_named(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    named = (await ledger.record(run, "c1"))["resource"]
    other_ref = (await ledger.record(run, "c2"))["resource"]
    other_kind = (await ledger.record(run, "c1", kind="gate"))["resource"]
    assert await _expire(ledger, kind="creature", ref="c1") == 1
    assert await _status(db, named["resourceId"]) == "expired"
    assert await _status(db, other_ref["resourceId"]) == "confirmed"
    assert await _status(db, other_kind["resourceId"]) == "confirmed"
