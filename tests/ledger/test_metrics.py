"""The ledger's /metrics (services/ledger/metrics.py): the app as ``shardbus run ledger`` builds it,
scraped over HTTP while requests, hot transitions and outbox events happen."""

from __future__ import annotations

import asyncio

from services.ledger.app import create_app
from services.ledger.settings import LedgerSettings
from shardbus.embedded import free_port
from shared import subjects
from tests.ledger.conftest import LedgerClient, wait_until_serving
from tests.scrape import label_values, names, scrape, value

REQUESTS = "shardbus_ledger_requests_total"


async def test_requests_transitions_and_events_move_their_series(nats_url, nc, ledger_db, unique) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    run = f"metrics-{unique}"
    app = create_app(LedgerSettings(nats_url=nats_url, database_url=ledger_db, migrate_on_start=False,
                                    db_pool_size=4, metrics_port=port))
    async with app:
        await wait_until_serving(nc)
        ledger = LedgerClient(nc)
        before = await scrape(url)
        assert value(before, "shardbus_nats_connected", service="ledger") == 1

        await ledger.run(run, "running")  # create (FastStream path), then status
        recorded = await asyncio.gather(*(ledger.record(run, f"r{n}", reserve=True) for n in range(4)))
        ids = [r["resource"]["resourceId"] for r in recorded]
        for rid in ids:
            assert (await ledger.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=rid))["status"] == 200
        assert (await ledger.ask(subjects.LEDGER_RESOURCE_CONFIRM, resourceId=424242))["status"] == 404
        assert (await ledger.raw(subjects.LEDGER_RUN_CREATE, b'{"runId": 5}'))["status"] == 400
        # A module token no ledger knows: counted under the subject's pattern, never by its name.
        assert (await ledger.raw(subjects.ledger_expired("zz_hostile_module"), b"{}"))["status"] == 200

        async with asyncio.timeout(10):  # the relay publishes the run's events
            while True:
                after = await scrape(url)
                if value(after, "shardbus_ledger_events_published_total") >= \
                        value(before, "shardbus_ledger_events_published_total") + 6:
                    break
                await asyncio.sleep(0.05)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta(REQUESTS, subject=subjects.LEDGER_RUN_CREATE, status="200") == 1
    assert delta(REQUESTS, subject=subjects.LEDGER_RUN_CREATE, status="400") == 1
    assert delta(REQUESTS, subject=subjects.LEDGER_RUN_STATUS, status="200") == 1
    assert delta(REQUESTS, subject=subjects.LEDGER_RESOURCE_RESERVE, status="200") == 4
    assert delta(REQUESTS, subject=subjects.LEDGER_RESOURCE_CONFIRM, status="200") == 4
    assert delta(REQUESTS, subject=subjects.LEDGER_RESOURCE_CONFIRM, status="404") == 1
    assert delta(REQUESTS, subject=subjects.LEDGER_EXPIRED_PATTERN, status="200") == 1
    assert not any("zz_hostile_module" in s for s in label_values(after, REQUESTS, "subject"))
    # Every request of the hot subjects went through a statement of its coalescer.
    assert delta("shardbus_ledger_batch_size_sum", action="reserve") == 4
    assert delta("shardbus_ledger_batch_size_count", action="confirm") >= 1
    assert {"shardbus_ledger_outbox_pending", "shardbus_ledger_relay_lag_seconds"} <= names(after)
    assert value(after, "shardbus_ledger_pool_connections", state="in_use") + \
        value(after, "shardbus_ledger_pool_connections", state="idle") >= 1
