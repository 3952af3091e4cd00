"""The hot subjects' nats-py path (services/ledger/serving/dispatcher.py) keeps the FastStream path's
promises: bounded (over ``ledger_pending_max`` a request is answered 503 at once and changes
nothing), a message not sent directly is neither handled nor answered, and a stopping ledger
answers the requests under way."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from services.ledger.app import create_app
from services.ledger.serving.dispatcher import BUSY
from services.ledger.settings import LedgerSettings
from shared import subjects
from tests.ledger.conftest import LedgerClient, wait_until_serving
from tests.ledger.test_outage import row_locked, wait_blocked_on_lock


def _reserve(run: str, ref: str) -> bytes:
    return json.dumps({"runId": run, "module": "world", "kind": "creature", "ref": ref,
                       "idempotencyKey": f"{run}:{ref}"}).encode()


@pytest.mark.timeout(60)
async def test_requests_over_the_pending_limit_are_answered_busy_at_once_and_change_nothing(nats_url, nc, ledger_db,
                                                                                             db, unique):
    run = f"busy-{unique}"
    app = create_app(LedgerSettings(nats_url=nats_url, database_url=ledger_db, migrate_on_start=False,
                                    ledger_pending_max=2))
    async with app:
        await wait_until_serving(nc)
        client = LedgerClient(nc, timeout=10.0)
        await client.run(run, "running")
        async with row_locked(ledger_db, run):  # the reservations wait on the run's row
            asking = [asyncio.create_task(nc.request(subjects.LEDGER_RESOURCE_RESERVE, _reserve(run, f"r{n}"),
                                                     timeout=10)) for n in range(5)]
            await wait_blocked_on_lock(db)
            done, _ = await asyncio.wait(asking, timeout=5, return_when=asyncio.ALL_COMPLETED)
            busy = [json.loads(t.result().data) for t in done]
            assert len(busy) == 3, "requests over the limit were not answered at once"
            assert all(r == {"status": 503, "error": BUSY.format(n=2, subject=subjects.LEDGER_RESOURCE_RESERVE)}
                       for r in busy), busy
        answered = [json.loads((await t).data) for t in asking if t not in done]
        assert [r["status"] for r in answered] == [200, 200]
        assert await db.fetchval("SELECT count(*) FROM resources WHERE run_id = $1", run) == 2
        health = json.loads((await nc.request(subjects.health("ledger"), b"", timeout=5)).data)
        assert health["hot"][subjects.LEDGER_RESOURCE_RESERVE]["busy"] == 3


async def test_a_hot_subject_ignores_a_message_carrying_a_jetstream_status(ledger, nc, db, unique):
    """What a push consumer's heartbeat looks like (shared/delivery.py): neither handled nor answered."""
    run = f"direct-{unique}"
    await ledger.run(run, "running")
    inbox = nc.new_inbox()
    heard = await nc.subscribe(inbox)
    await nc.publish(subjects.LEDGER_RESOURCE_RECORD, _reserve(run, "sneaky"), reply=inbox, headers={"Status": "100"})
    await nc.flush()
    with pytest.raises(nats.errors.TimeoutError):
        await heard.next_msg(timeout=0.5)
    # The same request sent directly is answered: the refusal was the reply subject, not the body.
    assert (await ledger.ask(subjects.LEDGER_RESOURCE_RECORD, **json.loads(_reserve(run, "plain"))))["status"] == 200
    assert [r["ref"] for r in await db.fetch("SELECT ref FROM resources WHERE run_id = $1", run)] == ["plain"]
    health = json.loads((await nc.request(subjects.health("ledger"), b"", timeout=5)).data)
    assert health["hot"][subjects.LEDGER_RESOURCE_RECORD]["refused"] == 1


@pytest.mark.timeout(60)
async def test_a_hot_request_under_way_when_the_ledger_stops_is_answered(nats_url, nc, ledger_db, db, unique):
    run = f"stop-{unique}"
    app = create_app(LedgerSettings(nats_url=nats_url, database_url=ledger_db, migrate_on_start=False))
    await app.start()
    stopping = None
    try:
        await wait_until_serving(nc)
        await LedgerClient(nc).run(run, "running")
        async with row_locked(ledger_db, run):
            asking = asyncio.create_task(nc.request(subjects.LEDGER_RESOURCE_RESERVE, _reserve(run, "r"), timeout=10))
            await wait_blocked_on_lock(db)
            stopping = asyncio.create_task(app.stop())
            await asyncio.sleep(0.3)
            assert not asking.done(), "the stop did not wait for the request under way"
        reply = json.loads((await asyncio.wait_for(asking, 8)).data)
        assert reply["status"] == 200 and reply["resource"]["ref"] == "r"
        await asyncio.wait_for(stopping, 10)
    finally:
        if stopping is None:
            await app.stop()
    with pytest.raises(nats.errors.NoRespondersError):
        await nc.request(subjects.LEDGER_RESOURCE_RESERVE, _reserve(run, "after"), timeout=2)
