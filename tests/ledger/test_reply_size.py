"""No ledger reply outgrows a NATS message, whatever the rows hold.

A ``revert`` is capped on input (8 KiB as PostgreSQL renders it, a 400 naming the field), and
the replies that list rows — the console, a module's live rows, a sweep's claim — are paged by
a byte budget as well as by count, with a continuation (``after``/``next``; a claim says
``more``). Rows written before the cap, with a revert of hundreds of kilobytes or megabytes,
still page out: such a revert is left out of replies and events (``revert: null`` with
``revertOmitted``: its size), never the row. A claim is bounded by bytes before it commits,
so no row turns ``reverting`` without being in a reply that was sent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from services.ledger.console import PAGE_BYTES, REVERT_INLINE_MAX, page_bytes
from shared import subjects
from shared.contracts.ledger import REVERT_MAX_BYTES

NATS_MAX_PAYLOAD = 1024 * 1024
"""nats-server's default max_payload: every reply must stay below it."""


async def _raw(ledger, subject: str, **body: Any) -> tuple[dict[str, Any], int]:
    """The decoded reply and its size on the wire."""
    msg = await ledger.nc.request(subject, json.dumps(body).encode(), timeout=10)
    return json.loads(msg.data), len(msg.data)


async def _legacy_rows(db, run_id: str, refs: list[str], revert_bytes: int, *, module: str = "world",
                       kind: str = "creature") -> None:
    """Rows as a ledger before the cap could have stored them: straight into the table."""
    revert = json.dumps({"blob": "x" * revert_bytes})
    await db.executemany(
        "INSERT INTO resources (run_id, module, kind, ref, status, revert, idempotency_key) "
        "VALUES ($1, $2, $3, $4, 'confirmed', $5::jsonb, $6)",
        [(run_id, module, kind, ref, revert, f"{run_id}:{module}:{kind}:{ref}") for ref in refs])


async def _fat_run(ledger, db, run_id: str, module: str = "world") -> dict[str, int]:
    """A run holding 5 MB of rows: two 600 KB reverts and one of 2 MB, ten just under the
    inline limit (all from before the cap), 150 rows with a revert just under the cap, and a
    few small ones. Ref → revert bytes."""
    await ledger.run(run_id, "running")
    sizes: dict[str, int] = {}
    await _legacy_rows(db, run_id, ["big-a", "big-b"], 600_000, module=module)
    await _legacy_rows(db, run_id, [f"mid-{n}" for n in range(10)], REVERT_INLINE_MAX - 20, module=module)
    await _legacy_rows(db, run_id, ["huge"], 2_000_000, module=module)
    await _legacy_rows(db, run_id, [f"full-{n:03}" for n in range(150)], REVERT_MAX_BYTES - 20, module=module)
    for ref in ("small-1", "small-2", "small-3"):
        assert (await ledger.record(run_id, ref, module=module, revert={"serial": ref}))["status"] == 200
    for row in await db.fetch("SELECT ref, octet_length(revert::text) AS n FROM resources WHERE run_id = $1", run_id):
        sizes[row["ref"]] = row["n"]
    return sizes


def _check_rows(rows: list[dict[str, Any]], sizes: dict[str, int]) -> None:
    """Every row is whole, except a revert over the inline limit, which is left out and sized."""
    for row in rows:
        if sizes[row["ref"]] > REVERT_INLINE_MAX:
            assert row["revert"] is None and row["revertOmitted"] == sizes[row["ref"]], row["ref"]
        else:
            assert "revertOmitted" not in row and len(json.dumps(row["revert"], separators=(", ", ": "))) \
                == sizes[row["ref"]], row["ref"]


async def test_the_console_of_a_run_holding_megabytes_pages_out_every_row_under_the_payload_limit(
        ledger, db, unique):
    run = f"r{unique}"
    sizes = await _fat_run(ledger, db, run)
    ids = [r["id"] for r in await db.fetch("SELECT id FROM resources WHERE run_id = $1 ORDER BY id", run)]
    seen: list[dict[str, Any]] = []
    after: int | None = None
    pages = 0
    while True:
        body: dict[str, Any] = {"runId": run} if after is None else {"runId": run, "after": after}
        reply, size = await _raw(ledger, subjects.LEDGER_CONSOLE, **body)
        assert reply["status"] == 200, reply
        assert size <= PAGE_BYTES + 16 * 1024 < NATS_MAX_PAYLOAD
        # Counts are the whole run's on every page.
        assert sum(reply["counts"].values()) == len(ids) and reply["unresolved"] == len(ids)
        assert reply["run"]["runId"] == run
        seen += reply["resources"]
        pages += 1
        after = reply["next"]
        if after is None:
            break
        assert after == reply["resources"][-1]["resourceId"]
    assert [r["resourceId"] for r in seen] == ids
    assert pages >= 3
    _check_rows(seen, sizes)


