"""Lease deadlines: a row still ``confirmed`` after its ``leaseDeadline`` — a lease the shard
should have let go of while nobody watched — is flagged on every row rendering (console,
events), counted on the console, listed by ``ledger.leases.overdue`` (most overdue first)
and logged by the ledger at start."""

from __future__ import annotations

import asyncio
import logging
import time

from services.ledger.app import create_app
from services.ledger.settings import LedgerSettings
from shared import subjects
from tests.ledger.conftest import LedgerClient, wait_until_serving


def _ms(offset_s: float) -> int:
    return int((time.time() + offset_s) * 1000)


async def _leases(ledger, run: str) -> dict[str, int]:
    """Rows of every kind: overdue, due later, no deadline, overdue but given back, overdue
    but still pending (not yet out there)."""
    await ledger.run(run, "running")
    made = {}
    for ref, deadline, reserve in (("old", _ms(-7200), False), ("older", _ms(-86400), False),
                                   ("later", _ms(3600), False), ("none", None, False),
                                   ("pending", _ms(-60), True)):
        extra = {"leaseDeadline": deadline} if deadline is not None else {}
        reply = await ledger.record(run, f"{run}-{ref}", kind="lease", reserve=reserve, **extra)
        assert reply["status"] == 200, reply
        made[ref] = reply["resource"]["resourceId"]
    return made


async def test_the_console_flags_each_lease_past_its_deadline_and_counts_them(ledger, unique):
    run = f"r{unique}"
    made = await _leases(ledger, run)
    console = await ledger.console(run)
    flagged = {r["resourceId"] for r in console["resources"] if r["leaseDeadlinePassed"]}
    assert flagged == {made["old"], made["older"]}
    assert console["leasesOverdue"] == 2


async def test_leases_overdue_lists_them_most_overdue_first_across_runs(ledger, db, unique):
    made = await _leases(ledger, f"a{unique}")
    reply = await ledger.ask(subjects.LEDGER_LEASES_OVERDUE)
    assert reply["status"] == 200 and reply["count"] == 2
    assert [r["resourceId"] for r in reply["resources"]] == [made["older"], made["old"]]
    assert (await ledger.ask(subjects.LEDGER_LEASES_OVERDUE, limit=1))["resources"][0]["resourceId"] == made["older"]
    # Given back, it is no longer overdue.
    await db.execute("UPDATE resources SET status = 'reverted' WHERE id = $1", made["older"])
    again = await ledger.ask(subjects.LEDGER_LEASES_OVERDUE)
    assert again["count"] == 1 and [r["resourceId"] for r in again["resources"]] == [made["old"]]
    assert (await ledger.ask(subjects.LEDGER_LEASES_OVERDUE, limit=0))["status"] == 400


async def test_the_overdue_query_uses_the_status_deadline_index(db):
    await db.execute("SET enable_seqscan = off")
    plan = "\n".join(r[0] for r in await db.fetch(
        "EXPLAIN SELECT id FROM resources WHERE status = 'confirmed' AND lease_deadline < 5 "
        "ORDER BY lease_deadline LIMIT 10"))
    assert "ix_resources_status_lease" in plan


async def test_a_ledger_that_starts_with_leases_past_their_deadline_says_so(nats_url, nc, ledger_db, caplog, unique):
    settings = LedgerSettings(nats_url=nats_url, database_url=ledger_db, db_pool_size=2)
    async with create_app(settings):
        await wait_until_serving(nc)
        await _leases(LedgerClient(nc), f"r{unique}")
    caplog.set_level(logging.INFO, logger="shardbus.ledger")
    # The first ledger's look at start may land while the leases are being recorded (it runs
    # beside them) and warn of fewer: only the second start's look is this test's.
    caplog.clear()
    async with create_app(settings):
        await wait_until_serving(nc)
        for _ in range(100):
            if any("past their deadline" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)
    warned = [r for r in caplog.records if "past their deadline" in r.getMessage()]
    assert warned and warned[0].levelno == logging.WARNING and warned[0].count == 2
