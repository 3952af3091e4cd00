"""Ledger wiring: migrate on start, then answer every subject of the ledger's contract
(docs/contracts.md) in the ``ledger`` queue group. Each change writes its update event as its
run-log entry in its own statement (ADR 0009); the relay publishes it on ``ledger.events.run.<runId>``
into the stream ``LEDGER_EVENTS``. The rules live in the plain modules this file calls."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import asyncpg
import uvloop
from faststream import FastStream, Path
from faststream.nats import NatsBroker
from pydantic import BaseModel

from services.ledger import console, expiry, metrics, migrate, resources, runs, statuses, sweep
from services.ledger.dispatcher import Dispatcher, Handler, HotSubject
from services.ledger.event_stream import declare_events_stream
from services.ledger.hot_subjects import Batching, HotActions
from services.ledger.outbox_relay import OutboxRelay, stop_task
from services.ledger.request_paths import SERVED, Served
from services.ledger.settings import LedgerSettings
from services.ledger.store import UNAVAILABLE, Change, Database, DatabaseUnavailable, LedgerError, is_outage
from shared import replies, subjects
from shared.broker import CountReplies, add_health, error_handlers, make_app, make_broker
from shared.contracts import ledger as c
from shared.database import safe_url
from shared.metrics import serve_metrics
from shared.request_body import decode_body

log = logging.getLogger("shardbus.ledger")

LOOP_FACTORY = uvloop.new_event_loop
"""``shardbus run ledger`` runs on uvloop (measured with the coalesced hot path: bench/ledger.py,
docs/performance.md)."""


def _refused(exc: Exception) -> dict[str, Any]:
    assert isinstance(exc, LedgerError)
    return exc.as_reply()


def _unreachable(exc: Exception) -> dict[str, Any]:
    reason = exc.reason if isinstance(exc, DatabaseUnavailable) else type(exc).__name__
    log.warning("database unreachable", extra={"reason": reason})
    return replies.fail(replies.UNAVAILABLE, UNAVAILABLE)


def _database_error(exc: Exception) -> dict[str, Any]:
    if is_outage(exc):
        return _unreachable(exc)
    log.error("database error", exc_info=exc)
    return replies.fail(500, f"internal database error ({type(exc).__name__}); the ledger logged the details")


ERROR_REPLIES: dict[type[Exception], Callable[[Exception], dict[str, Any]]] = {
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
    replies: dict[tuple[str, int], int] = {}
    broker = make_broker(settings, "ledger", error_replies=ERROR_REPLIES,
                         count_replies=CountReplies(replies, metrics.subject_label))
    app = make_app(broker, "ledger")
    db = Database(settings.database_url, settings.db_pool_size)
    relays: list[OutboxRelay] = []
    watchers: list[asyncio.Task[None]] = []
    # The hot subjects are served on nats-py (dispatcher.py) but documented with the rest: on a
    # broker that is only in the AsyncAPI document, never connected or started.
    document = NatsBroker(settings.nats_servers())
    hot_actions = HotActions(db, Batching(settings.ledger_batch_max, settings.ledger_batches_in_flight))

    def committed(changes: list[Change]) -> None:
        if changes:
            for relay in relays:
                relay.wake()

    hot = register_handlers(broker, db, settings.ledger_concurrency, committed, document, hot_actions)
    dispatcher = Dispatcher(hot, subjects.LEDGER_QUEUE, error_handlers(ERROR_REPLIES),
                            pending_max=settings.ledger_pending_max)
    app.schema.add_broker(document)
    meters = metrics.LedgerMeters(db, dispatcher, hot_actions, relays, replies)
    serve_metrics(app, broker, "ledger", settings, metrics.collector(meters))

    @app.on_startup
    async def bring_schema_forward() -> None:
        if settings.migrate_on_start:
            revision = await migrate.upgrade(settings.database_url)
            log.info("schema ready", extra={"revision": revision,
                                            "database": safe_url(settings.database_url)})
        await db.open()
        meters.loop = asyncio.get_running_loop()
        # Subscribed before FastStream's subscribers (and the health subject) start, so a ledger
        # that answers its health already serves every subject.
        await dispatcher.start(await broker.connect())

    @app.after_startup
    async def relay_events() -> None:
        # Events wait in the run log until the stream takes them: a refusal (permissions, no
        # JetStream) is logged, and the relay keeps trying.
        try:
            await declare_events_stream(broker.connection.jetstream(), settings.jetstream_replicas,
                                        settings.events_duplicate_window_s)
        except Exception as exc:  # noqa: BLE001  (any refusal: the events wait in the run log)
            log.warning("ledger events stream not declared; run events wait in the run log",
                        extra={"stream": subjects.LEDGER_EVENTS_STREAM, "reason": repr(exc)})
        relay = OutboxRelay(db.url, broker.connection)
        relay.start()
        relays.append(relay)

        watchers.append(asyncio.create_task(watch_leases(db, settings.lease_check_period_s),
                                            name="ledger-lease-watch"))

    @app.on_shutdown
    async def stop_serving() -> None:
        await dispatcher.stop()

    @app.on_shutdown
    async def stop_relay() -> None:
        for task in watchers:
            await stop_task(task)
        for relay in relays:
            await relay.stop()

    @app.after_shutdown
    async def close_database() -> None:
        await db.close()

    def details() -> dict[str, Any]:
        return {"hot": {subject: stats.as_dict() for subject, stats in dispatcher.stats.items()},
                "coalescers": hot_actions.stats()}

    add_health(app, broker, "ledger", settings, details)
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
        except Exception as exc:  # noqa: BLE001  (the database away: the next look will tell)
            log.debug("lease check skipped", extra={"reason": type(exc).__name__})
        await asyncio.sleep(period_s)


Answer = tuple[dict[str, Any] | bytes, list[Change]]
"""What a ledger action gives back: the reply's fields (or a whole reply, already encoded) and
the changes it committed (their events are in the run log)."""


def register_handlers(broker: NatsBroker, db: Database, concurrency: int,
                      committed: Callable[[list[Change]], None], document: NatsBroker,
                      hot_actions: HotActions) -> list[HotSubject]:
    """Subscribe every subject of the ledger's contract (``shared.contracts.ledger.CONTRACTS``)
    in the ``ledger`` queue group, each with the contract's request model and handling up to
    ``concurrency`` requests at once (one at a time would make every commit wait for the one
    before it). ``committed`` hears of each request's changes, to wake the outbox relay.

    The subjects ``request_paths.SERVED`` gives the dispatcher are not subscribed here: their
    handlers, the same ones, are returned for it, and declared on ``document`` for the AsyncAPI
    document."""

    def page_bytes() -> int:
        # Pages (console, live rows, claims, runs) fit the connected server's max_payload.
        return console.page_bytes(broker.connection.max_payload)

    async def create_run(body: c.CreateRun) -> Answer:
        run, changes = await runs.create_run(db, body.run_id, body.shard, body.event, body.starts_at, body.ends_at)
        return {"run": run}, changes

    async def run_status(body: c.SetRunStatus) -> Answer:
        run, changes = await runs.set_run_status(db, body.run_id, body.status)
        return {"run": run}, changes

    async def reserve(body: c.AddResource) -> Answer:
        resource, changes = await hot_actions.reserve(body)
        return {"resource": resource}, changes

    async def record(body: c.AddResource) -> Answer:
        resource, changes = await hot_actions.record(body)
        return {"resource": resource}, changes

    async def confirm(body: c.ResourceRef) -> Answer:
        resource, changes = await hot_actions.confirm(body)
        return {"resource": resource}, changes

    async def fail(body: c.FailResource) -> Answer:
        resource, changes = await hot_actions.fail(body)
        return {"resource": resource}, changes

    async def run_console(body: c.Console) -> Answer:
        return await console.console(db, body.run_id, body.after, body.limit, page_bytes()), []

    async def run_log(body: c.RunLogPage) -> Answer:
        return await console.run_log(db, body.run_id, body.after, body.limit, page_bytes()), []

    async def list_runs(body: c.ListRuns) -> Answer:
        return await console.list_runs(db, body, page_bytes()), []

    async def leases_overdue(body: c.LeasesOverdue) -> Answer:
        _, reply = await console.leases_overdue(db, body.limit, page_bytes())
        return reply, []

    async def live(body: c.LiveRows) -> Answer:
        return await console.live(db, body.module, body.limit, body.after, page_bytes()), []

    async def live_modules(body: c.LiveModules) -> Answer:
        return await console.live_modules(db, body.limit), []

    async def settle(body: c.Settle) -> Answer:
        count, changes = await sweep.settle(db)
        return {"settled": count}, changes

    async def candidates(body: c.Candidates) -> Answer:
        return {"runs": await sweep.candidates(db, body.limit)}, []

    async def claim(body: c.Claim) -> Answer:
        run, changes, more = await sweep.claim(db, body.run_id, body.max_attempts, body.limit,
                                               body.claim_timeout_s, page_bytes())
        # Compact and UTF-8 as it is: at most the bytes the claim measured (its page budget).
        return json.dumps(replies.ok(resources=[change.resource for change in changes], shard=run["shard"],
                                     more=more), separators=(",", ":"), ensure_ascii=False).encode(), changes

    async def reverted(body: c.ResourceRef) -> Answer:
        resource, changes = await hot_actions.outcome(body.resource_id, statuses.SWEEP_REVERTED, None)
        return {"resource": resource}, changes

    async def drifted(body: c.Drifted) -> Answer:
        resource, changes = await hot_actions.outcome(body.resource_id, statuses.SWEEP_DRIFTED, body.error)
        return {"resource": resource}, changes

    async def failed(body: c.SweepFailed) -> Answer:
        resource, changes = await hot_actions.outcome(body.resource_id, statuses.SWEEP_FAILED[body.transient],
                                                      body.error)
        return {"resource": resource}, changes

    async def record_outcomes(body: c.SweepOutcomes) -> Answer:
        result, changes = await sweep.outcomes(
            db, [(o.resource_id, o.verdict, o.error) for o in body.outcomes],
            body.away_backoff_s, body.away_backoff_max_s)
        return result, changes

    async def finish(body: c.Finish) -> Answer:
        run, changes = await sweep.finish(db, body.run_id, body.max_attempts, body.summary)
        return {"run": run}, changes

    async def retry(body: c.RunRef) -> Answer:
        run, changes = await sweep.retry(db, body.run_id)
        return {"run": run}, changes

    async def waiting(body: c.Waiting) -> Answer:
        found, more = await sweep.waiting(db, body.limit, body.run_id, body.longer_than_s)
        return {"runs": found, "more": more}, []

    actions: dict[str, Callable[[Any], Awaitable[Answer]]] = {
        subjects.LEDGER_RUN_CREATE: create_run, subjects.LEDGER_RUN_STATUS: run_status,
        subjects.LEDGER_RESOURCE_RESERVE: reserve, subjects.LEDGER_RESOURCE_RECORD: record,
        subjects.LEDGER_RESOURCE_CONFIRM: confirm, subjects.LEDGER_RESOURCE_FAIL: fail,
        subjects.LEDGER_CONSOLE: run_console, subjects.LEDGER_LOG: run_log, subjects.LEDGER_RUNS: list_runs,
        subjects.LEDGER_LEASES_OVERDUE: leases_overdue, subjects.LEDGER_LIVE: live,
        subjects.LEDGER_LIVE_MODULES: live_modules, subjects.LEDGER_SWEEP_SETTLE: settle,
        subjects.LEDGER_SWEEP_CANDIDATES: candidates, subjects.LEDGER_SWEEP_CLAIM: claim,
        subjects.LEDGER_SWEEP_REVERTED: reverted, subjects.LEDGER_SWEEP_DRIFTED: drifted,
        subjects.LEDGER_SWEEP_FAILED: failed, subjects.LEDGER_SWEEP_OUTCOMES: record_outcomes,
        subjects.LEDGER_SWEEP_FINISH: finish, subjects.LEDGER_SWEEP_RETRY: retry,
        subjects.LEDGER_SWEEP_WAITING: waiting,
    }

    def subscribe(subject: str, handler: Callable[..., Awaitable[Any]]) -> None:
        # decode_body: a body Python's json cannot read (too deep, a 5,000-digit integer) is a
        # 400 naming the field or the body, not a 500.
        broker.subscriber(subject, queue=subjects.LEDGER_QUEUE, max_workers=concurrency,
                          decoder=decode_body)(handler)

    hot: list[HotSubject] = []
    for contract in c.CONTRACTS:
        if "{" in contract.subject:
            continue  # the module-token subjects below take the module from the subject
        handler = answering(actions.pop(contract.subject), contract.request, committed)
        if SERVED[contract.subject] is Served.DISPATCHER:
            hot.append(HotSubject(contract.subject, contract.request, handler))
            document.subscriber(contract.subject, queue=subjects.LEDGER_QUEUE)(handler)
        else:
            subscribe(contract.subject, handler)
    if actions:  # pragma: no cover - an action no contract names would never be subscribed
        raise RuntimeError(f"ledger actions without a contract: {sorted(actions)}")

    async def expired(body: Any, module: str = Path()) -> dict[str, Any]:
        # Read leniently (docs/ledger.md, "Expiry"): a malformed expiry answers {expired: 0}, writes nothing.
        count, changes = await expiry.expire(db, module, body)
        committed(changes)
        return replies.ok(expired=count)

    async def reconcile(body: c.Reconcile, module: str = Path()) -> dict[str, Any]:
        if not c.is_module_name(module):
            return replies.fail(HTTPStatus.BAD_REQUEST, f"module {module!r} in the subject is not a module name")
        count, changes = await resources.reconcile(db, module, body.run_id, body.kind, body.present)
        committed(changes)
        return replies.ok(orphaned=count)

    # The annotations as objects, not this module's postponed strings: FastStream resolves a
    # string against the namespace of whoever builds the app (a caller's ``c`` shadowed ours).
    expired.__annotations__ = {"body": Any, "module": str, "return": dict[str, Any]}
    reconcile.__annotations__ = {"body": c.Reconcile, "module": str, "return": dict[str, Any]}
    subscribe(subjects.LEDGER_EXPIRED_PATTERN, expired)
    subscribe(subjects.LEDGER_RECONCILE_PATTERN, reconcile)
    return hot


def answering(action: Callable[[Any], Awaitable[Answer]], request: type[BaseModel],
              committed: Callable[[list[Change]], None]) -> Handler:
    """The handler of one subject: validate the body with the contract's ``request`` model,
    act, tell ``committed`` what changed, reply 200 with the action's fields. Named after the
    action (the AsyncAPI document's channel names come from it)."""

    async def handler(body: Any) -> dict[str, Any] | bytes:
        result, changes = await action(body)
        committed(changes)
        return replies.ok(**result) if isinstance(result, dict) else result

    handler.__name__ = handler.__qualname__ = action.__name__
    # FastStream validates the body against the annotation (and documents it): the contract's model.
    handler.__annotations__ = {"body": request, "return": dict[str, Any] | bytes}
    return handler
