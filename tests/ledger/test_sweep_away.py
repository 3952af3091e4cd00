"""A give-back that met nobody (verdict ``away``: no gateway held the shard, no module
subscribed, no answer in time) spends no attempt: the row goes back to its status, counts one
more miss in a row (``away``) and is not claimed again before ``retry_at`` = now +
min(cap, base × 2^away). An answered outcome resets both. A run whose rows back off stays
``pending``, is no candidate until a row is due, and ``ledger.sweep.waiting`` lists it."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest

from shared import subjects
from tests.ledger.conftest import next_message
from tests.ledger.test_sweep import _claim, _finished_run


async def _outcome(ledger, row: int, verdict: str, error: str | None = None, **backoff) -> dict:
    outcome = {"resourceId": row, "verdict": verdict, **({"error": error} if error else {})}
    reply = await ledger.ask(subjects.LEDGER_SWEEP_OUTCOMES, outcomes=[outcome], **backoff)
    assert reply["status"] == 200, reply
    assert reply["recorded"] == [row], reply
    return reply


async def _row(db, row: int):
    return await db.fetchrow("SELECT status, attempts, gave_up, away, retry_at, updated_at, last_error, "
                             "previous_status FROM resources WHERE id = $1", row)


async def _due_now(db, row: int) -> None:
    """Let a backing-off row be claimed again without waiting (its ``away`` stays)."""
    await db.execute("UPDATE resources SET retry_at = now() - interval '1 second' WHERE id = $1", row)


VERDICTS = [
    # (verdict, error, status after, attempts after, gave up, away after, waits seconds (None: no retry_at))
    ("reverted", None, "reverted", 0, False, 0, None),
    ("drifted", "value changed by staff", "drifted", 0, False, 0, None),
    ("failed", "never this run's", "confirmed", 1, True, 0, None),
    ("transient", "425 bridge.busy", "confirmed", 1, False, 0, None),
    ("away", "no gateway holds shard 'uo1' (503)", "confirmed", 0, False, 3, 4.0),  # base 1 s × 2^2
]


@pytest.mark.parametrize(("verdict", "error", "status", "attempts", "gave_up", "away", "waits"), VERDICTS,
                         ids=[v[0] for v in VERDICTS])
async def test_each_verdict_sets_status_attempts_and_back_off(ledger, db, unique, verdict, error, status, attempts,
                                                              gave_up, away, waits):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    # Two misses in a row already, now due: an answer resets them, a third miss waits 2^2 × base.
    await db.execute("UPDATE resources SET away = 2, retry_at = now() - interval '1 second' WHERE id = $1", row)
    assert [r["resourceId"] for r in await _claim(ledger, run)] == [row]
    await _outcome(ledger, row, verdict, error, awayBackoffS=1.0, awayBackoffMaxS=60.0)

    after = await _row(db, row)
    assert (after["status"], after["attempts"], after["gave_up"], after["away"]) == (status, attempts, gave_up, away)
    assert after["previous_status"] is None or verdict in ("reverted", "drifted")
    if waits is None:
        assert after["retry_at"] is None
    else:
        # retry_at and updated_at are both the statement's now(): the wait is exact.
        assert after["retry_at"] - after["updated_at"] == timedelta(seconds=waits)
        assert after["last_error"] == error


async def test_an_away_outcome_logs_why_and_until_when_and_is_an_update_event(ledger, db, nc, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    events = await nc.subscribe(subjects.ledger_run_events(run))
    await nc.flush()
    await _outcome(ledger, row, "away", "nothing answers modules.arena.revert", awayBackoffS=2.5)

    (log,) = await db.fetch("SELECT kind, detail FROM run_log WHERE resource_id = $1 AND kind = 'cleanup.away'", row)
    detail = log["detail"] if isinstance(log["detail"], dict) else json.loads(log["detail"])
    assert detail["error"] == "nothing answers modules.arena.revert"
    assert detail["away"] == 1 and detail["attempts"] == 0 and detail["retryAt"]

    async with asyncio.timeout(10):
        while True:
            event = json.loads((await next_message(events, timeout=5)).data)
            if event["type"] == "cleanup.away":
                break
    assert event["resource"]["resourceId"] == row and event["resource"]["status"] == "confirmed"
    assert event["resource"]["attempts"] == 0


async def test_a_claim_skips_a_backing_off_row_until_its_retry_at_passes(ledger, db, unique):
    run = f"r{unique}"
    backing_off, other = await _finished_run(ledger, run, ["c1", "c2"])
    await _claim(ledger, run)
    await _outcome(ledger, backing_off, "away", "did not answer within 1 s (504)", awayBackoffS=0.3)
    await _outcome(ledger, other, "transient", "425 bridge.busy")

    # The answered row is claimable at once; the one that met nobody is not, yet.
    assert [r["resourceId"] for r in await _claim(ledger, run)] == [other]
    await _outcome(ledger, other, "reverted")
    assert await _claim(ledger, run) == []
    candidates = await ledger.ask(subjects.LEDGER_SWEEP_CANDIDATES, maxAttempts=3, limit=10)
    assert run not in candidates["runs"], "a run whose rows all back off is not swept for nothing"

    await asyncio.sleep(0.5)
    candidates = await ledger.ask(subjects.LEDGER_SWEEP_CANDIDATES, maxAttempts=3, limit=10)
    assert run in candidates["runs"]
    assert [r["resourceId"] for r in await _claim(ledger, run)] == [backing_off]


async def test_finish_leaves_a_run_pending_while_its_rows_back_off_even_at_the_attempts_bound(ledger, db, unique):
    away_run, transient_run = f"a{unique}", f"t{unique}"
    (away_row,) = await _finished_run(ledger, away_run, ["c1"])
    (transient_row,) = await _finished_run(ledger, transient_run, ["c2"])
    for run, row, verdict in ((away_run, away_row, "away"), (transient_run, transient_row, "transient")):
        claimed = await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run, maxAttempts=1, limit=10)
        assert [r["resourceId"] for r in claimed["resources"]] == [row]
        await _outcome(ledger, row, verdict, "503", awayBackoffS=60.0, awayBackoffMaxS=60.0)

    def finish(run: str):
        return ledger.ask(subjects.LEDGER_SWEEP_FINISH, runId=run, maxAttempts=1, summary={})

    # One attempt allowed: a transient failure spent it (incomplete); a miss spent nothing.
    assert (await finish(transient_run))["run"]["cleanupStatus"] == "incomplete"
    finished = await finish(away_run)
    assert finished["run"]["cleanupStatus"] == "pending"
    swept = await db.fetchval("SELECT detail->>'actionable' FROM run_log "
                              "WHERE run_id = $1 AND kind = 'cleanup.swept'", away_run)
    assert swept == "1"
    assert (await _row(db, away_row))["attempts"] == 0


async def test_the_back_off_doubles_per_miss_in_a_row_and_is_capped(ledger, db, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    waits = []
    for _ in range(6):
        assert [r["resourceId"] for r in await _claim(ledger, run)] == [row]
        await _outcome(ledger, row, "away", "no gateway holds shard 'uo1' (503)", awayBackoffS=1.5,
                       awayBackoffMaxS=10.0)
        after = await _row(db, row)
        waits.append((after["retry_at"] - after["updated_at"]).total_seconds())
        await _due_now(db, row)
    assert waits == [1.5, 3.0, 6.0, 10.0, 10.0, 10.0]
    after = await _row(db, row)
    assert (after["away"], after["attempts"], after["status"]) == (6, 0, "confirmed")

    # A very long outage: the exponent stops growing, the cap still holds (no overflow).
    await db.execute("UPDATE resources SET away = 5000 WHERE id = $1", row)
    await _claim(ledger, run)
    await _outcome(ledger, row, "away", "504", awayBackoffS=1.5, awayBackoffMaxS=10.0)
    after = await _row(db, row)
    assert (after["away"], (after["retry_at"] - after["updated_at"]).total_seconds()) == (5001, 10.0)


async def test_without_back_off_fields_the_defaults_apply(ledger, db, unique):
    run = f"r{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    await _outcome(ledger, row, "away", "504")
    after = await _row(db, row)
    assert (after["retry_at"] - after["updated_at"]).total_seconds() == 2.0


@pytest.mark.parametrize(("body", "says"), [
    ({"awayBackoffS": 0}, "awayBackoffS"),
    ({"awayBackoffS": -1.0}, "awayBackoffS"),
    ({"awayBackoffMaxS": 86_401}, "awayBackoffMaxS"),
    ({"awayBackoffS": "2"}, "awayBackoffS"),
    ({"awayBackoffS": 10.0, "awayBackoffMaxS": 5.0}, "must not be less than"),
], ids=["zero", "negative", "cap-over-a-day", "text", "cap-below-base"])
async def test_a_back_off_out_of_range_is_refused(ledger, body, says):
    reply = await ledger.ask(subjects.LEDGER_SWEEP_OUTCOMES,
                             outcomes=[{"resourceId": 1, "verdict": "away", "error": "504"}], **body)
    assert reply["status"] == 400 and says in reply["error"], reply


async def test_an_away_outcome_must_say_why(ledger):
    reply = await ledger.ask(subjects.LEDGER_SWEEP_OUTCOMES, outcomes=[{"resourceId": 1, "verdict": "away"}])
    assert reply["status"] == 400 and "error is required" in reply["error"], reply


async def test_waiting_lists_runs_whose_rows_met_nobody_until_one_is_answered(ledger, db, unique):
    waiting, fine = f"w{unique}", f"f{unique}"
    rows = await _finished_run(ledger, waiting, ["c1", "c2", "c3"])
    (fine_row,) = await _finished_run(ledger, fine, ["c4"])
    await _claim(ledger, waiting)
    await _claim(ledger, fine)
    for row in rows[:2]:
        await _outcome(ledger, row, "away", "no gateway holds shard 'uo1' (503)", awayBackoffS=30.0)
    await _outcome(ledger, rows[2], "transient", "425 bridge.busy")
    await _outcome(ledger, fine_row, "transient", "425 bridge.busy")

    reply = await ledger.ask(subjects.LEDGER_SWEEP_WAITING)
    assert reply["status"] == 200 and reply["more"] is False, reply
    (listed,) = reply["runs"]
    assert {k: listed[k] for k in ("runId", "shard", "rows", "away")} == {"runId": waiting, "shard": "uo1",
                                                                          "rows": 2, "away": 1}
    retry_at = await db.fetchval("SELECT min(retry_at) FROM resources WHERE run_id = $1", waiting)
    assert listed["retryAt"].startswith(retry_at.strftime("%Y-%m-%dT%H:%M:%S"))

    # Due again (the next sweep's to try), it still waits for its shard until a row is answered.
    for row in rows[:2]:
        await _due_now(db, row)
    assert [r["runId"] for r in (await ledger.ask(subjects.LEDGER_SWEEP_WAITING))["runs"]] == [waiting]
    claimed = await _claim(ledger, waiting)
    assert sorted(r["resourceId"] for r in claimed) == sorted(rows)
    assert [r["runId"] for r in (await ledger.ask(subjects.LEDGER_SWEEP_WAITING))["runs"]] == [waiting]
    for row in rows:
        await _outcome(ledger, row, "reverted")
    assert (await ledger.ask(subjects.LEDGER_SWEEP_WAITING))["runs"] == []


async def test_waiting_is_bounded_by_its_limit_and_says_when_more_wait(ledger, unique):
    for n in range(3):
        run = f"r{n}{unique}"
        (row,) = await _finished_run(ledger, run, [f"c{n}"])
        await _claim(ledger, run)
        await _outcome(ledger, row, "away", "504", awayBackoffS=float(10 + n))
    reply = await ledger.ask(subjects.LEDGER_SWEEP_WAITING, limit=2)
    assert reply["more"] is True
    assert [r["runId"] for r in reply["runs"]] == [f"r0{unique}", f"r1{unique}"]  # due first, first
    assert (await ledger.ask(subjects.LEDGER_SWEEP_WAITING, limit=0))["status"] == 400


async def test_waiting_says_since_when_a_run_waits_until_a_row_is_answered(ledger, db, unique):
    run = f"s{unique}"
    (row,) = await _finished_run(ledger, run, ["c1"])
    await _claim(ledger, run)
    await _outcome(ledger, row, "away", "504", awayBackoffS=30.0)
    first = await db.fetchval("SELECT away_since FROM resources WHERE id = $1", row)
    (listed,) = (await ledger.ask(subjects.LEDGER_SWEEP_WAITING, runId=run))["runs"]
    assert listed["waitingSince"].startswith(first.strftime("%Y-%m-%dT%H:%M:%S"))
    # A second miss in a row keeps the first one's time: the run has waited since then.
    await _due_now(db, row)
    await _claim(ledger, run)
    await _outcome(ledger, row, "away", "504", awayBackoffS=30.0)
    assert (await _row(db, row))["away"] == 2
    assert await db.fetchval("SELECT away_since FROM resources WHERE id = $1", row) == first
    # Only runs waiting longer than longerThanS: not yet an hour, then (back-dated) more than one.
    assert (await ledger.ask(subjects.LEDGER_SWEEP_WAITING, runId=run, longerThanS=3600))["runs"] == []
    await db.execute("UPDATE resources SET away_since = now() - interval '2 hours' WHERE id = $1", row)
    assert [r["runId"] for r in (await ledger.ask(subjects.LEDGER_SWEEP_WAITING, longerThanS=3600))["runs"]] == [run]
    # An answer ends the wait.
    await _due_now(db, row)
    await _claim(ledger, run)
    await _outcome(ledger, row, "transient", "425 bridge.busy")
    assert await db.fetchval("SELECT away_since FROM resources WHERE id = $1", row) is None
    assert (await ledger.ask(subjects.LEDGER_SWEEP_WAITING, runId=run))["runs"] == []


async def test_waiting_refuses_a_bad_run_id_or_a_negative_longer_than(ledger):
    assert (await ledger.ask(subjects.LEDGER_SWEEP_WAITING, runId="a b"))["status"] == 400
    assert (await ledger.ask(subjects.LEDGER_SWEEP_WAITING, longerThanS=-1))["status"] == 400


async def test_a_retry_of_a_waiting_run_makes_its_rows_due_at_once_and_keeps_them_waiting(ledger, db, unique):
    run, other = f"t{unique}", f"u{unique}"
    rows = await _finished_run(ledger, run, ["c1", "c2"])
    (other_row,) = await _finished_run(ledger, other, ["c3"])
    for name in (run, other):
        await _claim(ledger, name)
    for row in [*rows, other_row]:
        await _outcome(ledger, row, "away", "no gateway holds shard 'uo1' (503)",
                       awayBackoffS=600.0, awayBackoffMaxS=600.0)
    assert await _claim(ledger, run) == []  # backing off
    before = await db.fetchval("SELECT updated_at FROM runs WHERE run_id = $1", run)

    reply = await ledger.ask(subjects.LEDGER_SWEEP_RETRY, runId=run)
    assert reply["status"] == 200 and reply["run"]["cleanupStatus"] == "pending", reply
    for row in rows:
        state = await _row(db, row)
        assert (state["retry_at"], state["away"], state["attempts"]) == (None, 1, 0)
    assert (await _row(db, other_row))["retry_at"] is not None  # another run's rows keep waiting
    assert await db.fetchval("SELECT updated_at FROM runs WHERE run_id = $1", run) == before
    log = await db.fetch("SELECT kind, detail FROM run_log WHERE run_id = $1 AND kind = 'cleanup.retried'", run)
    assert [json.loads(entry["detail"]) for entry in log] == [{"dueNow": 2}]
    assert sorted(r["resourceId"] for r in await _claim(ledger, run)) == sorted(rows)


async def test_a_retry_of_a_pending_run_with_nothing_waiting_is_still_a_conflict(ledger, unique):
    await _finished_run(ledger, f"p{unique}", ["c1"])
    reply = await ledger.ask(subjects.LEDGER_SWEEP_RETRY, runId=f"p{unique}")
    assert reply["status"] == 409 and "pending" in reply["error"]
