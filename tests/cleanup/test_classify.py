"""What each answer to a give-back means for the row (docs/cleanup.md, "A sweep", step 3), as a table."""

from __future__ import annotations

import pytest

from services.cleanup import classify
from services.cleanup.classify import Verdict

R, D, F, T, A = Verdict.REVERTED, Verdict.DRIFTED, Verdict.FAILED, Verdict.TRANSIENT, Verdict.AWAY

SERIAL = "0x40000001"
"""The row's serial every despawn answer below is read for."""


def _despawned(**lists) -> dict:
    """The gateway's 200 reply carrying a ``world.despawn.ok`` with these lists."""
    return {"status": 200, "body": {"kind": "world.despawn.ok", "runId": "42", "removed": [], "gone": [],
                                    "refused": [], **lists}}


DESPAWN = [
    ("removed", _despawned(removed=[SERIAL]), R, ""),
    ("gone counts as given back (a player killed it)", _despawned(gone=[SERIAL]), R, ""),
    ("a replay is the original answer",
     {"status": 200, "body": {**_despawned(removed=[SERIAL])["body"], "replayed": True}}, R, ""),
    ("removed among others", _despawned(removed=["0x1", SERIAL], gone=["0x2"], refused=["0x3"]), R, ""),
    ("refused: never this run's", _despawned(refused=[SERIAL]), F, "never this run's"),
    ("the serial in no list is not a success", _despawned(removed=["0x1"]), F, f"does not name {SERIAL}"),
    ("an answer with no lists at all", {"status": 200, "body": {"kind": "world.despawn.ok", "runId": "42"}},
     F, f"does not name {SERIAL}"),
    ("both given back and refused", _despawned(removed=[SERIAL], refused=[SERIAL]), F, "both given back and refused"),
    ("a list that is not a list", _despawned(removed=SERIAL), F, "'removed' is not a list"),
    ("the old dialect's result", {"status": 200, "body": {"kind": "world.despawn", "result": "removed"}},
     F, 'kind "world.despawn"'),
    ("no kind", {"status": 200, "body": {"removed": [SERIAL]}}, F, "with no 'kind'"),
    # The gateway's own 503 and 504: the shard never got or never answered it (no attempt spent).
    ("no shard connected", {"status": 503, "error": "shard uo1 is not connected here any more; try again"},
     A, "not connected"),
    ("disconnected before answering",
     {"status": 503, "error": "shard uo1 disconnected (connection lost) before answering"}, A, "disconnected"),
    ("no answer in time", {"status": 504, "error": "shard uo1 did not answer world.despawn within 5.0 s"}, A, "504"),
    # The shard's own "not now": an attempt spent.
    ("bridge busy", {"status": 425, "body": {"kind": "bridge.busy"}}, T, "425"),
    ("rate limited", {"status": 429, "body": {"kind": "oneshot.error", "reason": "too soon"}}, T, "too soon"),
    ("protocol gate", {"status": 409, "error": "shard speaks protocol 6"}, F, "deployment fault"),
    ("event plane off", {"status": 403, "body": {"kind": "world.error", "action": "despawn", "reason":
                                                 "the event plane is disabled on this shard (Bridge.EventsEnabled)"}},
     F, "Bridge.EventsEnabled"),
    ("unknown thing", {"status": 404, "body": {"reason": "unknown run"}}, F, "unknown run"),
    ("a bad request", {"status": 400, "error": "body must be a JSON object"}, F, "body must be"),
    ("garbage text", "<<not json>>", F, "<<not json>>"),
    ("a JSON list", [1, 2], F, "not a JSON object"),
    ("no status", {"body": _despawned(removed=[SERIAL])["body"]}, F, "without an integer status"),
    ("a status that is not a number", {"status": "200", "body": _despawned(removed=[SERIAL])["body"]},
     F, "integer status"),
    ("200 without body", {"status": 200}, F, "without a body object"),
    ("200 with a body that is a string", {"status": 200, "body": "removed"}, F, "without a body object"),
]

