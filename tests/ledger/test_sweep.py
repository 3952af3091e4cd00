"""What the cleanup service asks of the ledger: settle, candidates, claim, the outcomes of a
give-back, finish and retry."""

from __future__ import annotations

from shared import subjects
from tests.ledger.conftest import log_kinds


async def _finished_run(ledger, run: str, refs: list[str]) -> list[int]:
    await ledger.run(run, "running")
    ids = [(await ledger.record(run, ref))["resource"]["resourceId"] for ref in refs]
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    return ids


async def _claim(ledger, run: str, **extra) -> list[dict]:
    body = {"runId": run, "maxAttempts": 3, "limit": 10, "claimTimeoutS": 60, **extra}
    reply = await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, **body)
    assert reply["status"] == 200, reply
    return reply["resources"]


async def _finish(ledger, run: str, **summary) -> dict:
    reply = await ledger.ask(subjects.LEDGER_SWEEP_FINISH, runId=run, maxAttempts=3, summary=summary)
    assert reply["status"] == 200, reply
    return reply["run"]


async def test_settle_completes_finished_runs_that_hold_nothing_unresolved(ledger, db, unique):
    await ledger.run(f"empty{unique}", "completed")
    await _finished_run(ledger, f"busy{unique}", ["c1"])
    await ledger.run(f"going{unique}", "running")
    await ledger.run(f"stuck{unique}", "cancelled")
    await db.execute("UPDATE runs SET cleanup_status = 'incomplete' WHERE run_id = $1", f"stuck{unique}")
    assert (await ledger.ask(subjects.LEDGER_SWEEP_SETTLE))["settled"] == 1
    cleanup = {r["run_id"]: r["cleanup_status"] for r in await db.fetch("SELECT run_id, cleanup_status FROM runs")}
    assert cleanup == {f"empty{unique}": "complete", f"busy{unique}": "pending",
                       f"going{unique}": "pending", f"stuck{unique}": "incomplete"}


async def test_candidates_are_finished_runs_with_pending_cleanup_and_rows_left(ledger, unique):
    await _finished_run(ledger, f"busy{unique}", ["c1"])
    await ledger.run(f"going{unique}", "running")
    await ledger.record(f"going{unique}", "c2")
    await ledger.run(f"empty{unique}", "completed")
    reply = await ledger.ask(subjects.LEDGER_SWEEP_CANDIDATES, maxAttempts=3, limit=10)
    assert reply == {"status": 200, "runs": [f"busy{unique}"]}


async def test_a_claim_takes_revertable_rows_and_remembers_their_status(ledger, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    await ledger.record(run, "confirmed-one")
    await ledger.record(run, "pending-one", reserve=True)
    await ledger.record(run, "orphan-one")
    await ledger.ask(subjects.ledger_reconcile("world"), runId=run, present=["confirmed-one"])
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    claimed = await _claim(ledger, run)
    assert sorted(r["ref"] for r in claimed) == ["confirmed-one", "orphan-one", "pending-one"]
    assert {r["status"] for r in claimed} == {"reverting"}
    assert await _claim(ledger, run) == []


async def test_a_claim_of_a_running_run_is_a_conflict(ledger, unique):
    await ledger.run(f"r{unique}", "running")
    await ledger.record(f"r{unique}", "c1")
    reply = await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, runId=f"r{unique}", maxAttempts=3, limit=10)
    assert reply["status"] == 409 and "running" in reply["error"]


async def test_a_stale_claim_is_taken_again_after_its_timeout(ledger, db, unique):
    run = f"r{unique}"
    await _finished_run(ledger, run, ["c1"])
    assert len(await _claim(ledger, run)) == 1
    assert await _claim(ledger, run, claimTimeoutS=60) == []
    await db.execute("UPDATE resources SET claimed_at = now() - interval '2 minutes'")
    again = await _claim(ledger, run, claimTimeoutS=60)
    assert len(again) == 1 and again[0]["status"] == "reverting"


