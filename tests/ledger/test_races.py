"""Races: every transition is one guarded statement, so two clients — or two ledger
replicas — racing on one row cannot both change it. Two asking the same transition of one row
are both answered with the row (the second is a replay, statuses.is_replay); exactly one
changed it, with one log entry and one event."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from services.ledger import resources, runs, statuses
from services.ledger.app import create_app
from services.ledger.database.store import Database
from services.ledger.settings import LedgerSettings
from shared import subjects
from tests.ledger.conftest import LedgerClient, none_waiting, wait_until_serving

ROUNDS = 200


async def test_two_confirms_racing_on_one_row_exactly_one_changes_it_every_round(ledger_db, unique):
    """Straight at the database: two concurrent transactions per round, 200 rounds."""
    db_pool = Database(ledger_db, pool_size=4)
    await db_pool.open()
    try:
        await runs.create_run(db_pool, f"r{unique}", "uo1", "invasion")
        await runs.set_run_status(db_pool, f"r{unique}", "running")
        for round_ in range(ROUNDS):
            row, _ = await resources.add_resource(
                db_pool, run_id=f"r{unique}", module="world", kind="creature", ref=f"c{round_}",
                idempotency_key=f"k{round_}", revert={}, lease_deadline=None, confirmed=False)
            outcomes = await asyncio.gather(
                *(resources.transition(db_pool, row["resourceId"], statuses.CONFIRM) for _ in range(2)),
                return_exceptions=True)
            assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
            changed = [changes for _, changes in outcomes if changes]
            assert len(changed) == 1 and len(changed[0]) == 1, outcomes
            assert {resource["status"] for resource, _ in outcomes} == {"confirmed"}
    finally:
        await db_pool.close()


async def _published(client: LedgerClient, run: str, kind: str) -> int:
    """Events of ``kind`` the stream holds for the run (once the outbox has drained)."""
    js = client.nc.jetstream()
    subject = subjects.ledger_run_events(run)
    sub = await js.subscribe(subject, stream=subjects.LEDGER_EVENTS_STREAM, ordered_consumer=True)
    count = 0
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1)
            except nats.errors.TimeoutError:
                return count
            count += json.loads(msg.data)["type"] == kind
    finally:
        await sub.unsubscribe()


@pytest.fixture
async def two_ledgers(nats_url, ledger_db):
    """Two ledgers in the same queue group on one database, and two independent clients."""
    apps = [create_app(LedgerSettings(nats_url=nats_url, database_url=ledger_db, db_pool_size=4))
            for _ in range(2)]
    clients = [await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=3) for _ in range(2)]
    try:
        async with apps[0], apps[1]:
            await wait_until_serving(clients[0])
            yield [LedgerClient(c) for c in clients]
    finally:
        for client in clients:
            await client.close()


async def test_two_clients_racing_over_nats_on_one_row_make_one_transition_every_round(two_ledgers, db, unique):
    alice, bob = two_ledgers
    run = f"r{unique}"
    await alice.run(run, "running")
    for round_ in range(ROUNDS):
        row = (await alice.record(run, f"c{round_}", reserve=True))["resource"]
        replies = await asyncio.gather(
            alice.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=row["resourceId"]),
            bob.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=row["resourceId"]))
        assert [r["status"] for r in replies] == [200, 200] and replies[0] == replies[1], replies
    assert await db.fetchval("SELECT count(*) FROM run_log WHERE kind = 'resource.confirmed'") == ROUNDS
    assert await none_waiting(db)  # the relay publishes within moments
    assert await _published(alice, run, "resource.confirmed") == ROUNDS


async def test_two_reservations_of_one_target_racing_exactly_one_holds_it(two_ledgers, db, unique):
    alice, bob = two_ledgers
    await alice.run(f"a{unique}", "running")
    await alice.run(f"b{unique}", "running")
    for round_ in range(ROUNDS // 2):
        replies = await asyncio.gather(
            alice.record(f"a{unique}", f"t{round_}", kind="lease", reserve=True),
            bob.record(f"b{unique}", f"t{round_}", kind="lease", reserve=True))
        assert sorted(r["status"] for r in replies) == [200, 409], replies
    assert await db.fetchval("SELECT count(*) FROM resources") == ROUNDS // 2


async def test_two_sweepers_claiming_one_run_never_take_the_same_row(two_ledgers, db, unique):
    alice, bob = two_ledgers
    run = f"r{unique}"
    await alice.run(run, "running")
    for i in range(60):
        await alice.record(run, f"c{i}")
    await alice.ask(subjects.LEDGER_RUN_STATUS, runId=run, status="completed")
    taken: list[int] = []
    for _ in range(10):
        replies = await asyncio.gather(*(client.ask(subjects.LEDGER_SWEEP_CLAIM, runId=run, maxAttempts=3, limit=4)
                                         for client in (alice, bob)))
        taken += [r["resourceId"] for reply in replies for r in reply["resources"]]
    assert len(taken) == len(set(taken)) == 60
    assert await db.fetchval("SELECT count(*) FROM run_log WHERE kind = 'cleanup.claimed'") == 60


async def test_the_same_record_retried_twice_at_once_returns_one_row_to_both(two_ledgers, db, unique):
    alice, bob = two_ledgers
    await alice.run(f"r{unique}", "running")
    for round_ in range(ROUNDS // 2):
        replies = await asyncio.gather(alice.record(f"r{unique}", f"c{round_}", key=f"k{round_}"),
                                       bob.record(f"r{unique}", f"c{round_}", key=f"k{round_}"))
        assert [r["status"] for r in replies] == [200, 200], replies
        assert replies[0]["resource"]["resourceId"] == replies[1]["resource"]["resourceId"]
    assert await db.fetchval("SELECT count(*) FROM resources") == ROUNDS // 2


def test_two_ledger_processes_serve_the_same_requests_without_a_double_transition(services, ledger_db, nats_url,
                                                                                unique):
    """Two real replicas (``shardbus run ledger``): every row is confirmed exactly once
    however many clients ask at once — each asker is answered 200 with the confirmed row (the
    same transition asked again is a replay, statuses.is_replay), one log entry per row — and
    both replicas are up in the queue group."""
    replicas = [services.start("ledger", database_url=ledger_db, migrate_on_start="true") for _ in range(2)]

    async def scenario() -> None:
        clients = [await nats.connect(nats_url, connect_timeout=5) for _ in range(4)]
        try:
            await wait_until_serving(clients[0])
            asker = [LedgerClient(c) for c in clients]
            run = f"r{unique}"
            await asker[0].run(run, "running")
            rows = [(await asker[0].record(run, f"c{i}", reserve=True))["resource"]["resourceId"] for i in range(50)]
            replies = await asyncio.gather(*(a.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=r)
                                             for r in rows for a in asker))
            assert {(r["status"], r["resource"]["status"]) for r in replies} == {(200, "confirmed")}
            confirmed = await clients[2].request(subjects.LEDGER_LOG,
                                                 json.dumps({"runId": run, "limit": 1000}).encode(), timeout=5)
            kinds = [entry["kind"] for entry in json.loads(confirmed.data)["entries"]]
            assert kinds.count("resource.confirmed") == len(rows)
            pids = set()
            for _ in range(20):
                pids.add(json.loads((await clients[1].request(subjects.health("ledger"), b"", timeout=3)).data)["pid"])
            assert pids == {p.proc.pid for p in replicas}
        finally:
            for client in clients:
                await client.close()

    asyncio.run(scenario())
    for replica in replicas:
        assert services.stop(replica) == 0, replica.log()[-2000:]
