"""The ledger's two request paths (services/ledger/serving/request_paths.py): every subject has one, the
architecture page says the same, and a subject moved to the other path answers byte for byte
as before, so moving one is the one-line change the table promises."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from services.ledger.app import create_app
from services.ledger.serving import request_paths
from services.ledger.serving.request_paths import MOVABLE, SERVED, Served
from services.ledger.settings import LedgerSettings
from shared import subjects
from shared.contracts import ledger as c
from tests.ledger.conftest import LedgerClient, wait_until_serving

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
SECTION = "## The ledger's two request paths"
EVENT = "invasión ☄"
"""Not ASCII: both paths send UTF-8 as it is."""
ROW = re.compile(r"\| `(?P<subject>[^`]+)` \| (?P<path>[^|]+?) \| (?P<why>[^|]+) \|")


def documented_paths() -> dict[str, str]:
    text = ARCHITECTURE.read_text()
    section = text[text.index(SECTION) + len(SECTION):]
    section = section[:section.find("\n## ")] if "\n## " in section else section
    return {m["subject"]: m["path"] for m in map(ROW.fullmatch, section.splitlines()) if m}


def test_every_subject_of_the_contract_has_a_path_and_the_architecture_page_names_it():
    assert SERVED.keys() == {contract.subject for contract in c.CONTRACTS}
    assert documented_paths() == {subject: served.value for subject, served in SERVED.items()}


async def _asked(nc, requests: list[tuple[str, bytes]]) -> list[bytes]:
    return [(await nc.request(subject, payload, timeout=10)).data for subject, payload in requests]


@pytest.mark.timeout(120)
async def test_every_fixed_subject_moved_to_the_other_path_answers_byte_for_byte_the_same(
        nats_url, ledger_db, nc, unique, monkeypatch):
    run, empty, missing = f"paths-{unique}", f"paths-empty-{unique}", f"paths-missing-{unique}"
    settings = LedgerSettings(nats_url=nats_url, database_url=ledger_db, migrate_on_start=False)
    recorded = {"runId": run, "module": "world", "kind": "creature", "ref": "r1", "idempotencyKey": f"{run}:r1",
                "leaseDeadline": 1000}
    reserved = {"runId": run, "module": "world", "kind": "creature", "ref": "r2", "idempotencyKey": f"{run}:r2"}

    def ask(subject: str, **body: object) -> tuple[str, bytes]:
        return subject, json.dumps(body).encode()

    async with create_app(settings):
        await wait_until_serving(nc)
        client = LedgerClient(nc, timeout=10)
        for run_id in (run, empty):
            created = await client.ask(subjects.LEDGER_RUN_CREATE, runId=run_id, shard="uo1", event=EVENT)
            assert created["status"] == 200
            assert (await client.ask(subjects.LEDGER_RUN_STATUS, runId=run_id, status="running"))["status"] == 200
        first = (await client.ask(subjects.LEDGER_RESOURCE_RECORD, **recorded))["resource"]["resourceId"]
        second = (await client.ask(subjects.LEDGER_RESOURCE_RESERVE, **reserved))["resource"]["resourceId"]
        assert (await client.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=second))["status"] == 200

    # Each asked in a state it leaves as it is (replays, reads, refusals), so both paths meet the same rows.
    requests = [
        ask(subjects.LEDGER_RUN_CREATE, runId=run, shard="uo1", event=EVENT),
        ask(subjects.LEDGER_RUN_STATUS, runId=run, status="running"),
        ask(subjects.LEDGER_RESOURCE_RECORD, **recorded),
        ask(subjects.LEDGER_RESOURCE_RESERVE, **reserved),
        ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=second),
        ask(subjects.LEDGER_RESOURCE_FAIL, resourceId=first + second + 1000, error="gone"),
        ask(subjects.LEDGER_CONSOLE, runId=run),
        ask(subjects.LEDGER_LOG, runId=run),
        ask(subjects.LEDGER_RUNS),
        ask(subjects.LEDGER_LEASES_OVERDUE),
        ask(subjects.LEDGER_LIVE, module="world"),
        ask(subjects.LEDGER_LIVE_MODULES),
        ask(subjects.LEDGER_SWEEP_SETTLE),
        ask(subjects.LEDGER_SWEEP_CANDIDATES),
        ask(subjects.LEDGER_SWEEP_CLAIM, runId=empty),
        ask(subjects.LEDGER_SWEEP_REVERTED, resourceId=first),
        ask(subjects.LEDGER_SWEEP_DRIFTED, resourceId=first, error="moved"),
        ask(subjects.LEDGER_SWEEP_FAILED, resourceId=first, error="no", transient=True),
        ask(subjects.LEDGER_SWEEP_OUTCOMES, outcomes=[{"resourceId": first, "verdict": "reverted"}]),
        ask(subjects.LEDGER_SWEEP_FINISH, runId=missing),
        ask(subjects.LEDGER_SWEEP_RETRY, runId=run),
        ask(subjects.LEDGER_SWEEP_WAITING),
    ]
    assert {subject for subject, _ in requests} == MOVABLE
    # And what each refuses: fields of the wrong type, a body that is no object, one that is no JSON.
    refused = (b'{"runId": 5, "resourceId": "x", "limit": "x", "module": 5}', b"[]", b"{not json")
    requests += [(subject, payload) for subject in sorted(MOVABLE) for payload in refused]

    answers: dict[str, list[bytes]] = {}
    for table in ("as served", "every fixed subject moved"):
        if table != "as served":
            for subject in MOVABLE:
                other = Served.FASTSTREAM if SERVED[subject] is Served.DISPATCHER else Served.DISPATCHER
                monkeypatch.setitem(request_paths.SERVED, subject, other)
        async with create_app(settings):
            await wait_until_serving(nc)
            health = json.loads((await nc.request(subjects.health("ledger"), b"", timeout=5)).data)
            assert set(health["hot"]) == set(request_paths.served_by(Served.DISPATCHER)), table
            await _asked(nc, requests)  # once before: anything a first asking changes is changed on both
            answers[table] = await _asked(nc, requests)

    as_served, moved = answers.values()
    assert [(subject, payload, a) for (subject, payload), a, b in zip(requests, as_served, moved, strict=True)
            if a != b] == []
    statuses = [json.loads(a).get("status") for a in as_served]
    assert {200, 400, 404, 409} <= set(statuses), statuses  # replies, refusals and misses all compared