async def test_the_console_pages_by_count_too(ledger, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    for n in range(5):
        await ledger.record(run, f"c{n}")
    first = await ledger.ask(subjects.LEDGER_CONSOLE, runId=run, limit=2)
    assert [r["ref"] for r in first["resources"]] == ["c0", "c1"] and first["next"] is not None
    second = await ledger.ask(subjects.LEDGER_CONSOLE, runId=run, limit=2, after=first["next"])
    third = await ledger.ask(subjects.LEDGER_CONSOLE, runId=run, limit=2, after=second["next"])
    assert [r["ref"] for r in second["resources"] + third["resources"]] == ["c2", "c3", "c4"]
    assert third["next"] is None
    # The whole run in one page: no continuation.
    assert (await ledger.console(run))["next"] is None


async def test_a_modules_live_rows_page_out_under_the_payload_limit(ledger, db, unique):
    run, module = f"r{unique}", f"m{unique}"
    sizes = await _fat_run(ledger, db, run, module=module)
    seen: list[dict[str, Any]] = []
    after: int | None = None
    while True:
        body: dict[str, Any] = {"module": module, "limit": 10_000}
        if after is not None:
            body["after"] = after
        reply, size = await _raw(ledger, subjects.LEDGER_LIVE, **body)
        assert reply["status"] == 200, reply
        assert size <= PAGE_BYTES + 1024
        seen += reply["resources"]
        after = reply["next"]
        if after is None:
            break
    assert sorted(r["ref"] for r in seen) == sorted(sizes)
    assert len({r["resourceId"] for r in seen}) == len(seen)
    _check_rows(seen, sizes)


async def test_a_claim_takes_only_what_its_reply_can_carry_and_commits_nothing_it_does_not_send(
        ledger, db, unique):
    run = f"r{unique}"
    sizes = await _fat_run(ledger, db, run)
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    events: list[int] = []

    async def on_event(msg) -> None:
        if json.loads(msg.data)["type"] == "cleanup.claimed":  # not the run's own (late) events
            events.append(len(msg.data))

    sub = await ledger.nc.subscribe(subjects.ledger_run_events(run), cb=on_event)
    claimed: list[dict[str, Any]] = []
    while True:
        reply, size = await _raw(ledger, subjects.LEDGER_SWEEP_CLAIM, runId=run, maxAttempts=3, limit=1000,
                                 claimTimeoutS=60)
        assert reply["status"] == 200, reply
        assert size <= PAGE_BYTES + 1024
        claimed += reply["resources"]
        # Exactly the rows this sweeper was sent are `reverting`: none lost with a reply.
        reverting = await db.fetchval("SELECT count(*) FROM resources WHERE run_id = $1 AND status = 'reverting'",
                                      run)
        assert reverting == len(claimed)
        if not reply["more"]:
            break
        assert reply["resources"]
    assert sorted(r["ref"] for r in claimed) == sorted(sizes)
    assert len({r["resourceId"] for r in claimed}) == len(claimed)
    _check_rows(claimed, sizes)
    again, _ = await _raw(ledger, subjects.LEDGER_SWEEP_CLAIM, runId=run, maxAttempts=3, limit=1000)
    assert again["resources"] == [] and again["more"] is False
    # Each claimed row was published as an event, each one far below the payload limit.
    for _ in range(100):
        if len(events) >= len(claimed):
            break
        await asyncio.sleep(0.05)
    await sub.unsubscribe()
    assert len(events) == len(claimed) and max(events) < 100_000


async def test_a_claim_pages_by_count_and_says_when_more_is_left(ledger, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    for n in range(3):
        await ledger.record(run, f"c{n}")
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    first = await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run, limit=2)
    assert len(first["resources"]) == 2 and first["more"] is True
    second = await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run, limit=2)
    assert len(second["resources"]) == 1 and second["more"] is False


async def test_single_row_replies_and_events_leave_an_oversized_legacy_revert_out(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    await _legacy_rows(db, run, ["huge"], 2_000_000)
    (row_id,) = [r["id"] for r in await db.fetch("SELECT id FROM resources WHERE run_id = $1", run)]
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    claim = await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run)
    assert [r["resourceId"] for r in claim["resources"]] == [row_id]
    reply = await ledger.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row_id, error="shard away", transient=True)
    assert reply["status"] == 200 and reply["resource"]["revert"] is None
    assert reply["resource"]["revertOmitted"] > 2_000_000
    await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run)
    outcome = await ledger.ask(subjects.LEDGER_SWEEP_OUTCOMES, outcomes=[{"resourceId": row_id,
                                                                         "verdict": "reverted"}])
    assert outcome["recorded"] == [row_id]
    # The revert itself is still in the database, whole.
    assert await db.fetchval("SELECT octet_length(revert::text) FROM resources WHERE id = $1", row_id) > 2_000_000


async def test_runs_listed_stay_under_the_payload_limit(ledger, db, unique):
    # 1,000 runs with the longest ids and shards and the costliest event names to render
    # (control characters, six bytes each as JSON), written before any check on the name.
    name, shard = "\x01" * 128, "s" * 32
    ids = [f"r{unique}-{n:04}".ljust(64, "x") for n in range(1000)]
    await db.executemany("INSERT INTO runs (run_id, shard, event) VALUES ($1, $2, $3)",
                         [(run_id, shard, name) for run_id in ids])
    reply, size = await _raw(ledger, subjects.LEDGER_RUNS, limit=1000)
    assert reply["status"] == 200 and size < NATS_MAX_PAYLOAD
    assert 0 < len(reply["runs"]) < 1000 and reply["more"] is True
    rest = await ledger.ask(subjects.LEDGER_RUNS, limit=1000, after=reply["next"])  # the page cut goes on
    assert {r["runId"] for r in reply["runs"]}.isdisjoint(r["runId"] for r in rest["runs"])
    small = await ledger.ask(subjects.LEDGER_RUNS, limit=10)
    assert len(small["runs"]) == 10 and small["more"] is True


def test_pages_fit_a_server_with_a_smaller_max_payload():
    assert page_bytes(NATS_MAX_PAYLOAD) == PAGE_BYTES == 768 * 1024
    assert page_bytes(8 * NATS_MAX_PAYLOAD) == PAGE_BYTES
    assert page_bytes(256 * 1024) == 192 * 1024
