"""Cleanup wiring: the request subjects in the ``cleanup-workers`` queue group (replicas share
requests), the periodic sweep and reconcile in every replica, health and metrics. What each does
is :class:`~services.cleanup.service.CleanupService` (docs/cleanup.md)."""

from __future__ import annotations

import asyncio
import logging

import uvloop
from faststream import FastStream

from services.cleanup import metrics
from services.cleanup.service import CleanupService, every
from services.cleanup.settings import CleanupSettings
from shared import subjects
from shared.broker import make_app, make_broker
from shared.contracts.cleanup import QUEUE
from shared.health import add_health
from shared.metrics import serve_metrics
from shared.request_body import decode_body

log = logging.getLogger("shardbus.cleanup")

LOOP_FACTORY = uvloop.new_event_loop
"""``shardbus run cleanup`` runs on uvloop: a sweep is thousands of small requests, each its own
socket write (bench/cleanup.py, docs/performance.md)."""

STOP_JOBS_S = 10.0
"""How long the periodic jobs get to end when the service stops."""


def create_app(settings: CleanupSettings | None = None) -> FastStream:
    """The cleanup service as a FastStream app: run it with ``shardbus run cleanup``."""
    settings = settings or CleanupSettings()
    broker = make_broker(settings, "cleanup")
    app = make_app(broker, "cleanup")
    service = CleanupService(broker, settings)
    for subject, handler in ((subjects.CLEANUP_SWEEP, service.sweep_now), (subjects.CLEANUP_RETRY, service.retry),
                             (subjects.CLEANUP_RECONCILE, service.reconcile_now)):
        broker.subscriber(subject, queue=QUEUE, decoder=decode_body)(handler)
    tasks: list[asyncio.Task[None]] = []

    @app.after_startup
    async def start_periodic() -> None:
        service.sweeper()
        tasks.append(asyncio.create_task(every(settings.sweep_period_s, service.periodic_sweep, "sweep")))
        # Reconcile-all asks the shard about every run with a live row: not at start, where every
        # replica started together would ask at once (and compete with the first sweep).
        tasks.append(asyncio.create_task(every(settings.reconcile_period_s, service.periodic_reconcile, "reconcile",
                                               first_after_a_period=True)))

    @app.on_shutdown
    async def stop_periodic() -> None:
        await stop_jobs(tasks)

    add_health(app, broker, "cleanup", settings)
    serve_metrics(app, broker, "cleanup", settings, metrics.collector(service.workers.counts))
    return app


async def stop_jobs(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the periodic jobs again until they end, within STOP_JOBS_S: Python 3.11's wait_for
    (under nats-py's request) can swallow a cancellation that lands as its reply does, and the
    job then goes on to its next sleep, an hour long (seen once: a test's teardown hung)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_JOBS_S
    while (running := [task for task in tasks if not task.done()]) and loop.time() < deadline:
        for task in running:
            task.cancel()
        await asyncio.wait(running, timeout=0.5)
    if running:
        log.warning("periodic jobs did not stop", extra={"jobs": len(running)})
