"""A batch of give-back outcomes (``ledger.sweep.outcomes``): each row takes exactly the step
its one-row request would, in one commit; rows another sweeper recorded first are conflicts
and the rest of the batch still lands."""

from __future__ import annotations

import pytest

from shared import subjects
from tests.ledger.test_sweep import _claim, _finished_run

VERDICTS = [
    # (verdict, error, one-row subject and body, status after, attempts after, gave up)
    ("reverted", None, (subjects.LEDGER_SWEEP_REVERTED, {}), "reverted", 0, False),
    ("drifted", "value changed by staff", (subjects.LEDGER_SWEEP_DRIFTED, {"error": "value changed by staff"}),
     "drifted", 0, False),
    ("failed", "never this run's", (subjects.LEDGER_SWEEP_FAILED, {"error": "never this run's", "transient": False}),
     "confirmed", 1, True),
    ("transient", "504 from the shard", (subjects.LEDGER_SWEEP_FAILED, {"error": "504 from the shard",
                                                                        "transient": True}), "confirmed", 1, False),
]

COMPARED = "status, attempts, gave_up, last_error, previous_status, claimed_at IS NULL AS unclaimed"
"""The columns a batch and a one-row outcome must leave the same."""


async def _outcomes(ledger, *outcomes: dict) -> dict:
    reply = await ledger.ask(subjects.LEDGER_SWEEP_OUTCOMES, outcomes=list(outcomes))
    assert reply["status"] == 200, reply
    return reply


@pytest.mark.parametrize(("verdict", "error", "one_row", "status", "attempts", "gave_up"), VERDICTS,
                         ids=[v[0] for v in VERDICTS])
async def test_a_batched_outcome_is_the_same_step_as_its_one_row_request(ledger, db, unique, verdict, error, one_row,
                                                                         status, attempts, gave_up):
    (batched,) = await _finished_run(ledger, f"b{unique}", ["b1"])
    (single,) = await _finished_run(ledger, f"s{unique}", ["s1"])
    await _claim(ledger, f"b{unique}")
    await _claim(ledger, f"s{unique}")
    reply = await _outcomes(ledger, {"resourceId": batched, "verdict": verdict, **({"error": error} if error else {})})
    assert reply["recorded"] == [batched] and reply["conflicts"] == [] and reply["missing"] == []
    subject, body = one_row
    assert (await ledger.ask(subject, resourceId=single, **body))["status"] == 200
    rows = {r["row_id"]: {k: v for k, v in r.items() if k != "row_id"}
            for r in await db.fetch(f"SELECT id AS row_id, {COMPARED} FROM resources")}
    assert rows[batched] == rows[single]
    assert (rows[batched]["status"], rows[batched]["attempts"], rows[batched]["gave_up"]) == (status, attempts, gave_up)
    logs = await db.fetch("SELECT resource_id, kind, detail FROM run_log WHERE resource_id = ANY($1) "
                          "AND kind LIKE 'cleanup.%' AND kind <> 'cleanup.claimed' ORDER BY resource_id",
                          [batched, single])
    assert [(log["kind"], log["detail"]) for log in logs if log["resource_id"] == batched] == \
           [(log["kind"], log["detail"]) for log in logs if log["resource_id"] == single]


async def test_one_batch_records_every_verdict_in_one_request(ledger, db, unique):
    run = f"r{unique}"
    ids = await _finished_run(ledger, run, ["c1", "c2", "c3", "c4"])
    await _claim(ledger, run)
    reply = await _outcomes(ledger, *({"resourceId": row, "verdict": verdict, **({"error": error} if error else {})}
                                      for row, (verdict, error, *_rest) in zip(ids, VERDICTS, strict=True)))
    assert reply["recorded"] == ids
    statuses = [r["status"] for r in await db.fetch("SELECT status FROM resources WHERE run_id = $1 ORDER BY id", run)]
    assert statuses == ["reverted", "drifted", "confirmed", "confirmed"]


async def test_rows_recorded_elsewhere_are_conflicts_and_the_rest_of_the_batch_lands(ledger, db, unique):
    run = f"r{unique}"
    taken, mine = await _finished_run(ledger, run, ["c1", "c2"])
    await _claim(ledger, run)
    assert (await ledger.ask(subjects.LEDGER_SWEEP_REVERTED, resourceId=taken))["status"] == 200
    reply = await _outcomes(ledger, {"resourceId": taken, "verdict": "reverted"},
                            {"resourceId": mine, "verdict": "reverted"},
                            {"resourceId": 987654321, "verdict": "reverted"})
    assert reply["recorded"] == [mine]
    assert reply["conflicts"] == [{"resourceId": taken, "status": "reverted"}]
    assert reply["missing"] == [987654321]
    assert await db.fetchval("SELECT count(*) FROM run_log WHERE resource_id = $1 AND kind = 'cleanup.reverted'",
                             taken) == 1


async def test_a_claim_says_which_shard_the_run_acts_on(ledger, unique):
    await _finished_run(ledger, f"r{unique}", ["c1"])
    reply = await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, runId=f"r{unique}", maxAttempts=3, limit=10)
    assert reply["status"] == 200 and reply["shard"] == "uo1" and len(reply["resources"]) == 1
