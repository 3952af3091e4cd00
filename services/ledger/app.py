"""Ledger wiring: migrate on start, then answer every subject of the ledger's contract
(docs/contracts.md) in the ``ledger`` queue group. Each change writes its update event as its
run-log entry in its own statement (ADR 0009); the relay publishes it on ``ledger.events.run.<runId>``
into the stream ``LEDGER_EVENTS``. The rules live in the plain modules this file calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import uvloop
from faststream import FastStream, Path
from faststream.nats import NatsBroker
from pydantic import BaseModel

from services.ledger import console, metrics
from services.ledger.database import migrate
from services.ledger.database.engine import safe_url
from services.ledger.database.store import UNAVAILABLE, Change, Database, DatabaseUnavailable, LedgerError, is_outage
from services.ledger.events.event_stream import declare_events_stream
from services.ledger.events.outbox_relay import OutboxRelay, stop_task
from services.ledger.serving import actions
from services.ledger.serving.actions import Reach
from services.ledger.serving.dispatcher import Dispatcher, Handler, HotSubject
from services.ledger.serving.hot_subjects import Batching, HotActions
from services.ledger.serving.request_paths import SERVED, Served
from services.ledger.settings import LedgerSettings
from shared import replies, subjects
from shared.broker import make_app, make_broker
from shared.contracts import ledger as c
from shared.error_replies import error_handlers
from shared.health import add_health
from shared.metrics import serve_metrics
from shared.middlewares import CountReplies
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
    ledger = LedgerService(broker, settings)
    # The hot subjects are served on nats-py (dispatcher.py) but documented with the rest: on a
    # broker that is only in the AsyncAPI document, never connected or started.
    document = NatsBroker(settings.nats_servers())
    reach = Reach(ledger.db, ledger.hot_actions, lambda: broker.connection.max_payload)
    hot = register_handlers(broker, reach, settings.ledger_concurrency, ledger.committed, document)
    ledger.dispatcher = Dispatcher(hot, subjects.LEDGER_QUEUE, error_handlers(ERROR_REPLIES),
                                   pending_max=settings.ledger_pending_max)
    app.schema.add_broker(document)
    ledger.meters = metrics.LedgerMeters(ledger.db, ledger.dispatcher, ledger.hot_actions, ledger.relays, replies)
    serve_metrics(app, broker, "ledger", settings, metrics.collector(ledger.meters))
    app.on_startup(ledger.bring_schema_forward)
    app.after_startup(ledger.relay_events)
    app.on_shutdown(ledger.stop_serving)
    app.on_shutdown(ledger.stop_relay)
    app.after_shutdown(ledger.db.close)
    add_health(app, broker, "ledger", settings, ledger.details)
    return app


class LedgerService:
    """One ledger process's life: the schema brought forward and the hot subjects subscribed at
    start, the outbox relay and the lease watch after it, each stopped in turn at the end."""

    dispatcher: Dispatcher
    meters: metrics.LedgerMeters

    def __init__(self, broker: NatsBroker, settings: LedgerSettings) -> None:
        self.broker, self.settings = broker, settings
        self.db = Database(settings.database_url, settings.db_pool_size)
        self.hot_actions = HotActions(self.db, Batching(settings.ledger_batch_max, settings.ledger_batches_in_flight))
        self.relays: list[OutboxRelay] = []
        self.watchers: list[asyncio.Task[None]] = []

    def committed(self, changes: list[Change]) -> None:
        """A request committed ``changes``: their events wait in the run log; wake the relay."""
        if changes:
            for relay in self.relays:
                relay.wake()

    async def bring_schema_forward(self) -> None:
        settings = self.settings
        if settings.migrate_on_start:
            revision = await migrate.upgrade(settings.database_url)
            log.info("schema ready", extra={"revision": revision, "database": safe_url(settings.database_url)})
        await self.db.open()
        self.meters.loop = asyncio.get_running_loop()
        # Subscribed before FastStream's subscribers (and the health subject) start, so a ledger
        # that answers its health already serves every subject.
        await self.dispatcher.start(await self.broker.connect())

    async def relay_events(self) -> None:
        # Events wait in the run log until the stream takes them: a refusal (permissions, no
        # JetStream) is logged, and the relay keeps trying.
        connection = self.broker.connection
        try:
            await declare_events_stream(connection.jetstream(), self.settings.jetstream_replicas,
                                        self.settings.events_duplicate_window_s)
        except Exception as exc:  # noqa: BLE001  (any refusal: the events wait in the run log)
            log.warning("ledger events stream not declared; run events wait in the run log",
                        extra={"stream": subjects.LEDGER_EVENTS_STREAM, "reason": repr(exc)})
        relay = OutboxRelay(self.db.url, connection)
        relay.start()
        self.relays.append(relay)
        self.watchers.append(asyncio.create_task(watch_leases(self.db, self.settings.lease_check_period_s),
                                                 name="ledger-lease-watch"))

    async def stop_serving(self) -> None:
        await self.dispatcher.stop()

    async def stop_relay(self) -> None:
        for task in self.watchers:
            await stop_task(task)
        for relay in self.relays:
            await relay.stop()

    def details(self) -> dict[str, Any]:
        return {"hot": {subject: stats.as_dict() for subject, stats in self.dispatcher.stats.items()},
                "coalescers": self.hot_actions.stats()}


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


def register_handlers(broker: NatsBroker, reach: Reach, concurrency: int,
                      committed: Callable[[list[Change]], None], document: NatsBroker) -> list[HotSubject]:
    """Subscribe every subject of the ledger's contract (``shared.contracts.ledger.CONTRACTS``)
    in the ``ledger`` queue group, each with the contract's request model and its action
    (``actions.ACTIONS``), handling up to ``concurrency`` requests at once (one at a time would
    make every commit wait for the one before it). ``committed`` hears of each request's
    changes, to wake the outbox relay.

    The subjects ``request_paths.SERVED`` gives the dispatcher are not subscribed here: their
    handlers, the same ones, are returned for it, and declared on ``document`` for the AsyncAPI
    document."""

    def subscribe(subject: str, handler: Callable[..., Awaitable[Any]]) -> None:
        # decode_body: a body Python's json cannot read (too deep, a 5,000-digit integer) is a
        # 400 naming the field or the body, not a 500.
        broker.subscriber(subject, queue=subjects.LEDGER_QUEUE, max_workers=concurrency,
                          decoder=decode_body)(handler)

    hot: list[HotSubject] = []
    unsubscribed = dict(actions.ACTIONS)
    for contract in c.CONTRACTS:
        if "{" in contract.subject:
            continue  # the module-token subjects below take the module from the subject
        handler = answering(unsubscribed.pop(contract.subject), reach, contract.request, committed)
        if SERVED[contract.subject] is Served.DISPATCHER:
            hot.append(HotSubject(contract.subject, contract.request, handler))
            document.subscriber(contract.subject, queue=subjects.LEDGER_QUEUE)(handler)
        else:
            subscribe(contract.subject, handler)
    if unsubscribed:  # pragma: no cover - an action no contract names would never be subscribed
        raise RuntimeError(f"ledger actions without a contract: {sorted(unsubscribed)}")
    subscribe(subjects.LEDGER_EXPIRED_PATTERN, by_module(actions.expired, reach, Any, committed))
    subscribe(subjects.LEDGER_RECONCILE_PATTERN, by_module(actions.reconcile, reach, c.Reconcile, committed))
    return hot


def answering(action: actions.Action, reach: Reach, request: type[BaseModel],
              committed: Callable[[list[Change]], None]) -> Handler:
    """The handler of one subject: validate the body with the contract's ``request`` model,
    act, tell ``committed`` what changed, reply 200 with the action's fields. Named after the
    action (the AsyncAPI document's channel names come from it)."""

    async def handler(body: Any) -> dict[str, Any] | bytes:
        result, changes = await action(reach, body)
        committed(changes)
        return replies.ok(**result) if isinstance(result, dict) else result

    handler.__name__ = handler.__qualname__ = action.__name__
    # FastStream validates the body against the annotation (and documents it): the contract's model.
    handler.__annotations__ = {"body": request, "return": dict[str, Any] | bytes}
    return handler


ByModule = Callable[[Reach, Any, str], Awaitable[tuple[dict[str, Any], list[Change]]]]


def by_module(action: ByModule, reach: Reach, request: Any,
              committed: Callable[[list[Change]], None]) -> Callable[..., Awaitable[dict[str, Any]]]:
    """The handler of a subject that names its module (``ledger.expired.<module>`` …): FastStream
    gives it the module from the subject (``Path()``) and the body validated as ``request``.
    Named after the action (the AsyncAPI document's channel names come from it)."""

    async def handler(body: Any, module: str = Path()) -> dict[str, Any]:
        reply, changes = await action(reach, body, module)
        committed(changes)
        return reply

    handler.__name__ = handler.__qualname__ = action.__name__
    # The annotations as objects, not this module's postponed strings: FastStream resolves a
    # string against the namespace of whoever builds the app (a caller's ``c`` shadowed ours).
    handler.__annotations__ = {"body": request, "module": str, "return": dict[str, Any]}
    return handler
