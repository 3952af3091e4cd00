"""The cleanup service's contract (docs/contracts.md, "Cleanup"): what ``cleanup.sweep``,
``cleanup.retry`` and ``cleanup.reconcile`` take and answer, and the ``cleanup.events.swept``
event, written once for the service and its clients (``shardbus cleanup``, the web door, the
operator's console)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from shared import subjects
from shared.contracts import Contract
from shared.contracts.ids import ModuleName, RunId
from shared.contracts.ledger_statuses import CleanupStatus, Verdict
from shared.replies import Reply

QUEUE = "cleanup-workers"
"""The queue group every cleanup replica's request subscribers join."""

RECONCILE_MODULES_MAX = 100
"""The most modules one ``cleanup.reconcile`` names."""


class CleanupRequest(BaseModel):
    """Base of every request: strict types, camelCase on the wire, unknown fields ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=True)


class SweepRequest(CleanupRequest):
    """``cleanup.sweep``: every candidate run, or only ``runId``."""

    run_id: RunId | None = None


class RetryRequest(CleanupRequest):
    """``cleanup.retry``: the ``incomplete`` run to sweep again."""

    run_id: RunId


class ReconcileRequest(CleanupRequest):
    """``cleanup.reconcile``: the modules to check (default: every module owning a live row, and
    the configured ones)."""

    modules: list[ModuleName] | None = Field(default=None, max_length=RECONCILE_MODULES_MAX)


class WireModel(BaseModel):
    """Base of the replies' parts: camelCase, fields a newer service adds are kept."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class CleanupReply(Reply):
    """Base of every reply: the envelope, camelCase, fields a newer service adds are kept."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class Failure(WireModel):
    resource_id: Any
    verdict: Verdict
    reason: str | None


class Tally(WireModel):
    """What a sweep did with the rows it claimed, verdict by verdict (one run's or a whole sweep's)."""

    claimed: int
    reverted: int
    drifted: int
    failed: int
    transient: int
    away: int
    lost_races: int
    deferred: int


class RunReport(Tally):
    """What one sweep did for one run (also the ``cleanup.swept`` summary in the run's log)."""

    run_id: str
    failures: list[Failure]
    cleanup_status: CleanupStatus | None
    error: str | None = None


class RunError(WireModel):
    run_id: str
    error: str | None


class SweepTotals(Tally):
    """What one whole sweep did: the reply of ``cleanup.sweep`` without ``runId`` and the
    payload of ``cleanup.events.swept`` (which adds ``why`` and ``pid``)."""

    settled: int
    runs: int
    run_errors: list[RunError]
    started_at: float
    duration_s: float
    error: str | None = None


class SweepReply(SweepTotals, CleanupReply):
    """``cleanup.sweep`` without ``runId``: the totals. (With ``runId`` the reply is
    :class:`RunReply`.)"""


class RunReply(CleanupReply):
    """``cleanup.sweep`` with ``runId``, and ``cleanup.retry``: that run's report."""

    run: RunReport


class ModuleShare(WireModel):
    runs: int
    orphaned: int
    expired: int
    skipped: int
    unanswered: int


class Unanswered(WireModel):
    module: str
    run_id: str
    shard: str | None
    reason: str


class ReconcileReply(CleanupReply):
    """``cleanup.reconcile``: totals, each module's share and every run left unanswered."""

    modules: int
    runs: int
    orphaned: int
    expired: int
    skipped: int
    unanswered: list[Unanswered]
    errors: list[str]
    by_module: dict[str, ModuleShare]


CONTRACTS: tuple[Contract, ...] = (
    Contract(subjects.CLEANUP_SWEEP, "cleanup", SweepRequest, SweepReply, QUEUE),
    Contract(subjects.CLEANUP_RETRY, "cleanup", RetryRequest, RunReply, QUEUE),
    Contract(subjects.CLEANUP_RECONCILE, "cleanup", ReconcileRequest, ReconcileReply, QUEUE),
)
"""Every request/reply subject the cleanup service answers (``cleanup.sweep`` with a ``runId``
answers :class:`RunReply`)."""
