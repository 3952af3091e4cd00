"""Event runs: created idempotently, moved only along the run state machine."""

from __future__ import annotations

import pytest

from shared import subjects
from tests.ledger.conftest import log_kinds

ALLOWED = [("scheduled", "running"), ("scheduled", "cancelled"), ("scheduled", "missed"),
           ("running", "completed"), ("running", "cancelled"), ("running", "failed")]
REFUSED = [("scheduled", "completed"), ("scheduled", "failed"), ("running", "scheduled"),
           ("running", "missed"), ("completed", "running"), ("completed", "failed"),
           ("cancelled", "running"), ("missed", "running"), ("failed", "completed")]


async def test_a_created_run_is_scheduled_with_cleanup_pending(ledger, db, unique):
    reply = await ledger.ask(subjects.LEDGER_RUN_CREATE, runId=f"r{unique}", shard="uo1", event="invasion")
    assert reply["status"] == 200
    assert reply["run"]["status"] == "scheduled" and reply["run"]["cleanupStatus"] == "pending"
    assert await log_kinds(db, f"r{unique}") == ["run.created"]


async def test_a_run_without_an_id_gets_a_generated_one(ledger):
    reply = await ledger.ask(subjects.LEDGER_RUN_CREATE, shard="uo1", event="invasion")
    assert reply["status"] == 200 and len(reply["run"]["runId"]) == 32


async def test_creating_the_same_run_again_returns_the_first_run(ledger, db, unique):
    first = await ledger.ask(subjects.LEDGER_RUN_CREATE, runId=f"r{unique}", shard="uo1", event="invasion")
    again = await ledger.ask(subjects.LEDGER_RUN_CREATE, runId=f"r{unique}", shard="uo1", event="invasion")
    assert again == first
    assert await log_kinds(db, f"r{unique}") == ["run.created"]


async def test_reusing_a_run_id_for_another_event_is_a_conflict(ledger, unique):
    await ledger.ask(subjects.LEDGER_RUN_CREATE, runId=f"r{unique}", shard="uo1", event="invasion")
    reply = await ledger.ask(subjects.LEDGER_RUN_CREATE, runId=f"r{unique}", shard="uo1", event="harvest")
    assert reply["status"] == 409 and "invasion" in reply["error"]


@pytest.mark.parametrize(("start", "to"), ALLOWED)
async def test_an_allowed_run_transition_happens(ledger, db, unique, start, to):
    await ledger.run(f"r{unique}", start)
    reply = await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=f"r{unique}", status=to)
    assert reply["status"] == 200 and reply["run"]["status"] == to
    assert (reply["run"]["endedAt"] is not None) == (to in ("completed", "cancelled", "failed", "missed"))


@pytest.mark.parametrize(("start", "to"), REFUSED)
async def test_a_disallowed_run_transition_is_a_conflict_and_changes_nothing(ledger, db, unique, start, to):
    await ledger.run(f"r{unique}", start)
    before = await log_kinds(db, f"r{unique}")
    reply = await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=f"r{unique}", status=to)
    assert reply["status"] == 409 and start in reply["error"]
    assert await db.fetchval("SELECT status FROM runs WHERE run_id = $1", f"r{unique}") == start
    assert await log_kinds(db, f"r{unique}") == before


async def test_asking_for_the_status_a_run_already_has_changes_nothing(ledger, db, unique):
    await ledger.run(f"r{unique}", "running")
    before = await log_kinds(db, f"r{unique}")
    reply = await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=f"r{unique}", status="running")
    assert reply["status"] == 200 and reply["run"]["status"] == "running"
    assert await log_kinds(db, f"r{unique}") == before


async def test_the_status_of_an_unknown_run_is_not_found(ledger, unique):
    reply = await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=f"r{unique}", status="running")
    assert reply["status"] == 404 and f"r{unique}" in reply["error"]
