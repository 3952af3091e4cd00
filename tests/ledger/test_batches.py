"""The hot subjects' batches (services/ledger/serving/batches.py through the coalescer) on a real
PostgreSQL: a batch writes exactly what its requests would alone — each change with its log
entry and event, replays answered with the first row, 404/409 with the single-row path's
sentences — a batch that fails part-way retries each request alone, and many callers on one
target over NATS still make exactly one winner."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

from services.ledger import resources, statuses
from services.ledger.database.store import Conflict, Database, NotFound
from services.ledger.serving.hot_subjects import Batching, HotActions
from shared import subjects
from shared.contracts import ledger as c
from tests.ledger.conftest import LedgerClient, log_kinds


@pytest.fixture
async def hot(ledger_db: str) -> AsyncIterator[HotActions]:
    """The hot subjects' actions on the test's database, without NATS in between: requests
    submitted in one turn of the loop are one batch, every time."""
    db = Database(ledger_db, pool_size=4)
    await db.open()
    try:
        yield HotActions(db, Batching(batch_max=64))
    finally:
        await db.close()


async def _run(db: asyncpg.Connection, run_id: str, status: str = "running", cleanup: str = "pending") -> None:
    await db.execute("INSERT INTO runs (run_id, shard, event, status, cleanup_status) VALUES ($1, 'uo1', 'x', $2, $3)",
                     run_id, status, cleanup)


def _add(run_id: str, ref: str, key: str | None = None, **extra) -> c.AddResource:
    return c.AddResource.model_validate({"runId": run_id, "module": "world", "kind": "creature", "ref": ref,
                                         "idempotencyKey": key or f"{run_id}:{ref}", **extra})


async def _entries(db: asyncpg.Connection, run_id: str) -> list[tuple[int, str, dict]]:
    return [(r["resource_id"], r["kind"], json.loads(r["detail"])) for r in await db.fetch(
        "SELECT resource_id, kind, detail FROM run_log WHERE run_id = $1 AND resource_id IS NOT NULL ORDER BY id",
        run_id)]


async def _events(db: asyncpg.Connection, run_id: str) -> list[tuple[str, dict]]:
    return [(r["type"], json.loads(r["resource"])) for r in await db.fetch(
        "SELECT kind AS type, resource FROM run_log WHERE run_id = $1 AND resource IS NOT NULL ORDER BY id", run_id)]


def _stats(hot: HotActions, name: str) -> dict[str, int]:
    return hot.stats()[name]


async def test_a_batch_of_reservations_writes_what_each_would_alone(hot, db, unique):
    run = f"batch-{unique}"
    await _run(db, run)
    alone, _ = await hot.reserve(_add(run, "alone", revert={"x": 1}, leaseDeadline=5))
    together = await asyncio.gather(*(hot.reserve(_add(run, f"c{n}", revert={"x": 1}, leaseDeadline=5))
                                      for n in range(5)))
    assert _stats(hot, "reserve")["batches"] == 1 and _stats(hot, "reserve")["largest"] == 5
    entries, events = await _entries(db, run), await _events(db, run)
    assert len(entries) == 6 and len(events) == 6

    def shape(row: dict) -> dict:
        return {k: v for k, v in row.items() if k not in ("resourceId", "ref", "idempotencyKey", "createdAt",
                                                          "updatedAt")}

    for (row, changes), (rid, kind, detail), (event_type, event_row) in zip(together, entries[1:], events[1:],
                                                                           strict=True):
        assert shape(row) == shape(alone) and row["status"] == "pending" and row["revert"] == {"x": 1}
        assert len(changes) == 1 and changes[0].resource == row
        assert (rid, kind) == (row["resourceId"], "resource.recorded")
        assert detail == {**entries[0][2], "ref": row["ref"]}
        assert (event_type, event_row) == ("resource.recorded", row)


async def test_a_batch_answers_replays_reused_keys_and_missing_or_finished_runs_as_alone(hot, db, unique):
    run, over = f"mixed-{unique}", f"over-{unique}"
    await _run(db, run)
    await _run(db, over, status="completed")
    first, _ = await hot.reserve(_add(run, "kept"))
    results = await asyncio.gather(
        hot.reserve(_add(run, "new")),
        hot.reserve(_add(run, "kept")),                      # the same request again: its first row
        hot.reserve(_add(run, "elsewhere", key=f"{run}:kept")),  # its key names another target
        hot.reserve(_add(f"ghost-{unique}", "g")),
        hot.reserve(_add(over, "late")),
        return_exceptions=True)
    assert results[0][0]["ref"] == "new"
    assert results[1] == (first, [])
    assert isinstance(results[2], Conflict) and str(results[2]) == (
        f"idempotencyKey '{run}:kept' already names resource {first['resourceId']}, a different target; "
        "use a new key for a new resource")
    assert isinstance(results[3], NotFound) and str(results[3]) == f"no run 'ghost-{unique}'"
    assert isinstance(results[4], Conflict) and str(results[4]) == (
        f"run '{over}' is completed; nothing new may be reserved for it")
    # The reused key waited for the batch (one key, one statement); the three others came back unchanged.
    assert (_stats(hot, "reserve")["unchanged"], _stats(hot, "reserve")["split"]) == (3, 1)
    assert [(kind, detail["ref"]) for _, kind, detail in await _entries(db, run)] == [
        ("resource.recorded", "kept"), ("resource.recorded", "new")]
    assert await _entries(db, over) == []


async def test_a_batch_that_fails_part_way_retries_each_request_alone(hot, db, unique):
    run, holder_run = f"part-{unique}", f"holder-{unique}"
    await _run(db, run)
    await _run(db, holder_run)
    holder, _ = await hot.record(_add(holder_run, "held"))
    # One request of the batch wants a target a live row holds: the statement fails whole
    # (uq_resources_live_target), so nothing of it lands; each request then runs alone.
    results = await asyncio.gather(hot.reserve(_add(run, "a")), hot.reserve(_add(run, "held")),
                                   hot.reserve(_add(run, "b")), return_exceptions=True)
    assert _stats(hot, "reserve")["failed_batches"] == 1
    assert [r[0]["ref"] for r in (results[0], results[2])] == ["a", "b"]
    assert isinstance(results[1], Conflict) and str(results[1]) == (
        f"target world/creature/held is held by resource {holder['resourceId']} (confirmed, run '{holder_run}'); "
        "it is free again once that row is resolved")
    rows = await db.fetch("SELECT ref, status FROM resources WHERE run_id = $1 ORDER BY ref", run)
    assert [(r["ref"], r["status"]) for r in rows] == [("a", "pending"), ("b", "pending")]
    assert sorted(detail["ref"] for _, _, detail in await _entries(db, run)) == ["a", "b"]
    assert len(await _events(db, run)) == 2


async def test_a_record_batch_reopens_a_finished_cleanup_once(hot, db, unique):
    run = f"reopen-{unique}"
    await _run(db, run, status="completed", cleanup="complete")
    results = await asyncio.gather(*(hot.record(_add(run, f"r{n}")) for n in range(3)))
    assert _stats(hot, "record")["batches"] == 1
    assert all(row["status"] == "confirmed" for row, _ in results)
    assert await db.fetchval("SELECT cleanup_status FROM runs WHERE run_id = $1", run) == "pending"
    assert await log_kinds(db, run) == ["resource.recorded"] * 3


async def test_a_batch_of_transitions_changes_each_row_once_and_explains_the_rest(hot, db, unique):
    run = f"moves-{unique}"
    await _run(db, run)
    rows = [row for row, _ in await asyncio.gather(*(hot.reserve(_add(run, f"t{n}")) for n in range(5)))]
    a, b, done, gone, failing = (row["resourceId"] for row in rows)
    await hot.confirm(c.ResourceRef(resourceId=done))
    await hot.fail(c.FailResource(resourceId=gone, error="the shard said no"))
    results = await asyncio.gather(
        hot.confirm(c.ResourceRef(resourceId=a)), hot.confirm(c.ResourceRef(resourceId=b)),
        hot.confirm(c.ResourceRef(resourceId=done)),      # the same confirm again: a replay
        hot.confirm(c.ResourceRef(resourceId=gone)),      # reverted: a 409
        hot.confirm(c.ResourceRef(resourceId=987654321)),
        hot.fail(c.FailResource(resourceId=failing, error="out of room")),
        return_exceptions=True)
    assert [results[n][0]["status"] for n in (0, 1, 2)] == ["confirmed"] * 3
    assert results[2][1] == [], "a replay changed something"
    assert isinstance(results[3], Conflict) and str(results[3]) == (
        f"resource {gone} is reverted; confirm needs it to be pending")
    assert isinstance(results[4], NotFound) and str(results[4]) == "no resource 987654321"
    assert results[5][0]["status"] == "reverted" and results[5][0]["lastError"] == "out of room"
    assert _stats(hot, "confirm")["batches"] == 1 and _stats(hot, "confirm")["unchanged"] == 3
    moves = [(rid, kind) for rid, kind, _ in await _entries(db, run) if kind != "resource.recorded"]
    assert sorted(moves) == sorted([(done, "resource.confirmed"), (gone, "resource.failed"), (a, "resource.confirmed"),
                                    (b, "resource.confirmed"), (failing, "resource.failed")])
    [detail] = [d for rid, kind, d in await _entries(db, run) if rid == failing and kind == "resource.failed"]
    assert detail == {"status": "reverted", "error": "out of room"}


async def test_one_row_outcomes_of_different_verdicts_share_a_batch_each_with_its_rule(hot, db, unique):
    run = f"outcomes-{unique}"
    await _run(db, run, status="completed")
    rows = [row for row, _ in await asyncio.gather(*(hot.record(_add(run, f"o{n}")) for n in range(3)))]
    ids = [row["resourceId"] for row in rows]
    await db.execute("UPDATE resources SET status = 'reverting', previous_status = 'confirmed' WHERE id = ANY($1)", ids)
    reverted, drifted, failed = await asyncio.gather(
        hot.outcome(ids[0], statuses.SWEEP_REVERTED, None),
        hot.outcome(ids[1], statuses.SWEEP_DRIFTED, "moved by a GM"),
        hot.outcome(ids[2], statuses.SWEEP_FAILED[False], "the module refused"))
    assert _stats(hot, "outcome")["batches"] == 1
    assert (reverted[0]["status"], drifted[0]["status"], failed[0]["status"]) == ("reverted", "drifted", "confirmed")
    assert (failed[0]["attempts"], failed[0]["gaveUp"], drifted[0]["lastError"]) == (1, True, "moved by a GM")
    kinds = {rid: kind for rid, kind, _ in await _entries(db, run) if kind.startswith("cleanup.")}
    assert kinds == {ids[0]: "cleanup.reverted", ids[1]: "cleanup.drifted", ids[2]: "cleanup.failed"}


# --- over NATS, as callers meet it ----------------------------------------------------------

async def _ask_all(ledger: LedgerClient, subject: str, bodies: list[dict]) -> list[dict]:
    return await asyncio.gather(*(ledger.ask(subject, **body) for body in bodies))


async def test_many_callers_reserving_one_target_make_exactly_one_holder(ledger, db, unique):
    run = f"contend-{unique}"
    await ledger.run(run, "running")
    bodies = [{"runId": run, "module": "world", "kind": "creature", "ref": "dragon", "idempotencyKey": f"{run}-{n}"}
              for n in range(32)]
    replies = await _ask_all(ledger, subjects.LEDGER_RESOURCE_RESERVE, bodies)
    winners = [r for r in replies if r["status"] == 200]
    assert len(winners) == 1, replies
    holder = winners[0]["resource"]["resourceId"]
    assert all(r["status"] == 409 and f"is held by resource {holder} (pending" in r["error"]
               for r in replies if r["status"] != 200)
    assert await db.fetchval("SELECT count(*) FROM resources WHERE run_id = $1", run) == 1
    assert await log_kinds(db, run) == ["run.created", "run.status", "resource.recorded"]


async def test_many_callers_confirming_one_row_change_it_once_and_all_hear_it_confirmed(ledger, db, unique):
    run = f"confirm-all-{unique}"
    await ledger.run(run, "running")
    row = (await ledger.record(run, "c1", reserve=True))["resource"]
    replies = await _ask_all(ledger, subjects.LEDGER_RESOURCE_CONFIRM, [{"resourceId": row["resourceId"]}] * 32)
    assert all(r["status"] == 200 and r["resource"]["status"] == "confirmed" for r in replies), replies
    assert (await log_kinds(db, run)).count("resource.confirmed") == 1


async def test_many_callers_failing_one_row_with_their_own_errors_make_one_winner(ledger, db, unique):
    run = f"fail-all-{unique}"
    await ledger.run(run, "running")
    row = (await ledger.record(run, "c1", reserve=True))["resource"]
    replies = await _ask_all(ledger, subjects.LEDGER_RESOURCE_FAIL,
                             [{"resourceId": row["resourceId"], "error": f"reason {n}"} for n in range(16)])
    winners = [r for r in replies if r["status"] == 200]
    assert len(winners) == 1, replies
    assert {r["status"] for r in replies if r is not winners[0]} == {409}
    [detail] = [d for _, kind, d in await _entries(db, run) if kind == "resource.failed"]
    assert detail["error"] == winners[0]["resource"]["lastError"]


async def test_requests_arriving_together_over_nats_are_coalesced_and_each_answered(ledger, nc, db, unique):
    run = f"wire-{unique}"
    await ledger.run(run, "running")
    bodies = [{"runId": run, "module": "world", "kind": "creature", "ref": f"w{n}", "idempotencyKey": f"{run}-{n}"}
              for n in range(64)]
    replies = await _ask_all(ledger, subjects.LEDGER_RESOURCE_RESERVE, bodies)
    assert sorted(r["resource"]["ref"] for r in replies) == sorted(b["ref"] for b in bodies)
    health = json.loads((await nc.request(subjects.health("ledger"), b"", timeout=5)).data)
    reserve = health["coalescers"]["reserve"]
    assert reserve["requests"] >= 64 and reserve["batches"] >= 1, reserve
    assert health["hot"][subjects.LEDGER_RESOURCE_RESERVE]["errors"] == 0
    assert await db.fetchval("SELECT count(*) FROM run_log WHERE run_id = $1 AND kind = 'resource.recorded'", run) == 64


async def test_the_single_row_path_alone_still_answers_every_rule(ledger_db, db, unique):
    """``ledger_batch_max`` 1 turns coalescing off: the path a lone request takes, checked alone."""
    database = Database(ledger_db, pool_size=2)
    await database.open()
    try:
        single = HotActions(database, Batching(batch_max=1))
        run = f"single-{unique}"
        await _run(db, run)
        results = await asyncio.gather(*(single.reserve(_add(run, f"s{n}")) for n in range(4)))
        assert single.stats()["reserve"]["batches"] == 0 and single.stats()["reserve"]["alone"] == 4
        assert sorted(row["ref"] for row, _ in results) == ["s0", "s1", "s2", "s3"]
        with pytest.raises(NotFound):
            await resources.transition(database, 424242, statuses.CONFIRM)
    finally:
        await database.close()
