"""Bad input: every malformed request gets a clear 4xx naming what is wrong, and changes
nothing — not a row, not a log entry."""

from __future__ import annotations

import json

import pytest

from shared import subjects

RUN = "known-run"
KEY = {"runId": RUN, "module": "world", "kind": "creature", "ref": "c1", "idempotencyKey": "k1"}

CASES = [
    # (case id, subject, payload, status, words the error must contain)
    ("create-missing-shard", subjects.LEDGER_RUN_CREATE, {"event": "x"}, 400, "shard"),
    ("create-shard-not-an-id", subjects.LEDGER_RUN_CREATE, {"shard": "UO 1!", "event": "x"}, 400, "shard"),
    ("create-run-id-with-a-dot", subjects.LEDGER_RUN_CREATE, {"runId": "a.b", "shard": "uo1", "event": "x"}, 400,
     "runId"),
    ("status-unknown", subjects.LEDGER_RUN_STATUS, {"runId": RUN, "status": "exploded"}, 400, "status"),
    ("status-not-text", subjects.LEDGER_RUN_STATUS, {"runId": RUN, "status": 3}, 400, "status"),
    ("status-unknown-run", subjects.LEDGER_RUN_STATUS, {"runId": "ghost", "status": "running"}, 404, "ghost"),
    ("reserve-missing-key", subjects.LEDGER_RESOURCE_RESERVE, {k: v for k, v in KEY.items() if k != "idempotencyKey"},
     400, "idempotencyKey"),
    ("reserve-kind-too-long", subjects.LEDGER_RESOURCE_RESERVE, {**KEY, "kind": "k" * 65}, 400, "kind"),
    ("reserve-ref-too-long", subjects.LEDGER_RESOURCE_RESERVE, {**KEY, "ref": "r" * 191}, 400, "ref"),
    ("reserve-ref-not-text", subjects.LEDGER_RESOURCE_RESERVE, {**KEY, "ref": 12}, 400, "ref"),
    ("reserve-revert-not-an-object", subjects.LEDGER_RESOURCE_RESERVE, {**KEY, "revert": [1]}, 400, "revert"),
    ("reserve-negative-deadline", subjects.LEDGER_RESOURCE_RESERVE, {**KEY, "leaseDeadline": -1}, 400,
     "leaseDeadline"),
    ("reserve-unknown-run", subjects.LEDGER_RESOURCE_RESERVE, {**KEY, "runId": "ghost"}, 404, "ghost"),
    ("record-module-not-a-name", subjects.LEDGER_RESOURCE_RECORD, {**KEY, "module": "a.b"}, 400, "module"),
    ("confirm-id-as-text", subjects.LEDGER_RESOURCE_CONFIRM, {"resourceId": "1"}, 400, "resourceId"),
    ("confirm-missing-id", subjects.LEDGER_RESOURCE_CONFIRM, {}, 400, "resourceId"),
    ("confirm-unknown-id", subjects.LEDGER_RESOURCE_CONFIRM, {"resourceId": 424242}, 404, "424242"),
    ("fail-missing-error", subjects.LEDGER_RESOURCE_FAIL, {"resourceId": 1}, 400, "error"),
    ("reconcile-present-not-a-list", subjects.ledger_reconcile("world"), {"runId": RUN, "present": "c1"}, 400,
     "present"),
    ("reconcile-unknown-run", subjects.ledger_reconcile("world"), {"runId": "ghost", "present": []}, 404, "ghost"),
    ("runs-unknown-status", subjects.LEDGER_RUNS, {"status": "exploded"}, 400, "status"),
    ("runs-unknown-cleanup-status", subjects.LEDGER_RUNS, {"cleanupStatus": "done"}, 400, "cleanupStatus"),
    ("runs-limit-zero", subjects.LEDGER_RUNS, {"limit": 0}, 400, "limit"),
    ("console-unknown-run", subjects.LEDGER_CONSOLE, {"runId": "ghost"}, 404, "ghost"),
    ("claim-unknown-run", subjects.LEDGER_SWEEP_CLAIM, {"runId": "ghost"}, 404, "ghost"),
    ("failed-transient-not-bool", subjects.LEDGER_SWEEP_FAILED, {"resourceId": 1, "error": "x", "transient": "yes"},
     400, "transient"),
    ("outcomes-empty", subjects.LEDGER_SWEEP_OUTCOMES, {"outcomes": []}, 400, "outcomes"),
    ("outcomes-unknown-verdict", subjects.LEDGER_SWEEP_OUTCOMES,
     {"outcomes": [{"resourceId": 1, "verdict": "exploded"}]}, 400, "verdict"),
    ("outcomes-failure-without-error", subjects.LEDGER_SWEEP_OUTCOMES,
     {"outcomes": [{"resourceId": 1, "verdict": "transient"}]}, 400, "error is required"),
    ("outcomes-one-row-twice", subjects.LEDGER_SWEEP_OUTCOMES,
     {"outcomes": [{"resourceId": 1, "verdict": "reverted"}, {"resourceId": 1, "verdict": "drifted"}]}, 400,
     "more than once"),
    ("outcomes-over-the-cap", subjects.LEDGER_SWEEP_OUTCOMES,
     {"outcomes": [{"resourceId": n, "verdict": "reverted"} for n in range(1, 1002)]}, 400, "outcomes"),
    ("finish-summary-not-an-object", subjects.LEDGER_SWEEP_FINISH, {"runId": RUN, "summary": 3}, 400, "summary"),
    ("retry-unknown-run", subjects.LEDGER_SWEEP_RETRY, {"runId": "ghost"}, 404, "ghost"),
]

NOT_AN_OBJECT = [b"[1, 2]", b'"a string"', b"42", b"null", b"not json"]


@pytest.fixture
async def known_run(ledger, db):
    """A running run with one confirmed row; the tables' contents as they were."""
    await ledger.run(RUN, "running")
    await ledger.record(RUN, "c0", key="k0")
    return await _snapshot(db)


async def _snapshot(db) -> list:
    return [await db.fetch(f"SELECT * FROM {table} ORDER BY 1") for table in ("runs", "resources", "run_log")]


@pytest.mark.parametrize(("subject", "payload", "status", "named"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
async def test_a_bad_request_gets_a_clear_error_and_changes_nothing(ledger, db, known_run, subject, payload,
                                                                    status, named):
    reply = await ledger.raw(subject, json.dumps(payload).encode())
    assert reply["status"] == status, reply
    assert named in reply["error"]
    assert await _snapshot(db) == known_run


@pytest.mark.parametrize("payload", NOT_AN_OBJECT)
@pytest.mark.parametrize("subject", [subjects.LEDGER_RESOURCE_RECORD, subjects.LEDGER_CONSOLE,
                                     subjects.ledger_reconcile("world")])
async def test_a_body_that_is_not_a_json_object_is_a_400_and_changes_nothing(ledger, db, known_run, subject, payload):
    reply = await ledger.raw(subject, payload)
    assert reply["status"] == 400 and "body" in reply["error"]
    assert await _snapshot(db) == known_run


async def test_the_ledger_keeps_serving_after_bad_input(ledger, known_run):
    await ledger.raw(subjects.LEDGER_RESOURCE_RECORD, b"\xff\xfe garbage")
    assert (await ledger.console(RUN))["status"] == 200