RELEASE = [
    ("given back: the baseline restored",
     {"status": 200, "body": {"kind": "lease.ok", "key": "PlayerCaps.SkillCap", "value": "1200"}}, R, ""),
    ("given back, replayed",
     {"status": 200, "body": {"kind": "lease.ok", "key": "PlayerCaps.SkillCap", "value": "1200", "replayed": True}},
     R, ""),
    ("a targeted key given back",
     {"status": 200, "body": {"kind": "lease.ok", "key": "PlayerCaps.SkillCap", "value": "10", "target": "t1"}},
     R, ""),
    ("drifted names the current value (the seed's own example)",
     {"status": 200, "body": {"kind": "lease.drifted", "key": "PlayerCaps.SkillCap", "current": "1300"}},
     D, '"1300"'),
    ("an answer about another key is not this release",
     {"status": 200, "body": {"kind": "lease.ok", "key": "Loot.RareChance", "value": "1"}}, F, "another key"),
    ("no lease offered",
     {"status": 404, "body": {"kind": "lease.error", "reason": "no lease is offered for key 'Loot.MaxProps'"}},
     F, "no lease is offered for key 'Loot.MaxProps'"),
    ("busy", {"status": 425, "body": {"kind": "bridge.busy"}}, T, "425"),
    ("no shard connected", {"status": 503, "error": "shard uo1 is not connected here any more; try again"},
     A, "503"),
    ("no answer in time", {"status": 504, "error": "shard uo1 did not answer lease.release within 5.0 s"}, A, "504"),
    ("no kind", {"status": 200, "body": {"key": "PlayerCaps.SkillCap"}}, F, "has no 'kind'"),
    ("the old dialect's kind", {"status": 200, "body": {"kind": "lease.released"}}, F, 'unknown kind "lease.released"'),
    ("garbage", b"\xff\xfe".decode("utf-8", "replace"), F, "not a JSON object"),
]

MODULE = [
    ("removed", {"status": 200, "result": "removed"}, R, ""),
    ("gone", {"status": 200, "result": "gone"}, R, ""),
    ("drifted", {"status": 200, "result": "drifted", "reason": "zone redrawn by staff"}, D, "zone redrawn"),
    ("refused", {"status": 200, "result": "refused", "reason": "not ours"}, F, "not ours"),
    # A module's own 503, 504, 425 or 429 is its answer, not its absence: an attempt spent.
    ("module busy", {"status": 503, "error": "module restarting"}, T, "module restarting"),
    ("module slow", {"status": 504, "error": "the zone service did not answer"}, T, "504"),
    ("module rate limited", {"status": 429, "error": "too many reverts"}, T, "429"),
    ("module error", {"status": 500, "error": "internal error"}, F, "500"),
    ("no result", {"status": 200}, F, "has no 'result'"),
    ("garbage", None, F, "not a JSON object"),
]


@pytest.mark.parametrize("name, reply, verdict, says", DESPAWN, ids=[row[0] for row in DESPAWN])
def test_despawn_answers_are_classified_as_spec_says(name, reply, verdict, says):
    outcome = classify.despawn_answer(reply, SERIAL)
    assert outcome.verdict is verdict
    assert says in outcome.reason


@pytest.mark.parametrize("name, reply, verdict, says", RELEASE, ids=[row[0] for row in RELEASE])
def test_lease_release_answers_are_classified_as_spec_says(name, reply, verdict, says):
    outcome = classify.release_answer(reply, "PlayerCaps.SkillCap")
    assert outcome.verdict is verdict
    assert says in outcome.reason


@pytest.mark.parametrize("name, reply, verdict, says", MODULE, ids=[row[0] for row in MODULE])
def test_module_revert_answers_are_classified(name, reply, verdict, says):
    outcome = classify.module_answer("arena", reply)
    assert outcome.verdict is verdict
    assert says in outcome.reason


def test_a_failure_reason_says_what_to_do_not_only_what_happened():
    assert "start it" in classify.no_module("arena", "modules.arena.revert").reason
    assert "check who owns it" in classify.despawn_answer(_despawned(refused=[SERIAL]), SERIAL).reason


def test_nobody_answering_is_away_for_a_shard_and_a_module_alike():
    assert classify.no_gateway("uo1").verdict is A
    assert classify.no_answer("world.despawn", 2).verdict is A
    assert classify.no_answer("module 'arena' revert", 2).verdict is A
    assert classify.no_module("arena", "modules.arena.revert").verdict is A


def test_an_unexpected_answer_is_quoted_so_a_person_sees_what_the_shard_said():
    outcome = classify.despawn_answer(_despawned(removed=["0x9"], note="half a reply"), SERIAL)
    assert outcome.verdict is F and '"half a reply"' in outcome.reason and '"0x9"' in outcome.reason


def test_a_huge_garbage_answer_is_quoted_only_in_part():
    outcome = classify.despawn_answer("x" * 10_000, SERIAL)
    assert outcome.verdict is F
    assert len(outcome.reason) < 400
