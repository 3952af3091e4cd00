"""Ledger wiring: migrate on start, then answer every subject of the ledger's contract
(docs/contracts.md) in the ``ledger`` queue group. Each change writes its update event to the
outbox in its own statement; the outbox relay publishes it on ``ledger.events.run.<runId>``
into the stream ``LEDGER_EVENTS``. The rules live in the plain modules this file calls."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from faststream import FastStream, Path
from faststream.nats import NatsBroker

from services.ledger import console, expiry, migrate, resources, runs, statuses, sweep
from services.ledger import requests as rq
from services.ledger.event_stream import declare_events_stream
from services.ledger.outbox_relay import OutboxRelay, stop_task
from services.ledger.settings import LedgerSettings
from services.ledger.store import Change, Database, DatabaseUnavailable, LedgerError, is_outage
from shared import replies, subjects
from shared.broker import add_health, make_app, make_broker
from shared.database import safe_url

log = logging.getLogger("shardbus.ledger")

UNAVAILABLE = "the ledger's database is unreachable; retry shortly"
"""The 503 sentence (no URL: it could carry a password)."""


def _refused(exc: Exception) -> dict[str, Any]:
    assert isinstance(exc, LedgerError)
    return replies.fail(exc.status, str(exc))


def _unreachable(exc: Exception) -> dict[str, Any]:
    reason = exc.reason if isinstance(exc, DatabaseUnavailable) else type(exc).__name__
    log.warning("database unreachable", extra={"reason": reason})
    return replies.fail(replies.UNAVAILABLE, UNAVAILABLE)


def _database_error(exc: Exception) -> dict[str, Any]:
    if is_outage(exc):
        return _unreachable(exc)
    log.error("database error", exc_info=exc)
    return replies.fail(500, f"internal database error ({type(exc).__name__}); the ledger logged the details")


ERROR_REPLIES = {
    LedgerError: _refused,
    # Every outage met inside ``db.connect()`` arrives as DatabaseUnavailable (store.py lists
    # the shapes); the rest of the map catches one raised anywhere else.
    DatabaseUnavailable: _unreachable,
    OSError: _unreachable,  # refused, reset, lost; TimeoutError (acquire, connect, statement) is one
    asyncpg.InterfaceError: _unreachable,
    asyncpg.InternalClientError: _unreachable,  # a connection that died mid-protocol
    asyncpg.PostgresConnectionError: _unreachable,
    asyncpg.PostgresError: _database_error,  # 503 for store.OUTAGE_SQLSTATES (57P01, 57014 …), else 500
}
"""How the ledger's own failures are answered (the shared middleware picks the most specific)."""


def create_app(settings: LedgerSettings | None = None) -> FastStream:
    """The ledger as a FastStream app: run it with ``shardbus run ledger``."""
    settings = settings or LedgerSettings()
    broker = make_broker(settings, "ledger", error_replies=ERROR_REPLIES)
    app = make_app(broker, "ledger")
    db = Database(settings.database_url, settings.db_pool_size)
    relays: list[OutboxRelay] = []
    watchers: list[asyncio.Task[None]] = []

    @app.on_startup
    async def bring_schema_forward() -> None:
        if settings.migrate_on_start:
            revision = await migrate.upgrade(settings.database_url)
            log.info("schema ready", extra={"revision": revision,
                                            "database": safe_url(settings.database_url)})
        await db.open()

    @app.after_startup
    async def relay_events() -> None:
        # Events wait in the outbox until the stream takes them: a refusal (permissions, no
        # JetStream) is logged, and the relay keeps trying.
        try:
            await declare_events_stream(broker.connection.jetstream(), settings.jetstream_replicas,
                                        settings.events_duplicate_window_s)
        except Exception as exc:
            log.warning("ledger events stream not declared; run events wait in the outbox",
                        extra={"stream": subjects.LEDGER_EVENTS_STREAM, "reason": repr(exc)})
        relay = OutboxRelay(db.url, broker.connection)
        relay.start()
        relays.append(relay)

        watchers.append(asyncio.create_task(watch_leases(db, settings.lease_check_period_s),
                                            name="ledger-lease-watch"))

    @app.on_shutdown
    async def stop_relay() -> None:
        for task in watchers:
            await stop_task(task)
        for relay in relays:
            await relay.stop()

    @app.after_shutdown
    async def close_database() -> None:
        await db.close()

    def committed(changes: list[Change]) -> None:
        if changes:
            for relay in relays:
                relay.wake()

    register_handlers(broker, db, settings.ledger_concurrency, committed)
    add_health(app, broker, "ledger", settings)
    return app


