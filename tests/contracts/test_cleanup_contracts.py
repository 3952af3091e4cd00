"""The cleanup service's contract (shared/contracts/cleanup.py) against both sides: the service
serves each subject with the contract's request model and answers what its reply model says
(nothing missing, nothing unnamed), and ``shardbus cleanup`` builds its requests from the same
models. Real NATS, real PostgreSQL, the real ledger and cleanup service in-process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from services.cleanup.app import create_app
from services.cleanup.settings import CleanupSettings
from shared import subjects
from shared.contracts import cleanup as cc
from shared.contracts import ledger_statuses as st
from tests.contracts.asyncapi_docs import committed, served
from tests.contracts.fields import unnamed_fields
from tests.ledger.conftest import LedgerClient


@pytest.fixture
async def cleanup(nats_url: str, ledger: LedgerClient, nc) -> AsyncIterator[None]:
    """The cleanup service in-process (no periodic sweep within the test), beside the ledger."""
    settings = CleanupSettings(nats_url=nats_url, sweep_period_s=3600, reconcile_period_s=3600,
                               command_timeout_s=0.5)
    async with create_app(settings):
        # Its subscriptions reach nats-server over its own connection: until the health subject
        # (subscribed last) answers, a request from the test's connection may meet no responders.
        async with asyncio.timeout(10):
            while True:
                try:
                    await nc.request(subjects.health("cleanup"), b"", timeout=1)
                    break
                except nats.errors.NoRespondersError:
                    await asyncio.sleep(0.05)
        yield


async def _ask(nc, subject: str, request: dict[str, Any]) -> dict[str, Any]:
    return json.loads((await nc.request(subject, json.dumps(request).encode(), timeout=15)).data)


async def _incomplete_run(ledger: LedgerClient, run_id: str) -> None:
    """A finished run whose one row was refused for good: its cleanup wants a person."""
    await ledger.run(run_id, "running")
    await ledger.record(run_id, "0x1", module="nobody", kind="banner")
    await ledger.ask(subjects.LEDGER_RUN_STATUS, runId=run_id, status=st.COMPLETED)
    claimed = await ledger.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run_id, maxAttempts=3, limit=10,
                               claimTimeoutS=60.0)
    for row in claimed["resources"]:
        await ledger.ask(subjects.LEDGER_SWEEP_FAILED, resourceId=row["resourceId"], error="refused",
                         transient=False)
    finished = await ledger.ask(subjects.LEDGER_SWEEP_FINISH, runId=run_id, maxAttempts=3, summary={})
    assert finished["run"]["cleanupStatus"] == st.CLEANUP_INCOMPLETE


def test_every_cleanup_request_subject_has_exactly_one_contract():
    served = {subjects.CLEANUP_SWEEP, subjects.CLEANUP_RETRY, subjects.CLEANUP_RECONCILE}
    assert {contract.subject for contract in cc.CONTRACTS} == served
    assert {contract.owner for contract in cc.CONTRACTS} == {"cleanup"}


@pytest.mark.parametrize("contract", cc.CONTRACTS, ids=lambda contract: contract.subject)
def test_the_cleanup_service_serves_each_subject_with_the_contracts_request_model(contract):
    channel, schema_name = served(committed("cleanup"), contract.subject)
    assert schema_name == contract.request.__name__
    assert channel["bindings"]["nats"]["queue"] == contract.queue


async def test_a_whole_sweep_answers_the_sweep_reply(cleanup, nc):
    reply = await _ask(nc, subjects.CLEANUP_SWEEP, {})
    assert reply["status"] == 200, reply
    assert unnamed_fields(cc.SweepReply.model_validate(reply)) == []


async def test_a_one_run_sweep_and_a_retry_answer_the_run_reply(cleanup, ledger, nc, unique):
    run_id = f"cs{unique}"
    await _incomplete_run(ledger, run_id)
    swept = await _ask(nc, subjects.CLEANUP_SWEEP, {"runId": run_id})
    assert swept["status"] == 200, swept
    assert unnamed_fields(cc.RunReply.model_validate(swept)) == []
    retried = await _ask(nc, subjects.CLEANUP_RETRY, {"runId": run_id})
    assert retried["status"] == 200, retried
    parsed = cc.RunReply.model_validate(retried)
    assert unnamed_fields(parsed) == []
    assert parsed.run.run_id == run_id and parsed.run.claimed == 1


async def test_a_reconcile_answers_the_reconcile_reply(cleanup, ledger, nc, unique):
    await ledger.run(f"cr{unique}", "running")
    await ledger.record(f"cr{unique}", "0x1", module="world")
    reply = await _ask(nc, subjects.CLEANUP_RECONCILE, {"modules": ["world"]})
    assert reply["status"] == 200, reply
    parsed = cc.ReconcileReply.model_validate(reply)
    assert unnamed_fields(parsed) == []
    assert parsed.unanswered and parsed.unanswered[0].module == "world"


@pytest.mark.parametrize("contract, bad", [
    (cc.CONTRACTS[0], {"runId": "a.b"}), (cc.CONTRACTS[1], {}), (cc.CONTRACTS[2], {"modules": ["a b"]})],
    ids=lambda value: getattr(value, "subject", "bad"))
async def test_what_the_contract_refuses_the_service_answers_400(cleanup, nc, contract, bad):
    with pytest.raises(ValueError):
        contract.request.model_validate(bad)
    reply = await _ask(nc, contract.subject, bad)
    assert reply["status"] == 400, reply


def test_the_registry_lists_every_owners_contracts():
    """No module of shared/contracts with contracts is left out of shared/contracts/registry.py
    (which refuses a subject written twice when it is imported), and each names one of the
    four owners."""
    import importlib
    import pkgutil

    import shared.contracts as package
    from shared.contracts import registry

    assert {contract.owner for contract in registry.CONTRACTS} == {"ledger", "cleanup", "installer", "gateway"}
    for info in pkgutil.iter_modules(package.__path__):
        owned = getattr(importlib.import_module(f"shared.contracts.{info.name}"), "CONTRACTS", ())
        assert all(contract in registry.CONTRACTS for contract in owned), info.name
