"""A give-back that did not happen, for a row whose target a newer row took meanwhile.

A row being given back (``reverting``) holds no target (docs/ledger.md: only ``pending`` and
``confirmed`` do), so a new run may reserve the same target while the give-back is in flight.
When that give-back then fails (transient, refused, or met nobody), the row cannot go back to
``confirmed``: two live rows would hold one target. It becomes ``orphaned`` instead — still
unresolved, still given back by the sweep, attempts counted as for any failed give-back — and
the newer row keeps the target. Found by the model test (tests/model): the ledger answered 500
(``UniqueViolationError``) and recorded nothing, so the sweep could never record that outcome."""

from __future__ import annotations

import pytest

from shared import subjects
from tests.ledger.test_sweep import _claim, _finished_run

OUTCOMES = [
    # (how the outcome is sent, verdict or transient flag, attempts after, gave up, away after)
    ("outcomes", "transient", 1, False, 0),
    ("outcomes", "failed", 1, True, 0),
    ("outcomes", "away", 0, False, 1),
    ("sweep.failed", True, 1, False, 0),
    ("sweep.failed", False, 1, True, 0),
]


async def _fail(ledger, resource_id: int, how: str, verdict) -> dict:
    if how == "outcomes":
        outcome = {"resourceId": resource_id, "verdict": verdict, "error": "the shard said no"}
        return await ledger.ask(subjects.LEDGER_SWEEP_OUTCOMES, outcomes=[outcome])
    return await ledger.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=resource_id, error="the shard said no",
                            transient=verdict)


@pytest.mark.parametrize(("how", "verdict", "attempts", "gave_up", "away"), OUTCOMES,
                         ids=[f"{o[0]}-{o[1]}" for o in OUTCOMES])
async def test_a_failed_give_back_whose_target_was_taken_meanwhile_is_orphaned(ledger, db, unique, how, verdict,
                                                                              attempts, gave_up, away):
    (old,) = await _finished_run(ledger, f"old{unique}", ["r0"])
    assert [r["resourceId"] for r in await _claim(ledger, f"old{unique}")] == [old]
    await ledger.run(f"new{unique}", "running")
    taken = await ledger.record(f"new{unique}", "r0", reserve=True)
    assert taken["status"] == 200 and taken["resource"]["status"] == "pending", taken

    reply = await _fail(ledger, old, how, verdict)

    assert reply["status"] == 200, reply
    row = await db.fetchrow("SELECT status, attempts, gave_up, away FROM resources WHERE id = $1", old)
    assert dict(row) == {"status": "orphaned", "attempts": attempts, "gave_up": gave_up, "away": away}
    live = await db.fetch("SELECT id FROM resources WHERE module = 'world' AND kind = 'creature' AND ref = 'r0' "
                          "AND run_id = ANY($1) AND status IN ('pending', 'confirmed')",
                          [f"old{unique}", f"new{unique}"])
    assert [r["id"] for r in live] == [taken["resource"]["resourceId"]]


async def test_with_its_target_free_a_failed_give_back_still_goes_back_to_confirmed(ledger, db, unique):
    (old,) = await _finished_run(ledger, f"old{unique}", ["r0"])
    await _claim(ledger, f"old{unique}")
    reply = await _fail(ledger, old, "outcomes", "transient")
    assert reply["status"] == 200, reply
    assert await db.fetchval("SELECT status FROM resources WHERE id = $1", old) == "confirmed"


async def test_two_rows_of_one_target_failing_in_one_batch_leave_one_live(ledger, db, unique):
    """Both were live in turn (the second recorded while the first was reverting), both fail in
    one ``ledger.sweep.outcomes``: the statement alone cannot see either go back, so the ledger
    records them one by one, and the second finds the first holding the target."""
    (first,) = await _finished_run(ledger, f"run{unique}", ["r0"])
    await _claim(ledger, f"run{unique}")
    second = await ledger.record(f"run{unique}", "r0", key=f"again{unique}")
    assert second["status"] == 200 and second["resource"]["status"] == "confirmed", second
    claimed = [r["resourceId"] for r in await _claim(ledger, f"run{unique}")]
    assert claimed == [second["resource"]["resourceId"]]

    reply = await ledger.ask(subjects.LEDGER_SWEEP_OUTCOMES, outcomes=[
        {"resourceId": rid, "verdict": "transient", "error": "the shard said no"} for rid in (first, claimed[0])])

    assert reply["status"] == 200 and sorted(reply["recorded"]) == sorted([first, claimed[0]]), reply
    got = await db.fetch("SELECT id, status, attempts FROM resources WHERE id = ANY($1) ORDER BY id",
                         [first, claimed[0]])
    assert [(r["status"], r["attempts"]) for r in got] == [("confirmed", 1), ("orphaned", 1)]
