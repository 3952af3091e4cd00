"""Bad input: every malformed request gets a clear 4xx naming what is wrong, and changes
nothing — not a row, not a log entry."""

from __future__ import annotations

import json

import pytest

from shared import subjects
from shared.contracts.ledger import REVERT_MAX_BYTES, rendered_size

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
    # A zero fraction is the integer (JSON Schema's integer, docs/contracts.md); a fraction is not.
    ("confirm-unknown-id-with-zero-fraction", subjects.LEDGER_RESOURCE_CONFIRM, {"resourceId": 424242.0}, 404,
     "no resource 424242"),
    ("confirm-id-with-a-fraction", subjects.LEDGER_RESOURCE_CONFIRM, {"resourceId": 4242.5}, 400, "resourceId"),
    ("confirm-id-as-boolean", subjects.LEDGER_RESOURCE_CONFIRM, {"resourceId": True}, 400, "resourceId"),
    ("reserve-deadline-with-a-fraction", subjects.LEDGER_RESOURCE_RESERVE, {**KEY, "leaseDeadline": 1.5}, 400,
     "leaseDeadline"),
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
    # Ranges: what PostgreSQL's bigint holds, sane seconds.
    ("confirm-id-beyond-bigint", subjects.LEDGER_RESOURCE_CONFIRM, {"resourceId": 2**63}, 400, "resourceId"),
    ("confirm-id-10e30", subjects.LEDGER_RESOURCE_CONFIRM, {"resourceId": 10**30}, 400, "resourceId"),
    ("fail-id-beyond-bigint", subjects.LEDGER_RESOURCE_FAIL, {"resourceId": 2**63, "error": "x"}, 400,
     "resourceId"),
    ("reverted-id-beyond-bigint", subjects.LEDGER_SWEEP_REVERTED, {"resourceId": 2**64}, 400, "resourceId"),
    ("outcomes-id-beyond-bigint", subjects.LEDGER_SWEEP_OUTCOMES,
     {"outcomes": [{"resourceId": 10**30, "verdict": "reverted"}]}, 400, "outcomes.0.resourceId"),
    ("reserve-deadline-2-70", subjects.LEDGER_RESOURCE_RESERVE, {**KEY, "leaseDeadline": 2**70}, 400,
     "leaseDeadline"),
    ("record-deadline-beyond-bigint", subjects.LEDGER_RESOURCE_RECORD, {**KEY, "leaseDeadline": 2**63}, 400,
     "leaseDeadline"),
    ("claim-timeout-1e308", subjects.LEDGER_SWEEP_CLAIM, {"runId": RUN, "claimTimeoutS": 1e308}, 400,
     "claimTimeoutS"),
    ("claim-timeout-2-70", subjects.LEDGER_SWEEP_CLAIM, {"runId": RUN, "claimTimeoutS": 2**70}, 400,
     "claimTimeoutS"),
    ("claim-timeout-a-year", subjects.LEDGER_SWEEP_CLAIM, {"runId": RUN, "claimTimeoutS": 365 * 86400}, 400,
     "claimTimeoutS"),
    ("console-after-beyond-bigint", subjects.LEDGER_CONSOLE, {"runId": RUN, "after": 2**63}, 400, "after"),
    ("console-limit-zero", subjects.LEDGER_CONSOLE, {"runId": RUN, "limit": 0}, 400, "limit"),
    ("live-after-negative", subjects.LEDGER_LIVE, {"module": "world", "after": -1}, 400, "after"),
    # Free-form fields: capped, and only what PostgreSQL can store.
    ("record-revert-over-the-cap", subjects.LEDGER_RESOURCE_RECORD, {**KEY, "revert": {"blob": "x" * 600_000}},
     400, "revert"),
    ("record-revert-of-huge-numbers", subjects.LEDGER_RESOURCE_RECORD, {**KEY, "revert": {"n": [1e308] * 30}},
     400, "revert"),
    ("record-revert-too-deep", subjects.LEDGER_RESOURCE_RECORD, {**KEY, "revert": {"a": [[[[[[[[[[[[[[[[[[[[[[
        [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}, 400, "revert"),
    ("record-revert-with-nul", subjects.LEDGER_RESOURCE_RECORD, {**KEY, "revert": {"key": "a\u0000b"}}, 400,
     "revert"),
    ("record-ref-with-nul", subjects.LEDGER_RESOURCE_RECORD, {**KEY, "ref": "c\u00001"}, 400, "ref"),
    ("record-kind-with-lone-surrogate", subjects.LEDGER_RESOURCE_RECORD, {**KEY, "kind": "\ud800"}, 400, "kind"),
    ("record-key-with-nul", subjects.LEDGER_RESOURCE_RECORD, {**KEY, "idempotencyKey": "k\u0000"}, 400,
     "idempotencyKey"),
    ("create-event-with-nul", subjects.LEDGER_RUN_CREATE, {"shard": "uo1", "event": "a\u0000"}, 400, "event"),
    ("fail-error-with-nul", subjects.LEDGER_RESOURCE_FAIL, {"resourceId": 1, "error": "a\u0000"}, 400, "error"),
    ("outcomes-error-with-surrogate", subjects.LEDGER_SWEEP_OUTCOMES,
     {"outcomes": [{"resourceId": 1, "verdict": "failed", "error": "\udfff"}]}, 400, "outcomes.0.error"),
    ("reconcile-present-with-nul", subjects.ledger_reconcile("world"), {"runId": RUN, "present": ["c\u0000"]},
     400, "present.0"),
    ("finish-summary-over-the-cap", subjects.LEDGER_SWEEP_FINISH,
     {"runId": RUN, "summary": {"failures": ["x" * 70_000]}}, 400, "summary"),
    ("finish-summary-with-nul", subjects.LEDGER_SWEEP_FINISH, {"runId": RUN, "summary": {"a\u0000": 1}}, 400,
     "summary"),
]

RAW_CASES = [
    # (case id, subject, raw body, words the 400 must contain): bodies json.dumps cannot write.
    ("deeply-nested-record", subjects.LEDGER_RESOURCE_RECORD, b"[" * 100_000, "body"),
    ("deeply-nested-console", subjects.LEDGER_CONSOLE, b"[" * 100_000, "body"),
    ("deeply-nested-outcomes", subjects.LEDGER_SWEEP_OUTCOMES, b'{"outcomes": ' + b"[" * 100_000, "body"),
    ("5000-digit-id", subjects.LEDGER_RESOURCE_CONFIRM, b'{"resourceId": ' + b"7" * 5000 + b"}", "resourceId"),
    ("5000-digit-deadline", subjects.LEDGER_RESOURCE_RECORD,
     json.dumps(KEY).encode()[:-1] + b', "leaseDeadline": ' + b"9" * 5000 + b"}", "leaseDeadline"),
    ("5000-digit-number-in-revert", subjects.LEDGER_RESOURCE_RECORD,
     json.dumps(KEY).encode()[:-1] + b', "revert": {"n": -' + b"9" * 5000 + b"}}", "revert"),
    ("5000-digit-claim-timeout", subjects.LEDGER_SWEEP_CLAIM,
     b'{"runId": "known-run", "claimTimeoutS": ' + b"1" * 5000 + b"}", "claimTimeoutS"),
    ("claim-timeout-infinity", subjects.LEDGER_SWEEP_CLAIM, b'{"runId": "known-run", "claimTimeoutS": Infinity}',
     "claimTimeoutS"),
    ("claim-timeout-nan", subjects.LEDGER_SWEEP_CLAIM, b'{"runId": "known-run", "claimTimeoutS": NaN}',
     "claimTimeoutS"),
    ("revert-with-nan", subjects.LEDGER_RESOURCE_RECORD, json.dumps(KEY).encode()[:-1] + b', "revert": {"x": NaN}}',
     "revert"),
    ("summary-with-infinity", subjects.LEDGER_SWEEP_FINISH, b'{"runId": "known-run", "summary": {"x": -Infinity}}',
     "summary"),
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


@pytest.mark.parametrize(("subject", "payload", "named"), [case[1:] for case in RAW_CASES],
                         ids=[case[0] for case in RAW_CASES])
async def test_a_body_json_cannot_hold_or_python_cannot_read_is_a_400_and_changes_nothing(
        ledger, db, known_run, subject, payload, named):
    reply = await ledger.raw(subject, payload)
    assert reply["status"] == 400, reply
    assert named in reply["error"]
    assert await _snapshot(db) == known_run


@pytest.mark.parametrize("payload", [b"[" * 100_000, b'{"kind": "creature", "ref": ' + b"1" * 5000 + b"}",
                                     b'{"kind": "creature", "ref": "c0\\u0000"}',
                                     b'{"kind": "creature", "ref": "\\ud800"}'])
async def test_a_malformed_expiry_answers_nothing_expired_and_changes_nothing(ledger, db, known_run, payload):
    reply = await ledger.raw(subjects.ledger_expired("world"), payload)
    assert reply == {"status": 200, "expired": 0}
    assert await _snapshot(db) == known_run


async def test_the_health_subjects_read_no_body(ledger):
    for subject in (subjects.health("ledger"), subjects.PING):
        reply = await ledger.raw(subject, b"[" * 100_000)
        assert reply["status"] == 200 and reply["service"] == "ledger", reply


async def test_a_revert_is_capped_as_postgresql_renders_it(ledger, db, known_run):
    # {"k": "xxx…"} renders as 9 bytes plus the text: the cap exactly is taken, one byte more is not.
    at_cap = {"k": "x" * (REVERT_MAX_BYTES - 9)}
    reply = await ledger.record(RUN, "at-cap", revert=at_cap)
    assert reply["status"] == 200, reply
    stored = await db.fetchval("SELECT octet_length(revert::text) FROM resources WHERE ref = 'at-cap'")
    assert stored == REVERT_MAX_BYTES
    over = await ledger.record(RUN, "over-cap", revert={"k": "x" * (REVERT_MAX_BYTES - 8)})
    assert over["status"] == 400 and "revert" in over["error"] and "8192" in over["error"]
    # Two-byte characters count twice, escapes as PostgreSQL writes them, numbers as it prints them.
    assert (await ledger.record(RUN, "wide", revert={"k": "é" * (REVERT_MAX_BYTES // 2)}))["status"] == 400
    odd = {"z": [1.5e-7, 1e20, 100.0, -0.0, 12345678901234567890, True, None, "tab\there \u0001 \"q\" \\"],
           "a": {"": [], "n": {}}, "é": "ü€😀", "k" * 50: 1e300}
    reply = await ledger.record(RUN, "odd", revert=odd)
    assert reply["status"] == 200, reply
    stored = await db.fetchval("SELECT octet_length(revert::text) FROM resources WHERE ref = 'odd'")
    assert rendered_size(odd) == stored


async def test_the_ledger_keeps_serving_after_bad_input(ledger, known_run):
    await ledger.raw(subjects.LEDGER_RESOURCE_RECORD, b"\xff\xfe garbage")
    assert (await ledger.console(RUN))["status"] == 200
