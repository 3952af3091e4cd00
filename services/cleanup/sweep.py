"""The sweep: give back what finished runs still hold, in the order of docs/cleanup.md, "A sweep".

1. Settle: the ledger marks terminal runs with nothing unresolved ``complete``.
2. Candidates, a bounded batch of runs at a time; for each run, claim a bounded batch of
   rows (the ledger's guarded ``→ reverting``), give them back (the batch's world objects in
   one ``world.despawn``, leases and module reverts one command a row), record what became of
   each row.
3. Finish each run: the ledger writes ``cleanup.swept`` with this sweep's summary and
   decides the run's cleanup status from what is left.

Each row gets at most one attempt per sweep: a run whose batch met a transient failure or
nobody at all (``away``) is left for the next sweep, and a row whose outcome is recorded is
no longer claimable. An ``away`` outcome spends no attempt: the ledger keeps the row from
being claimed until its back-off passes (``SHARDBUS_AWAY_BACKOFF_S``, doubled per miss in a
row, capped at ``SHARDBUS_AWAY_BACKOFF_MAX_S``), so a shard that is away for an hour leaves its
runs ``pending``, not ``incomplete``. Several replicas may sweep at once: the ledger's claim hands each
row to one of them, and the idempotency key makes even a reclaimed row (its sweeper died
mid-revert) a replay at the shard, not a second execution.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from services.cleanup import giveback
from services.cleanup.classify import Outcome, Verdict
from services.cleanup.ledger_client import MAX_LIMIT, LedgerClient, LedgerError
from services.cleanup.metrics import CleanupCounts
from services.cleanup.requester import Requester
from shared.contracts import ledger_statuses
from shared.contracts.ids import is_shard_id

log = logging.getLogger("shardbus.cleanup.sweep")

FAILURES_KEPT = 20
"""How many failure reasons one run's ``cleanup.swept`` summary quotes (the rest are counted)."""

FAILURE_REASON_CHARS = 400
"""How much of each failure reason the summary quotes: 20 of them stay far below the ledger's
64 KiB cap on a summary, whatever characters they hold."""

CANDIDATE_POOL = 5
"""A sweep asks for this many batches' worth of candidate runs and works on a random batch."""

SHARD_CACHE_SIZE = 50_000
"""Runs whose shard id is remembered (a run's shard never changes); cleared when full."""

SETTLED = frozenset({ledger_statuses.CLEANUP_COMPLETE, ledger_statuses.CLEANUP_INCOMPLETE})
"""Cleanup statuses that take a run out of the candidates; one left ``pending`` (a transient
failure) may come up again within the same sweep, and is skipped there."""


@dataclass(frozen=True)
class Limits:
    """How hard one sweep works (from the service's settings)."""

    max_attempts: int = 3
    batch_size: int = 200
    runs_per_batch: int = 100
    runs_in_flight: int = 8
    give_back_concurrency: int = 32
    claim_timeout_s: float = 120.0
    command_timeout_s: float = 15.0
    away_backoff_s: float = 2.0
    away_backoff_max_s: float = 60.0
    despawn_max_bytes: int = giveback.DESPAWN_MAX_BYTES
    """A ``world.despawn`` body larger than this is split over several commands (not a setting:
    the default suits every gateway line cap; tests and benches pass a small one)."""


@dataclass
class RunReport:
    """What one sweep found and did for one run."""

    run_id: str
    claimed: int = 0
    reverted: int = 0
    drifted: int = 0
    failed: int = 0
    transient: int = 0
    away: int = 0
    lost_races: int = 0
    deferred: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    cleanup_status: ledger_statuses.CleanupStatus | None = None
    error: str | None = None
    error_status: int = HTTPStatus.SERVICE_UNAVAILABLE

    def count(self, resource_id: Any, outcome: Outcome) -> None:
        """Add one row's outcome."""
        setattr(self, outcome.verdict.value, getattr(self, outcome.verdict.value) + 1)
        if outcome.verdict is not Verdict.REVERTED and len(self.failures) < FAILURES_KEPT:
            reason = None if outcome.reason is None else storable(outcome.reason)[:FAILURE_REASON_CHARS]
            self.failures.append({"resourceId": resource_id, "verdict": outcome.verdict.value, "reason": reason})

    def summary(self) -> dict[str, Any]:
        """The ``cleanup.swept`` summary the ledger writes to the run log."""
        return {"claimed": self.claimed, "reverted": self.reverted, "drifted": self.drifted,
                "failed": self.failed, "transient": self.transient, "away": self.away,
                "lostRaces": self.lost_races,
                "deferred": self.deferred, "failures": self.failures}

    def to_dict(self) -> dict[str, Any]:
        """The report as a reply field."""
        out = {"runId": self.run_id, **self.summary(), "cleanupStatus": self.cleanup_status}
        if self.error:
            out["error"] = self.error
        return out


