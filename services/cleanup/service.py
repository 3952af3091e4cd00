"""What the cleanup service does (docs/cleanup.md): its three request handlers (sweep now, retry,
reconcile now) and its two periodic jobs (sweep, reconcile), as methods of one
:class:`CleanupService` that ``app.py`` subscribes and schedules. Within one process sweeps never
overlap (one lock); across replicas the ledger's guarded claim hands each row to one sweeper."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from faststream.nats import NatsBroker

from services.cleanup import metrics
from services.cleanup.away_alert import AwayAlert
from services.cleanup.ledger_client import NO_LEDGER, LedgerClient, LedgerError
from services.cleanup.reconcile import Reconciler
from services.cleanup.requester import NatsRequester
from services.cleanup.settings import CleanupSettings
from services.cleanup.sweep import Limits, RunReport, Sweeper
from shared import replies, subjects
from shared.contracts.cleanup import ReconcileRequest, RetryRequest, SweepRequest

log = logging.getLogger("shardbus.cleanup")

JITTER = 0.1
"""Periods vary by ±10% so replicas started together drift apart."""

OUTAGE_RETRY_S = 1.0
"""First wait before sweeping again after the ledger stopped a periodic sweep (then doubled)."""


def _run_reply(report: RunReport) -> dict[str, Any]:
    """A one-run sweep's reply: the run's report, or the ledger's refusal (e.g. 409, 404). A
    refusal carries the report only when the sweep claimed rows before it stopped: a run that
    does not exist, or one refused before anything was claimed, has nothing to report."""
    run = report.to_dict()
    if not report.error:
        return replies.ok(run=run)
    return replies.fail(report.error_status, report.error, **({"run": run} if report.claimed else {}))


@dataclass(frozen=True)
class _Built:
    """The sweeper, and the reconciler sharing its connection and run → shard cache."""

    sweeper: Sweeper
    reconciler: Reconciler
    away_alert: AwayAlert


class _Workers:
    """The sweeper and the reconciler over the broker's own connection, built on first use
    (once the broker is connected)."""

    def __init__(self, broker: NatsBroker, settings: CleanupSettings) -> None:
        self.broker, self.settings = broker, settings
        self.counts = metrics.CleanupCounts()
        self._built: _Built | None = None

    def built(self) -> _Built:
        if self._built is None:
            settings = self.settings
            requester = NatsRequester(self.broker.connection)
            ledger = LedgerClient(requester, settings.ledger_timeout_s)
            sweeper = Sweeper(requester, ledger, Limits(
                max_attempts=settings.max_attempts, batch_size=settings.sweep_batch_size,
                runs_per_batch=settings.sweep_runs_per_batch, runs_in_flight=settings.sweep_runs_in_flight,
                give_back_concurrency=settings.give_back_concurrency,
                claim_timeout_s=settings.claim_timeout_s, command_timeout_s=settings.command_timeout_s,
                away_backoff_s=settings.away_backoff_s, away_backoff_max_s=settings.away_backoff_max_s), self.counts)
            self._built = _Built(sweeper, Reconciler(requester, ledger, sweeper.shard_of, settings.command_timeout_s),
                                 AwayAlert(ledger, settings.away_alert_s, self.counts))
        return self._built


class CleanupService:
    """The handlers and periodic jobs of one cleanup process, over the broker's connection."""

    def __init__(self, broker: NatsBroker, settings: CleanupSettings) -> None:
        self.broker, self.settings = broker, settings
        self.workers = _Workers(broker, settings)
        self.one_sweep_at_a_time = asyncio.Lock()
        self.ledger_seen = False

    def sweeper(self) -> Sweeper:
        return self.workers.built().sweeper

    def reconciler(self) -> Reconciler:
        return self.workers.built().reconciler

    async def waiting_too_long(self) -> None:
        """After a whole sweep: count (and log once each) the runs waiting too long."""
        try:
            await self.workers.built().away_alert.check()
        except LedgerError as exc:
            log.warning("cannot tell which runs wait too long for their shard", extra={"reason": str(exc)})

    async def full_sweep(self, why: str) -> dict[str, Any]:
        async with self.one_sweep_at_a_time:
            report = (await self.sweeper().sweep()).to_dict()
        level = logging.WARNING if report.get("error") or report["runErrors"] else logging.INFO
        if why == "period" and not self.ledger_seen and str(report.get("error", "")).endswith(NO_LEDGER):
            # Cleanup may start before the ledger listens: waiting for it is no warning.
            log.info("waiting for the ledger before the first sweep")
        elif report["runs"] or report["settled"] or level != logging.INFO:
            log.log(level, "sweep done", extra={"why": why, **report})
        if not report.get("error"):
            self.ledger_seen = True
            await self.waiting_too_long()
        await self.broker.publish({**report, "why": why, "pid": os.getpid()}, subjects.CLEANUP_SWEPT)
        return report

    async def sweep_now(self, request: SweepRequest) -> dict[str, Any]:
        """Sweep now: every candidate run, or only ``runId``."""
        if request.run_id is None:
            summary = await self.full_sweep("request")
            if summary.get("error"):
                return replies.fail(HTTPStatus.SERVICE_UNAVAILABLE, summary["error"])
            return replies.ok(**summary)
        async with self.one_sweep_at_a_time:
            report = await self.sweeper().sweep_run(request.run_id)
        return _run_reply(report)

    async def retry(self, request: RetryRequest) -> dict[str, Any]:
        """Reset an incomplete run's attempts and sweep it now."""
        try:
            async with self.one_sweep_at_a_time:
                report = await self.sweeper().retry(request.run_id)
        except LedgerError as exc:
            return exc.as_reply()
        return _run_reply(report)

    async def reconcile_now(self, request: ReconcileRequest) -> dict[str, Any]:
        """Reconcile the named modules (default: every module owning a live row, and the
        configured ones)."""
        if request.modules is not None:
            return replies.ok(**(await self.reconciler().reconcile(request.modules)).to_dict())
        try:
            report = await self.reconciler().reconcile_all(self.settings.modules_to_reconcile())
        except LedgerError as exc:
            return replies.fail(exc.status, f"cannot tell which modules own live rows: {exc}")
        return replies.ok(**report.to_dict())

    async def periodic_sweep(self) -> bool:
        return not (await self.full_sweep("period")).get("error")

    async def periodic_reconcile(self) -> bool:
        try:
            report = await self.reconciler().reconcile_all(self.settings.modules_to_reconcile())
        except LedgerError as exc:
            log.warning("periodic reconcile stopped: cannot tell which modules own live rows",
                        extra={"reason": str(exc)})
            return False
        summary = report.to_dict()
        level = logging.WARNING if report.errors or report.unanswered else logging.INFO
        if report.modules or level != logging.INFO:
            log.log(level, "reconcile done", extra=summary)
        return not report.errors


async def every(period_s: float, job: Callable[[], Awaitable[bool]], name: str, *,
                first_after_a_period: bool = False) -> None:
    """Run ``job`` every period (the first time at once, or after one period); after a job
    the ledger stopped (False), sooner, backing off from OUTAGE_RETRY_S up to the period
    (e.g. the first sweep, before the ledger is up)."""
    retry_s = OUTAGE_RETRY_S
    if first_after_a_period:
        await asyncio.sleep(period_s * random.uniform(1 - JITTER, 1 + JITTER))
    while True:
        try:
            done = await job()
        except Exception:
            log.exception("periodic job failed", extra={"job": name})
            done = True
        wait_s, retry_s = (period_s, OUTAGE_RETRY_S) if done else (min(period_s, retry_s), retry_s * 2)
        await asyncio.sleep(wait_s * random.uniform(1 - JITTER, 1 + JITTER))
