"""Owner binding (docs/ledger.md, "Owner binding"): the module of an expiry or a reconcile comes from the subject
only; an ``owner`` or ``module`` field in the payload changes nothing. Also what a reconcile
does to the rows the shard no longer lists."""

from __future__ import annotations

import pytest

from shared import subjects


@pytest.fixture
async def two_modules(ledger, unique):
    """A running run holding the same target under two modules; their resource ids."""
    run = f"r{unique}"
    await ledger.run(run, "running")
    mine = (await ledger.record(run, "c1", module="mine"))["resource"]["resourceId"]
    theirs = (await ledger.record(run, "c1", module="theirs"))["resource"]["resourceId"]
    return run, mine, theirs


async def _statuses(db) -> dict[str, str]:
    return {r["module"]: r["status"] for r in await db.fetch("SELECT module, status FROM resources")}


@pytest.mark.parametrize("field", ["owner", "module"])
async def test_an_expiry_naming_another_owner_in_its_payload_closes_only_the_subjects_module(
        ledger, db, two_modules, field):
    reply = await ledger.ask(subjects.ledger_expired("mine"), kind="creature", ref="c1", **{field: "theirs"})
    assert reply == {"status": 200, "expired": 1}
    assert await _statuses(db) == {"mine": "expired", "theirs": "confirmed"}


@pytest.mark.parametrize("field", ["owner", "module"])
async def test_a_reconcile_naming_another_owner_in_its_payload_touches_only_the_subjects_module(
        ledger, db, two_modules, field):
    run, _, _ = two_modules
    reply = await ledger.ask(subjects.ledger_reconcile("mine"), runId=run, present=[], **{field: "theirs"})
    assert reply == {"status": 200, "orphaned": 1}
    assert await _statuses(db) == {"mine": "orphaned", "theirs": "confirmed"}


async def test_a_module_with_no_rows_there_closes_nothing(ledger, db, two_modules):
    reply = await ledger.ask(subjects.ledger_expired("nobody"), kind="creature", ref="c1", owner="mine")
    assert reply == {"status": 200, "expired": 0}
    assert await _statuses(db) == {"mine": "confirmed", "theirs": "confirmed"}


async def test_a_reconcile_orphans_only_confirmed_rows_the_shard_no_longer_lists(ledger, db, unique):
    run = f"r{unique}"
    await ledger.run(run, "running")
    for ref in ("kept", "gone"):
        await ledger.record(run, ref)
    await ledger.record(run, "placeholder", reserve=True)
    await ledger.record(run, "a-gate", kind="gate")
    reply = await ledger.ask(subjects.ledger_reconcile("world"), runId=run, kind="creature", present=["kept"])
    assert reply == {"status": 200, "orphaned": 1}
    rows = {r["ref"]: r["status"] for r in await db.fetch("SELECT ref, status FROM resources")}
    assert rows == {"kept": "confirmed", "gone": "orphaned", "placeholder": "pending", "a-gate": "confirmed"}
    assert await db.fetchval("SELECT count(*) FROM run_log WHERE kind = 'resource.orphaned'") == 1


async def test_a_reconcile_of_an_unknown_run_is_not_found(ledger, unique):
    reply = await ledger.ask(subjects.ledger_reconcile("world"), runId=f"nope{unique}", present=[])
    assert reply["status"] == 404