@dataclass
class SweepReport:
    """What one whole sweep did."""

    settled: int = 0
    runs: list[RunReport] = field(default_factory=list)
    error: str | None = None
    started_at: float = 0.0
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The totals (and failing runs) as a reply's fields."""
        totals = {name: sum(getattr(r, name) for r in self.runs)
                  for name in ("claimed", "reverted", "drifted", "failed", "transient", "away", "lost_races",
                               "deferred")}
        out: dict[str, Any] = {"settled": self.settled, "runs": len(self.runs),
                               **{_camel(k): v for k, v in totals.items()},
                               "runErrors": [{"runId": r.run_id, "error": r.error} for r in self.runs if r.error],
                               "startedAt": round(self.started_at, 3), "durationS": round(self.duration_s, 3)}
        if self.error:
            out["error"] = self.error
        return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class Sweeper:
    """Runs sweeps against the ledger and the shard, over a :class:`Requester`."""

    def __init__(self, requester: Requester, ledger: LedgerClient, limits: Limits,
                 counts: CleanupCounts | None = None) -> None:
        self.requester, self.ledger, self.limits = requester, ledger, limits
        self.give_backs = asyncio.Semaphore(limits.give_back_concurrency)
        self.shards: dict[str, str] = {}
        self.counts = counts or CleanupCounts()
        """What the sweeps did (the service's metrics)."""

    async def sweep(self) -> SweepReport:
        """One whole sweep: settle, then every candidate run, a bounded batch at a time."""
        started = time.monotonic()
        report = SweepReport(started_at=time.time())
        try:
            report.settled = await self.ledger.settle()
            seen: set[str] = set()
            left_pending: set[str] = set()
            while True:
                # A run swept this time that is still pending (a transient failure) may stay a
                # candidate; skip it, and ask for that many more so the batch is all new runs.
                pool = CANDIDATE_POOL * self.limits.runs_per_batch + len(left_pending)
                runs = await self.ledger.candidates(self.limits.max_attempts, min(MAX_LIMIT, pool))
                fresh = [run for run in runs if run not in seen]
                if not fresh:
                    break
                # A random batch out of a larger pool: replicas sweeping at once mostly work
                # on different runs instead of all queueing behind the same oldest ones.
                fresh = random.sample(fresh, min(len(fresh), self.limits.runs_per_batch))
                seen.update(fresh)
                swept = await self._sweep_runs(fresh)
                left_pending.update(r.run_id for r in swept if r.cleanup_status not in SETTLED)
                report.runs.extend(swept)
        except LedgerError as exc:
            report.error = str(exc)  # the caller logs the sweep's outcome once, at its level
        report.duration_s = time.monotonic() - started
        self.counts.sweep_seconds.observe(report.duration_s)
        if not report.error:
            self.counts.runs_waiting = sum(1 for r in report.runs if r.away and r.cleanup_status not in SETTLED)
        return report

    async def _sweep_runs(self, run_ids: list[str]) -> list[RunReport]:
        gate = asyncio.Semaphore(self.limits.runs_in_flight)

        async def one(run_id: str) -> RunReport:
            async with gate:
                return await self.sweep_run(run_id)

        return list(await asyncio.gather(*(one(run_id) for run_id in run_ids)))

    async def sweep_run(self, run_id: str) -> RunReport:
        """Give back what ``run_id`` still holds (batch after batch), then finish it."""
        report = RunReport(run_id)
        try:
            handled: set[Any] = set()
            while True:
                # A command may start only while our claim has a whole command timeout left:
                # a row queued behind the give-back slots past that point could be reclaimed
                # by another sweeper while our command is still in flight (two senders of one
                # key: a 425 and a spent attempt). Such rows are deferred, left `reverting`
                # for the next claim after the timeout.
                start_by = time.monotonic() + self.limits.claim_timeout_s - self.limits.command_timeout_s
                # One claim is one page: at most a batch, and at most what one reply can carry
                # (`more`: the ledger left claimable rows for the next claim).
                rows, shard, more = await self.ledger.claim(run_id, self.limits.max_attempts,
                                                            self.limits.batch_size, self.limits.claim_timeout_s)
                if not rows:
                    break
                report.claimed += len(rows)
                fresh = [row for row in rows if _row_id(row) not in handled]
                handled.update(_row_id(row) for row in rows)
                given = await self._give_back_batch(rows, shard, start_by)
                await self._record(given, report)
                if report.transient or report.away or not more or not fresh:
                    break
            run = await self.ledger.finish(run_id, self.limits.max_attempts, report.summary())
            report.cleanup_status = run.cleanup_status
        except LedgerError as exc:
            # Claimed rows stay `reverting` until the claim timeout; the next sweep recovers them.
            report.error, report.error_status = exc.sentence, exc.status
            if HTTPStatus.BAD_REQUEST <= exc.status < HTTPStatus.INTERNAL_SERVER_ERROR:
                # The ledger refused the run itself (no such run, not over yet): the asker's
                # mistake, answered in the reply; nothing an operator must look at.
                log.info("run not swept: the ledger refused it",
                         extra={"runId": run_id, "status": exc.status, "reason": exc.sentence})
            else:
                log.warning("run not swept: the ledger failed", extra={"runId": run_id, "reason": str(exc)})
        self._count(report)
        return report

    def _count(self, report: RunReport) -> None:
        give_backs = self.counts.give_backs
        for verdict in give_backs:
            give_backs[verdict] += getattr(report, verdict)
        if report.cleanup_status in self.counts.finished:
            self.counts.finished[report.cleanup_status] += 1

    async def retry(self, run_id: str) -> RunReport:
        """Manual retry of an ``incomplete`` run: reset its attempts, sweep it now."""
        await self.ledger.retry(run_id)
        return await self.sweep_run(run_id)

    async def shard_of(self, run_id: str) -> str:
        """The shard a run acts on (asked of the ledger once, then remembered)."""
        if run_id not in self.shards:
            console = await self.ledger.console(run_id, limit=1)  # the run is all it needs
            run = console.get("run")
            shard = run.get("shard") if isinstance(run, dict) else None
            if len(self.shards) >= SHARD_CACHE_SIZE:
                self.shards.clear()
            self.shards[run_id] = str(shard or "")
        return self.shards[run_id]

    async def _give_back_batch(self, rows: list[Any], shard: str,
                               start_by: float) -> list[tuple[Any, Outcome | None]]:
        """Give a claimed batch back: each row's ``(resourceId, outcome)``, in the batch's order
        (``None``: deferred). The batch's world objects go in one ``world.despawn`` per run
        (split only over the byte budget), each taking one give-back slot; leases and module
        reverts in one command per row."""
        given: list[tuple[Any, Outcome | None]] = [(None, None)] * len(rows)
        world: dict[str, list[int]] = {}
        sends = []
        for index, row in enumerate(rows):
            early = _unsendable(row)
            if early is not None:
                given[index] = early
            elif row["kind"] in giveback.WORLD_KINDS and is_shard_id(shard):
                world.setdefault(row["runId"], []).append(index)
            else:
                sends.append(self._give_back_one(index, row, shard, start_by, given))
        for run_id, indexes in world.items():
            for command in giveback.despawns(run_id, [rows[i] for i in indexes], shard,
                                             self.limits.despawn_max_bytes):
                sends.append(self._despawn(command, indexes, rows, start_by, given))
        await asyncio.gather(*sends)
        return given

    async def _give_back_one(self, index: int, row: dict[str, Any], shard: str, start_by: float,
                             given: list[tuple[Any, Outcome | None]]) -> None:
        async with self.give_backs:
            if time.monotonic() > start_by:
                given[index] = (row["resourceId"], None)
                return
            given[index] = (row["resourceId"],
                            await giveback.give_back(self.requester, row, shard, self.limits.command_timeout_s))

    async def _despawn(self, command: giveback.Despawn, indexes: list[int], rows: list[Any], start_by: float,
                       given: list[tuple[Any, Outcome | None]]) -> None:
        """One ``world.despawn`` (one slot); each of its rows gets its own serial's outcome."""
        mine = {id(row) for row in command.rows}
        placed = [i for i in indexes if id(rows[i]) in mine]
        async with self.give_backs:
            if time.monotonic() > start_by:
                for i in placed:
                    given[i] = (rows[i]["resourceId"], None)
                return
            outcomes = await giveback.despawn(self.requester, command, self.limits.command_timeout_s)
        for i in placed:
            given[i] = (rows[i]["resourceId"], outcomes[rows[i]["ref"]])

    async def _record(self, given: list[tuple[Any, Outcome | None]], report: RunReport) -> None:
        """Record a batch's outcomes in one ledger request (one commit, not one per row)."""
        for resource_id, outcome in given:
            if outcome is None:
                report.deferred += 1
            elif not isinstance(resource_id, int):
                report.count(None, outcome)
        recordable = [(resource_id, outcome) for resource_id, outcome in given
                      if isinstance(resource_id, int) and outcome is not None]
        if not recordable:
            return
        reply = await self.ledger.outcomes([_wire(resource_id, outcome) for resource_id, outcome in recordable],
                                           self.limits.away_backoff_s, self.limits.away_backoff_max_s)
        recorded = set(reply.recorded)
        # A conflict: another sweeper reclaimed the row after our claim timed out and
        # recorded it first; the shard answered both of us from one execution.
        report.lost_races += len(reply.conflicts)
        missing = set(reply.missing)
        for resource_id, outcome in recordable:
            if resource_id in recorded:
                report.count(resource_id, outcome)
            elif resource_id in missing:
                report.count(resource_id, Outcome(Verdict.FAILED, "the ledger no longer has this resource"))