async def watch_leases(db: Database, period_s: float) -> None:
    """At start and every ``period_s``: leases still ``confirmed`` after their deadline (the
    shard should have let them go while nobody watched) are logged when their number changes.
    The console flags each row (``leaseDeadlinePassed``); ``ledger.leases.overdue`` lists them."""
    seen = 0
    while True:
        try:
            count, _ = await console.leases_overdue(db, 1)
            if count and count != seen:
                log.warning("leases past their deadline, still confirmed", extra={"count": count})
            elif seen and not count:
                log.info("no lease is past its deadline any more")
            seen = count
        except Exception as exc:  # the database away: the next look will tell
            log.debug("lease check skipped", extra={"reason": type(exc).__name__})
        await asyncio.sleep(period_s)


def register_handlers(broker: NatsBroker, db: Database, concurrency: int,
                      committed: Callable[[list[Change]], None]) -> None:
    """Subscribe every ledger subject in the ``ledger`` queue group, each handling up to
    ``concurrency`` requests at once (one at a time would make every commit wait for the
    one before it). ``committed`` hears of each request's changes (their events are already
    in the outbox)."""

    def subscriber(subject: str):  # noqa: ANN202  (FastStream's decorator)
        # rq.decode_body: a body Python's json cannot read (too deep, a 5,000-digit integer)
        # is a 400 naming the field or the body, not a 500.
        return broker.subscriber(subject, queue=subjects.LEDGER_QUEUE, max_workers=concurrency,
                                 decoder=rq.decode_body)

    def page_bytes() -> int:
        # Pages (console, live rows, claims, runs) fit the connected server's max_payload.
        return console.page_bytes(broker.connection.max_payload)

    @subscriber(subjects.LEDGER_RUN_CREATE)
    async def create_run(body: rq.CreateRun) -> dict[str, Any]:
        run, changes = await runs.create_run(db, body.run_id, body.shard, body.event, body.starts_at, body.ends_at)
        committed(changes)  # their events are in the outbox: wake the relay
        return replies.ok(run=run)

    @subscriber(subjects.LEDGER_RUN_STATUS)
    async def run_status(body: rq.SetRunStatus) -> dict[str, Any]:
        run, changes = await runs.set_run_status(db, body.run_id, body.status)
        committed(changes)
        return replies.ok(run=run)

    async def add(body: rq.AddResource, confirmed: bool) -> dict[str, Any]:
        resource, changes = await resources.add_resource(
            db, run_id=body.run_id, module=body.module, kind=body.kind, ref=body.ref,
            idempotency_key=body.idempotency_key, revert=body.revert, lease_deadline=body.lease_deadline,
            confirmed=confirmed)
        committed(changes)
        return replies.ok(resource=resource)

    @subscriber(subjects.LEDGER_RESOURCE_RESERVE)
    async def reserve(body: rq.AddResource) -> dict[str, Any]:
        return await add(body, confirmed=False)

    @subscriber(subjects.LEDGER_RESOURCE_RECORD)
    async def record(body: rq.AddResource) -> dict[str, Any]:
        return await add(body, confirmed=True)

    @subscriber(subjects.LEDGER_RESOURCE_CONFIRM)
    async def confirm(body: rq.ResourceRef) -> dict[str, Any]:
        resource, changes = await resources.transition(db, body.resource_id, statuses.CONFIRM)
        committed(changes)
        return replies.ok(resource=resource)

    @subscriber(subjects.LEDGER_RESOURCE_FAIL)
    async def fail(body: rq.FailResource) -> dict[str, Any]:
        resource, changes = await resources.transition(db, body.resource_id, statuses.FAIL, body.error)
        committed(changes)
        return replies.ok(resource=resource)

    @subscriber(subjects.LEDGER_EXPIRED_PATTERN)
    async def expired(body: Any, module: str = Path()) -> dict[str, Any]:
        count, changes = await expiry.expire(db, module, body)
        committed(changes)
        return replies.ok(expired=count)

    @subscriber(subjects.LEDGER_RECONCILE_PATTERN)
    async def reconcile(body: rq.Reconcile, module: str = Path()) -> dict[str, Any]:
        if not rq.is_module_name(module):
            return replies.fail(replies.BAD_REQUEST, f"module {module!r} in the subject is not a module name")
        count, changes = await resources.reconcile(db, module, body.run_id, body.kind, body.present)
        committed(changes)
        return replies.ok(orphaned=count)

    @subscriber(subjects.LEDGER_CONSOLE)
    async def run_console(body: rq.Console) -> bytes:
        return await console.console(db, body.run_id, body.after, body.limit, page_bytes())

    @subscriber(subjects.LEDGER_LOG)
    async def run_log(body: rq.RunLogPage) -> bytes:
        return await console.run_log(db, body.run_id, body.after, body.limit, page_bytes())

    @subscriber(subjects.LEDGER_RUNS)
    async def list_runs(body: rq.ListRuns) -> bytes:
        return await console.list_runs(db, body, page_bytes())

    @subscriber(subjects.LEDGER_LEASES_OVERDUE)
    async def leases_overdue(body: rq.LeasesOverdue) -> bytes:
        _, reply = await console.leases_overdue(db, body.limit, page_bytes())
        return reply

    @subscriber(subjects.LEDGER_LIVE)
    async def live(body: rq.LiveRows) -> bytes:
        return await console.live(db, body.module, body.limit, body.after, page_bytes())

    @subscriber(subjects.LEDGER_LIVE_MODULES)
    async def live_modules(body: rq.LiveModules) -> bytes:
        return await console.live_modules(db, body.limit)

    @subscriber(subjects.LEDGER_SWEEP_SETTLE)
    async def settle(body: rq.Settle) -> dict[str, Any]:
        count, changes = await sweep.settle(db)
        committed(changes)
        return replies.ok(settled=count)

    @subscriber(subjects.LEDGER_SWEEP_CANDIDATES)
    async def candidates(body: rq.Candidates) -> dict[str, Any]:
        return replies.ok(runs=await sweep.candidates(db, body.limit))

    @subscriber(subjects.LEDGER_SWEEP_CLAIM)
    async def claim(body: rq.Claim) -> bytes:
        run, changes, more = await sweep.claim(db, body.run_id, body.max_attempts, body.limit,
                                               body.claim_timeout_s, page_bytes())
        committed(changes)
        # Compact and UTF-8 as it is: at most the bytes the claim measured (its page budget).
        return json.dumps(replies.ok(resources=[change.resource for change in changes], shard=run["shard"],
                                     more=more), separators=(",", ":"), ensure_ascii=False).encode()

    @subscriber(subjects.LEDGER_SWEEP_REVERTED)
    async def reverted(body: rq.ResourceRef) -> dict[str, Any]:
        resource, changes = await sweep.reverted(db, body.resource_id)
        committed(changes)
        return replies.ok(resource=resource)

    @subscriber(subjects.LEDGER_SWEEP_DRIFTED)
    async def drifted(body: rq.Drifted) -> dict[str, Any]:
        resource, changes = await sweep.drifted(db, body.resource_id, body.error)
        committed(changes)
        return replies.ok(resource=resource)

    @subscriber(subjects.LEDGER_SWEEP_FAILED)
    async def failed(body: rq.SweepFailed) -> dict[str, Any]:
        resource, changes = await sweep.failed(db, body.resource_id, body.error, body.transient)
        committed(changes)
        return replies.ok(resource=resource)

    @subscriber(subjects.LEDGER_SWEEP_OUTCOMES)
    async def record_outcomes(body: rq.SweepOutcomes) -> dict[str, Any]:
        result, changes = await sweep.outcomes(
            db, [(o.resource_id, o.verdict, o.error) for o in body.outcomes],
            body.away_backoff_s, body.away_backoff_max_s)
        committed(changes)
        return replies.ok(**result)

    @subscriber(subjects.LEDGER_SWEEP_FINISH)
    async def finish(body: rq.Finish) -> dict[str, Any]:
        run, changes = await sweep.finish(db, body.run_id, body.max_attempts, body.summary)
        committed(changes)
        return replies.ok(run=run)

    @subscriber(subjects.LEDGER_SWEEP_RETRY)
    async def retry(body: rq.RunRef) -> dict[str, Any]:
        run, changes = await sweep.retry(db, body.run_id)
        committed(changes)
        return replies.ok(run=run)

    @subscriber(subjects.LEDGER_SWEEP_WAITING)
    async def waiting(body: rq.Waiting) -> dict[str, Any]:
        found, more = await sweep.waiting(db, body.limit)
        return replies.ok(runs=found, more=more)
