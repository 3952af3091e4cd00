"""Conformance, the give-back: the sidecar seed's own answers read by cleanup as the website core
seed reads them (docs/cleanup.md, "A sweep"). A drifted lease is a distinct outcome, never a
failure; a despawned serial that was removed or already gone is given back; the busy answer and
the save rate limit are retries, never failures.

The live paths (the simulator through the real gateway, cleanup and reconcile processes) are
tests/cleanup/test_giveback_through_gateway.py and tests/cleanup/test_reconcile.py; this file
pins the seed's literal answers, which the simulator only paraphrases where the seed is silent."""

from __future__ import annotations

import pytest

from services.cleanup import classify
from services.cleanup.classify import Verdict
from services.gateway.commands.reply_mapping import status_for
from simulator.seed_wire import DRIFTED, SENTENCE_EXAMPLES


def through_gateway(verb: str, answer: dict) -> dict:
    """The gateway's reply to a command the shard answered with ``answer``."""
    return {"status": status_for(verb, answer), "body": answer}


def test_a_drifted_lease_is_drifted_not_failed():
    outcome = classify.release_answer(through_gateway("lease.release", DRIFTED.value), "PlayerCaps.SkillCap")
    assert outcome.verdict is Verdict.DRIFTED and '"1300"' in outcome.reason


def test_a_released_lease_is_given_back():
    answer = {"kind": "lease.ok", "key": "PlayerCaps.SkillCap", "value": "1200"}
    assert classify.release_answer(through_gateway("lease.release", answer), "PlayerCaps.SkillCap").verdict \
        is Verdict.REVERTED


@pytest.mark.parametrize(("where", "verdict"), [("removed", Verdict.REVERTED), ("gone", Verdict.REVERTED),
                                                ("refused", Verdict.FAILED)])
def test_each_of_the_three_despawn_answers(where, verdict):
    answer = {"kind": "world.despawn.ok", "runId": "42", "removed": [], "gone": [], "refused": []}
    answer[where] = ["0x40000001"]
    assert classify.despawn_answer(through_gateway("world.despawn", answer), "0x40000001").verdict is verdict


@pytest.mark.parametrize(("verb", "answer"), [
    ("world.despawn", {"kind": "bridge.busy"}),
    ("lease.release", {"kind": "bridge.busy"}),
    ("world.save", {"kind": "oneshot.error", "reason": SENTENCE_EXAMPLES["save too soon"].value}),
])
def test_busy_and_the_rate_limit_are_retried_later(verb, answer):
    reply = through_gateway(verb, answer)
    outcome = (classify.despawn_answer(reply, "0x1") if verb == "world.despawn"
               else classify.release_answer(reply, "PlayerCaps.SkillCap"))
    assert outcome.verdict is Verdict.TRANSIENT


@pytest.mark.parametrize("sentence", ["event plane disabled", "no such lease"])
def test_a_refusal_the_sweep_cannot_act_on_is_a_failure_that_quotes_the_shard(sentence):
    answer = {"kind": "lease.error", "reason": SENTENCE_EXAMPLES[sentence].value}
    outcome = classify.release_answer(through_gateway("lease.release", answer), "Loot.MaxProps")
    assert outcome.verdict is Verdict.FAILED and SENTENCE_EXAMPLES[sentence].value in outcome.reason