def _unsendable(row: Any) -> tuple[Any, Outcome] | None:
    """A claimed row that cannot be given back at all, with its failed outcome; else None."""
    resource_id = _row_id(row)
    if not isinstance(resource_id, int):
        # Without an id nothing can be recorded; the row's claim times out and a person
        # sees it `reverting` on the console. Say so loudly.
        log.error("the ledger handed out a row without a resourceId", extra={"row": str(row)[:300]})
        return None, Outcome(Verdict.FAILED, "claimed row has no resourceId")
    missing = [name for name in ("runId", "module", "kind", "ref") if not isinstance(row.get(name), str)]
    if missing:
        return resource_id, Outcome(Verdict.FAILED, f"the ledger row lacks {', '.join(missing)}; cannot "
                                                    "tell what to give back")
    omitted = row.get("revertOmitted")
    if omitted is not None and row["kind"] not in giveback.WORLD_KINDS:
        # Stored before the ledger capped reverts; too large for any reply, so it was left
        # out. A world object needs only its ref; anything else would be sent without
        # what it needs.
        return resource_id, Outcome(Verdict.FAILED, f"its revert ({omitted} bytes, stored before the ledger "
                                                    "capped reverts at 8 KiB) is too large to be sent, so the "
                                                    "sweep cannot tell how to give it back; give it back by "
                                                    "hand, then resolve the row")
    return None


def _wire(resource_id: int, outcome: Outcome) -> dict[str, Any]:
    """One outcome as the ledger takes it (a failure always says why; a give-back that
    worked records no error)."""
    out: dict[str, Any] = {"resourceId": resource_id, "verdict": outcome.verdict.value}
    if outcome.verdict in (Verdict.FAILED, Verdict.TRANSIENT, Verdict.AWAY):
        out["error"] = storable(outcome.reason or f"{outcome.verdict.value} without a reason")
    elif outcome.verdict is Verdict.DRIFTED and outcome.reason:
        out["error"] = storable(outcome.reason)
    return out


def storable(text: str) -> str:
    """``text`` as the ledger stores it: a reason quoting a shard's garbage may hold a NUL or
    a lone surrogate, which PostgreSQL cannot store and the ledger refuses (400) — each
    becomes U+FFFD."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _row_id(row: Any) -> Any:
    return row.get("resourceId") if isinstance(row, dict) else None
