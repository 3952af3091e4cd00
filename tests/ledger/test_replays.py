"""Retries never look like conflicts (statuses.is_replay): a transition asked again after a
lost reply answers 200 with the row and changes nothing — no second log entry, no second
event — while a request the row's state really contradicts stays 409."""

from __future__ import annotations

import pytest

from shared import subjects
from tests.ledger.conftest import log_kinds
from tests.ledger.test_sweep import _claim, _finish, _finished_run


async def _reserved(ledger, run: str) -> int:
    await ledger.run(run, "running")
    return (await ledger.record(run, "c1", reserve=True))["resource"]["resourceId"]


async def _claimed(ledger, run: str) -> int:
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    return row


# (name, how the row is made, subject, body beyond resourceId, the status it reaches, log kind)
REPLAYS = [
    ("confirm", _reserved, subjects.LEDGER_RESOURCE_CONFIRM, {}, "confirmed", "resource.confirmed"),
    ("fail", _reserved, subjects.LEDGER_RESOURCE_FAIL, {"error": "over the ceiling"}, "reverted", "resource.failed"),
    ("sweep-reverted", _claimed, subjects.LEDGER_SWEEP_REVERTED, {}, "reverted", "cleanup.reverted"),
    ("sweep-drifted", _claimed, subjects.LEDGER_SWEEP_DRIFTED, {"error": "moved by a GM"}, "drifted",
     "cleanup.drifted"),
]


@pytest.mark.parametrize("name,make,subject,body,status,kind", REPLAYS, ids=[r[0] for r in REPLAYS])
async def test_the_same_transition_asked_again_answers_200_with_the_row_and_changes_nothing(
        ledger, db, unique, name, make, subject, body, status, kind):
    run = f"r{unique}"
    row = await make(ledger, run)
    first = await ledger.ask(subject, resourceId=row, **body)
    assert first["status"] == 200 and first["resource"]["status"] == status
    events_before = await db.fetchval("SELECT count(*) FROM run_log WHERE run_id = $1", run)

    again = await ledger.ask(subject, resourceId=row, **body)

    assert again == first
    assert (await log_kinds(db, run)).count(kind) == 1
    assert await db.fetchval("SELECT count(*) FROM run_log WHERE run_id = $1", run) == events_before


# (name, how the row is made, the first request, the second: a real conflict)
CONFLICTS = [
    ("confirm-a-recorded-row", "record", None, (subjects.LEDGER_RESOURCE_CONFIRM, {})),
    ("confirm-after-fail", "reserve", (subjects.LEDGER_RESOURCE_FAIL, {"error": "ceiling"}),
     (subjects.LEDGER_RESOURCE_CONFIRM, {})),
    ("fail-after-confirm", "reserve", (subjects.LEDGER_RESOURCE_CONFIRM, {}),
     (subjects.LEDGER_RESOURCE_FAIL, {"error": "ceiling"})),
    ("fail-again-with-another-error", "reserve", (subjects.LEDGER_RESOURCE_FAIL, {"error": "one"}),
     (subjects.LEDGER_RESOURCE_FAIL, {"error": "another"})),
]


@pytest.mark.parametrize("name,how,first,second", CONFLICTS, ids=[c[0] for c in CONFLICTS])
async def test_a_request_the_rows_state_contradicts_stays_a_conflict(ledger, unique, name, how, first, second):
    run = f"r{unique}"
    await ledger.run(run, "running")
    row = (await ledger.record(run, "c1", reserve=how == "reserve"))["resource"]["resourceId"]
    if first:
        assert (await ledger.ask(first[0], resourceId=row, **first[1]))["status"] == 200
    reply = await ledger.ask(second[0], resourceId=row, **second[1])
    assert reply["status"] == 409, reply


async def test_a_failed_give_back_asked_twice_is_two_failures_never_a_replay(ledger, db, unique):
    run = f"r{unique}"
    row = await _claimed(ledger, run)
    body = {"resourceId": row, "error": "shard away", "transient": True}
    assert (await ledger.ask(subjects.LEDGER_SWEEP_FAILED, **body))["status"] == 200
    assert (await ledger.ask(subjects.LEDGER_SWEEP_FAILED, **body))["status"] == 409  # no longer reverting
    assert await db.fetchval("SELECT attempts FROM resources WHERE id = $1", row) == 1


async def test_a_cleanup_retry_asked_again_answers_200_until_a_sweep_has_run(ledger, db, unique):
    run = f"r{unique}"
    row = await _claimed(ledger, run)
    await ledger.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row, error="refused", transient=False)
    assert (await _finish(ledger, run))["cleanupStatus"] == "incomplete"
    first = await ledger.ask(subjects.LEDGER_SWEEP_RETRY, runId=run)
    again = await ledger.ask(subjects.LEDGER_SWEEP_RETRY, runId=run)
    assert first["status"] == again["status"] == 200 and again["run"] == first["run"]
    assert (await log_kinds(db, run)).count("cleanup.retried") == 1
    await _finish(ledger, run)  # a sweep ran since: a retry now is not the same request
    reply = await ledger.ask(subjects.LEDGER_SWEEP_RETRY, runId=run)
    assert reply["status"] == 409 and "pending" in reply["error"]