async def test_reverted_and_drifted_close_a_reverting_row(ledger, db, unique):
    run = f"r{unique}"
    first, second = await _finished_run(ledger, run, ["c1", "c2"])
    await _claim(ledger, run)
    assert (await ledger.ask(subjects.LEDGER_SWEEP_REVERTED, resourceId=first))["resource"]["status"] == "reverted"
    drifted = await ledger.ask(subjects.LEDGER_SWEEP_DRIFTED, resourceId=second, error="value changed by staff")
    assert drifted["resource"]["status"] == "drifted" and drifted["resource"]["lastError"] == "value changed by staff"
    assert {"cleanup.reverted", "cleanup.drifted"} <= set(await log_kinds(db, run))


async def test_an_outcome_for_a_row_that_is_not_reverting_is_a_conflict(ledger, unique):
    (row,) = await _finished_run(ledger, f"r{unique}", ["c1"])
    reply = await ledger.ask(subjects.LEDGER_SWEEP_REVERTED, resourceId=row)
    assert reply["status"] == 409 and "confirmed" in reply["error"]


async def test_a_transient_failure_returns_the_row_to_its_status_with_one_more_attempt(ledger, db, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    reply = await ledger.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row, error="504 from the shard", transient=True)
    assert reply["resource"]["status"] == "confirmed" and reply["resource"]["attempts"] == 1
    assert reply["resource"]["gaveUp"] is False and reply["resource"]["lastError"] == "504 from the shard"
    assert "cleanup.failed" in await log_kinds(db, run)


async def test_a_refusal_spends_the_rows_attempts(ledger, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    reply = await ledger.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row, error="never this run's", transient=False)
    assert reply["resource"]["gaveUp"] is True
    assert await _claim(ledger, run) == []


async def test_attempts_run_out_at_the_bound(ledger, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    for _ in range(3):
        assert len(await _claim(ledger, run)) == 1
        await ledger.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row, error="503", transient=True)
    assert await _claim(ledger, run) == []
    assert (await _finish(ledger, run))["cleanupStatus"] == "incomplete"


async def test_finish_completes_a_run_with_nothing_unresolved_and_logs_the_summary(ledger, db, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    await ledger.ask(subjects.LEDGER_SWEEP_REVERTED, resourceId=row)
    assert (await _finish(ledger, run, reverted=1))["cleanupStatus"] == "complete"
    detail = await db.fetchval("SELECT detail::text FROM run_log WHERE kind = 'cleanup.swept'")
    assert '"reverted": 1' in detail and '"unresolved": 0' in detail


async def test_finish_leaves_pending_a_run_with_rows_still_in_reach(ledger, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    await ledger.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row, error="429", transient=True)
    assert (await _finish(ledger, run))["cleanupStatus"] == "pending"


async def test_finish_marks_incomplete_a_run_whose_rows_left_want_a_person(ledger, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    await ledger.ask(subjects.LEDGER_SWEEP_DRIFTED, resourceId=row)
    assert (await _finish(ledger, run))["cleanupStatus"] == "incomplete"


async def test_a_retry_resets_attempts_and_puts_the_cleanup_back_to_pending(ledger, db, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    await ledger.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row, error="refused", transient=False)
    await _finish(ledger, run)
    reply = await ledger.ask(subjects.LEDGER_SWEEP_RETRY, runId=run)
    assert reply["status"] == 200 and reply["run"]["cleanupStatus"] == "pending"
    assert await db.fetchval("SELECT attempts FROM resources WHERE id = $1", row) == 0
    assert len(await _claim(ledger, run)) == 1


async def test_a_retry_of_a_run_that_is_not_incomplete_is_a_conflict(ledger, unique):
    await _finished_run(ledger, f"r{unique}", ["c1"])
    reply = await ledger.ask(subjects.LEDGER_SWEEP_RETRY, runId=f"r{unique}")
    assert reply["status"] == 409 and "pending" in reply["error"]
