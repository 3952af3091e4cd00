"""What each answer to a give-back means for the row: SPEC section 4's step 3, as a table."""

from __future__ import annotations

import pytest

from services.cleanup import classify
from services.cleanup.classify import Verdict

R, D, F, T = Verdict.REVERTED, Verdict.DRIFTED, Verdict.FAILED, Verdict.TRANSIENT

DESPAWN = [
    ("removed", {"status": 200, "body": {"kind": "world.despawn", "result": "removed"}}, R, ""),
    ("gone counts as given back", {"status": 200, "body": {"kind": "world.despawn", "result": "gone"}}, R, ""),
    ("a replay is the original answer",
     {"status": 200, "body": {"kind": "world.despawn", "result": "removed", "replayed": True}}, R, ""),
    ("refused keeps the reason", {"status": 200, "body": {"result": "refused", "reason": "owned by run x"}},
     F, "owned by run x"),
    ("no shard connected", {"status": 503, "error": "shard uo1 is not connected"}, T, "not connected"),
    ("no answer in time", {"status": 504, "error": "the shard did not answer"}, T, "504"),
    ("bridge busy", {"status": 425, "body": {"kind": "bridge.busy"}}, T, "425"),
    ("save rate limit", {"status": 429, "body": {"kind": "world.error", "reason": "too soon"}}, T, "too soon"),
    ("protocol gate", {"status": 409, "error": "shard speaks protocol 6"}, F, "deployment fault"),
    ("operator refusal", {"status": 403, "body": {"reason": "event plane disabled"}}, F, "event plane disabled"),
    ("unknown thing", {"status": 404, "body": {"reason": "unknown run"}}, F, "unknown run"),
    ("a bad request", {"status": 400, "error": "body must be a JSON object"}, F, "body must be"),
    ("garbage text", "<<not json>>", F, "<<not json>>"),
    ("a JSON list", [1, 2], F, "not a JSON object"),
    ("no status", {"body": {"result": "removed"}}, F, "without an integer status"),
    ("a status that is not a number", {"status": "200", "body": {"result": "removed"}}, F, "integer status"),
    ("200 without body", {"status": 200}, F, "without a body object"),
    ("200 with a body that is a string", {"status": 200, "body": "removed"}, F, "without a body object"),
    ("result missing", {"status": 200, "body": {"kind": "world.despawn"}}, F, "has no 'result'"),
    ("result unknown", {"status": 200, "body": {"result": "vanished"}}, F, "unknown result \"vanished\""),
]

RELEASE = [
    ("released", {"status": 200, "body": {"kind": "lease.released", "key": "spawn.rate"}}, R, ""),
    ("released, replayed", {"status": 200, "body": {"kind": "lease.released", "replayed": True}}, R, ""),
    ("drifted names the current value", {"status": 200, "body": {"kind": "lease.drifted", "current": "5"}},
     D, '"5"'),
    ("no lease offered", {"status": 404, "body": {"kind": "lease.error", "reason": "no lease offered"}},
     F, "no lease offered"),
    ("busy", {"status": 425, "body": {"kind": "bridge.busy"}}, T, "425"),
    ("no kind", {"status": 200, "body": {"key": "spawn.rate"}}, F, "has no 'kind'"),
    ("unknown kind", {"status": 200, "body": {"kind": "lease.applied"}}, F, "unknown kind"),
    ("garbage", b"\xff\xfe".decode("utf-8", "replace"), F, "not a JSON object"),
]

MODULE = [
    ("removed", {"status": 200, "result": "removed"}, R, ""),
    ("gone", {"status": 200, "result": "gone"}, R, ""),
    ("drifted", {"status": 200, "result": "drifted", "reason": "zone redrawn by staff"}, D, "zone redrawn"),
    ("refused", {"status": 200, "result": "refused", "reason": "not ours"}, F, "not ours"),
    ("module busy", {"status": 503, "error": "module restarting"}, T, "module restarting"),
    ("module error", {"status": 500, "error": "internal error"}, F, "500"),
    ("no result", {"status": 200}, F, "has no 'result'"),
    ("garbage", None, F, "not a JSON object"),
]


@pytest.mark.parametrize("name, reply, verdict, says", DESPAWN, ids=[row[0] for row in DESPAWN])
def test_despawn_answers_are_classified_as_spec_says(name, reply, verdict, says):
    outcome = classify.despawn_answer(reply)
    assert outcome.verdict is verdict
    assert says in outcome.reason


@pytest.mark.parametrize("name, reply, verdict, says", RELEASE, ids=[row[0] for row in RELEASE])
def test_lease_release_answers_are_classified_as_spec_says(name, reply, verdict, says):
    outcome = classify.release_answer(reply)
    assert outcome.verdict is verdict
    assert says in outcome.reason


@pytest.mark.parametrize("name, reply, verdict, says", MODULE, ids=[row[0] for row in MODULE])
def test_module_revert_answers_are_classified(name, reply, verdict, says):
    outcome = classify.module_answer("arena", reply)
    assert outcome.verdict is verdict
    assert says in outcome.reason


def test_a_failure_reason_says_what_to_do_not_only_what_happened():
    assert "start it" in classify.no_module("arena", "modules.arena.revert").reason
    assert "check who owns it" in classify.despawn_answer({"status": 200, "body": {"result": "refused"}}).reason


def test_transport_failures_are_transient_except_a_module_nobody_runs():
    assert classify.no_gateway("uo1").verdict is T
    assert classify.no_answer("world.despawn", 2).verdict is T
    assert classify.no_module("arena", "modules.arena.revert").verdict is F


def test_a_huge_garbage_answer_is_quoted_only_in_part():
    outcome = classify.despawn_answer("x" * 10_000)
    assert outcome.verdict is F
    assert len(outcome.reason) < 400
