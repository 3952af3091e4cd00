"""The ledger's contract (shared/contracts/ledger.py) against both sides of every subject: the
ledger serves each subject with the contract's request model and answers what the reply model
says — no field missing, none it does not name — and the cleanup service's client gets 200s
asking with the same models. Real NATS, real PostgreSQL, the real ledger."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import ValidationError

from services.cleanup.ledger_client import LedgerClient as CleanupLedgerClient
from services.cleanup.requester import NatsRequester
from shared import subjects
from shared.contracts import ledger as c
from shared.contracts import ledger_statuses as st
from tests.contracts.asyncapi_docs import committed, served
from tests.contracts.fields import unnamed_fields
from tests.ledger.conftest import LedgerClient

BY_SUBJECT = {contract.subject: contract for contract in c.CONTRACTS}


def test_every_ledger_request_subject_has_exactly_one_contract():
    served = {value for name, value in vars(subjects).items()
              if name.startswith("LEDGER_") and isinstance(value, str) and value.startswith("ledger.")
              and not name.startswith("LEDGER_EVENTS")}
    assert set(BY_SUBJECT) == served
    assert len(BY_SUBJECT) == len(c.CONTRACTS)
    assert {contract.queue for contract in c.CONTRACTS} == {subjects.LEDGER_QUEUE}


@pytest.mark.parametrize("contract", c.CONTRACTS, ids=lambda contract: contract.subject)
def test_the_ledger_serves_each_subject_with_the_contracts_request_model(contract):
    # The AsyncAPI document is generated from the ledger's handlers (tests/system/test_asyncapi.py
    # keeps it current): each subject's payload is the model its handler validates with.
    document = committed("ledger")
    _channel, schema_name = served(document, contract.subject)
    if contract.subject == subjects.LEDGER_EXPIRED_PATTERN:
        # Read leniently (docs/ledger.md, "Expiry"): any body, a malformed expiry answers {expired: 0}.
        assert "properties" not in document["components"]["schemas"][schema_name]
        return
    assert schema_name == contract.request.__name__
    documented = document["components"]["schemas"][schema_name].get("properties", {})
    assert set(documented) == set(contract.request.model_json_schema(by_alias=True).get("properties", {}))


# --- each subject answered as its contract says ---------------------------------------------

Ask = Callable[[LedgerClient, str], Awaitable[dict[str, Any]]]


async def _run_with_rows(client: LedgerClient, run_id: str, status: str = "completed") -> dict[str, Any]:
    await client.run(run_id, "running")
    reserved = await client.record(run_id, "0x1", reserve=True)
    await client.record(run_id, "0x2", kind="lease", revert={"key": "k", "expected": "v", "baseline": "b"},
                        leaseDeadline=1)
    await client.ask(subjects.LEDGER_RUN_STATUS, runId=run_id, status=status)
    return reserved["resource"]


async def _claimed(client: LedgerClient, run_id: str) -> list[dict[str, Any]]:
    await _run_with_rows(client, run_id)
    reply = await client.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run_id, maxAttempts=3, limit=10, claimTimeoutS=60.0)
    return reply["resources"]


async def _ask_create(client: LedgerClient, run_id: str) -> dict[str, Any]:
    return await client.ask(subjects.LEDGER_RUN_CREATE, runId=run_id, shard="uo1", event="invasion",
                            startsAt=1_000, endsAt=2_000)


async def _ask_status(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await client.run(run_id)
    return await client.ask(subjects.LEDGER_RUN_STATUS, runId=run_id, status=st.RUNNING)


async def _ask_reserve(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await client.run(run_id, "running")
    return await client.record(run_id, "0x1", reserve=True, revert={"serial": 1})


async def _ask_record(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await client.run(run_id, "running")
    return await client.record(run_id, "0x1", leaseDeadline=1)


async def _ask_confirm(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await client.run(run_id, "running")
    row = (await client.record(run_id, "0x1", reserve=True))["resource"]
    return await client.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=row["resourceId"])


async def _ask_fail(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await client.run(run_id, "running")
    row = (await client.record(run_id, "0x1", reserve=True))["resource"]
    return await client.ask(subjects.LEDGER_RESOURCE_FAIL, resourceId=row["resourceId"], error="the spawn failed")


async def _ask_expired(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await client.run(run_id, "running")
    await client.record(run_id, "0x1", module="world", kind="lease")
    return await client.ask(subjects.ledger_expired("world"), kind="lease", ref="0x1")


async def _ask_reconcile(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await client.run(run_id, "running")
    await client.record(run_id, "0x1")
    return await client.ask(subjects.ledger_reconcile("world"), runId=run_id, present=[])


async def _ask_console(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await _run_with_rows(client, run_id)
    return await client.ask(subjects.LEDGER_CONSOLE, runId=run_id, limit=1)


async def _ask_log(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await _run_with_rows(client, run_id)
    return await client.ask(subjects.LEDGER_LOG, runId=run_id, limit=2)


async def _ask_runs(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await client.run(run_id)
    await client.run(run_id + "b")
    return await client.ask(subjects.LEDGER_RUNS, limit=1)


async def _ask_leases(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await _run_with_rows(client, run_id)
    return await client.ask(subjects.LEDGER_LEASES_OVERDUE)


async def _ask_live(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await _run_with_rows(client, run_id, "running")
    return await client.ask(subjects.LEDGER_LIVE, module="world", limit=1)


async def _ask_live_modules(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await _run_with_rows(client, run_id, "running")
    return await client.ask(subjects.LEDGER_LIVE_MODULES)


async def _ask_settle(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await client.run(run_id, "completed")
    return await client.ask(subjects.LEDGER_SWEEP_SETTLE)


async def _ask_candidates(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await _run_with_rows(client, run_id)
    return await client.ask(subjects.LEDGER_SWEEP_CANDIDATES, maxAttempts=3, limit=10)


async def _ask_claim(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await _run_with_rows(client, run_id)
    return await client.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run_id, maxAttempts=3, limit=1, claimTimeoutS=60.0)


async def _ask_reverted(client: LedgerClient, run_id: str) -> dict[str, Any]:
    row = (await _claimed(client, run_id))[0]
    return await client.ask(subjects.LEDGER_SWEEP_REVERTED, resourceId=row["resourceId"])


async def _ask_drifted(client: LedgerClient, run_id: str) -> dict[str, Any]:
    row = (await _claimed(client, run_id))[0]
    return await client.ask(subjects.LEDGER_SWEEP_DRIFTED, resourceId=row["resourceId"], error="moved by a GM")


async def _ask_failed(client: LedgerClient, run_id: str) -> dict[str, Any]:
    row = (await _claimed(client, run_id))[0]
    return await client.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row["resourceId"], error="refused",
                            transient=True)


async def _ask_outcomes(client: LedgerClient, run_id: str) -> dict[str, Any]:
    first, second = await _claimed(client, run_id)
    return await client.ask(subjects.LEDGER_SWEEP_OUTCOMES, outcomes=[
        {"resourceId": first["resourceId"], "verdict": st.VERDICT_REVERTED},
        {"resourceId": second["resourceId"], "verdict": st.VERDICT_AWAY, "error": "no gateway"},
        {"resourceId": 9_999_999, "verdict": st.VERDICT_REVERTED}])


async def _ask_finish(client: LedgerClient, run_id: str) -> dict[str, Any]:
    await _claimed(client, run_id)
    return await client.ask(subjects.LEDGER_SWEEP_FINISH, runId=run_id, maxAttempts=3, summary={"claimed": 2})


async def _ask_retry(client: LedgerClient, run_id: str) -> dict[str, Any]:
    for row in await _claimed(client, run_id):
        await client.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row["resourceId"], error="refused",
                         transient=False)
    await client.ask(subjects.LEDGER_SWEEP_FINISH, runId=run_id, maxAttempts=3, summary={})
    return await client.ask(subjects.LEDGER_SWEEP_RETRY, runId=run_id)


async def _ask_waiting(client: LedgerClient, run_id: str) -> dict[str, Any]:
    rows = await _claimed(client, run_id)
    await client.ask(subjects.LEDGER_SWEEP_OUTCOMES, outcomes=[
        {"resourceId": row["resourceId"], "verdict": st.VERDICT_AWAY, "error": "no gateway"} for row in rows])
    return await client.ask(subjects.LEDGER_SWEEP_WAITING)


ASKS: dict[str, Ask] = {
    subjects.LEDGER_RUN_CREATE: _ask_create, subjects.LEDGER_RUN_STATUS: _ask_status,
    subjects.LEDGER_RESOURCE_RESERVE: _ask_reserve, subjects.LEDGER_RESOURCE_RECORD: _ask_record,
    subjects.LEDGER_RESOURCE_CONFIRM: _ask_confirm, subjects.LEDGER_RESOURCE_FAIL: _ask_fail,
    subjects.LEDGER_EXPIRED_PATTERN: _ask_expired, subjects.LEDGER_RECONCILE_PATTERN: _ask_reconcile,
    subjects.LEDGER_CONSOLE: _ask_console, subjects.LEDGER_LOG: _ask_log, subjects.LEDGER_RUNS: _ask_runs,
    subjects.LEDGER_LEASES_OVERDUE: _ask_leases, subjects.LEDGER_LIVE: _ask_live,
    subjects.LEDGER_LIVE_MODULES: _ask_live_modules, subjects.LEDGER_SWEEP_SETTLE: _ask_settle,
    subjects.LEDGER_SWEEP_CANDIDATES: _ask_candidates, subjects.LEDGER_SWEEP_CLAIM: _ask_claim,
    subjects.LEDGER_SWEEP_REVERTED: _ask_reverted, subjects.LEDGER_SWEEP_DRIFTED: _ask_drifted,
    subjects.LEDGER_SWEEP_FAILED: _ask_failed, subjects.LEDGER_SWEEP_OUTCOMES: _ask_outcomes,
    subjects.LEDGER_SWEEP_FINISH: _ask_finish, subjects.LEDGER_SWEEP_RETRY: _ask_retry,
    subjects.LEDGER_SWEEP_WAITING: _ask_waiting,
}
"""For each subject, how to get a 200 from it (what it needs made first, then the request)."""


def test_every_contract_is_asked_here():
    assert set(ASKS) == set(BY_SUBJECT)


@pytest.mark.parametrize("contract", c.CONTRACTS, ids=lambda contract: contract.subject)
async def test_the_ledger_answers_each_subject_as_its_contract_says(contract, ledger, unique):
    reply = await ASKS[contract.subject](ledger, f"ct{unique}")
    assert reply["status"] == 200, reply
    parsed = contract.reply.model_validate(reply)
    assert unnamed_fields(parsed) == [], f"the ledger sends fields {contract.reply.__name__} does not name"
    # Every field the contract names came from the ledger, none from a default.
    assert set(type(parsed).model_fields) - {"error"} <= parsed.model_fields_set


def test_a_reply_missing_a_field_or_of_another_type_fails_its_contract():
    run = {"runId": "r", "shard": "uo1", "event": "e", "status": st.RUNNING, "colour": "blue",
           "cleanupStatus": st.CLEANUP_PENDING, "cleanupWord": "w", "cleanupColour": "c", "createdAt": "t",
           "updatedAt": "t", "endedAt": None, "startsAt": None, "endsAt": None}
    c.RunReply.model_validate({"status": 200, "run": run})
    with pytest.raises(ValidationError, match=r"cleanupStatus|cleanup_status"):
        c.RunReply.model_validate({"status": 200, "run": {k: v for k, v in run.items() if k != "cleanupStatus"}})
    with pytest.raises(ValidationError, match="status"):
        c.RunReply.model_validate({"status": 200, "run": {**run, "status": "finished"}})
    with pytest.raises(ValidationError, match="modules"):  # a module name becomes a subject token
        c.LiveModulesReply.model_validate({"status": 200, "modules": ["world", "a.b>"]})
    extra = c.RunReply.model_validate({"status": 200, "run": {**run, "mood": "good"}})
    assert unnamed_fields(extra) == ["reply.run.mood"]


# --- the cleanup service's client asks with the same models ---------------------------------

async def test_the_cleanup_client_is_answered_200_on_every_subject_it_asks(ledger, nc, unique):
    run_id = f"cc{unique}"
    await _run_with_rows(ledger, run_id)
    client = CleanupLedgerClient(NatsRequester(nc), 5.0)
    assert run_id in await client.candidates(3, 10)
    rows, shard, more = await client.claim(run_id, 3, 10, 60)
    assert (len(rows), shard, more) == (2, "uo1", False)
    recorded = await client.outcomes([{"resourceId": rows[0]["resourceId"], "verdict": st.VERDICT_REVERTED},
                                      {"resourceId": rows[1]["resourceId"], "verdict": st.VERDICT_FAILED,
                                       "error": "refused"}])
    assert sorted(recorded.recorded) == sorted(row["resourceId"] for row in rows)
    assert (await client.console(run_id, limit=1))["run"]["runId"] == run_id
    run = await client.finish(run_id, 1, {"claimed": 2})
    assert run.cleanup_status == st.CLEANUP_INCOMPLETE
    assert (await client.retry(run_id)).cleanup_status == st.CLEANUP_PENDING
    live_run = f"cl{unique}"
    await _run_with_rows(ledger, live_run, "running")
    assert "world" in await client.live_modules()
    assert {row["runId"] for row in await client.live("world")} >= {live_run}
    await ledger.record(live_run, "0x9")  # a confirmed creature the shard no longer lists
    assert await client.reconcile("world", live_run, "creature", ["0x1"]) == 1
    assert await client.expired("world", "creature", "0x1") >= 1
    assert await client.settle() >= 0
