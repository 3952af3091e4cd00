"""What the ledger does for each subject of its contract (docs/contracts.md): one plain function
an action, each given the ledger's :class:`Reach` and the request's validated body, and
:data:`ACTIONS`, the table from subject to action that ``app.py`` subscribes. The rules
themselves live in the modules called here (runs, resources, sweep, console, expiry)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from services.ledger import console, expiry, resources, runs, statuses, sweep
from services.ledger.database.store import Change, Database
from services.ledger.serving.hot_subjects import HotActions
from shared import replies, subjects
from shared.contracts import ledger as c

Answer = tuple[dict[str, Any] | bytes, list[Change]]
"""What a ledger action gives back: the reply's fields (or a whole reply, already encoded) and
the changes it committed (their events are in the run log)."""


@dataclass(frozen=True)
class Reach:
    """What an action works with: the database, the coalesced hot path, and the connected
    server's ``max_payload`` (pages — console, live rows, claims, runs — fit under it)."""

    db: Database
    hot: HotActions
    max_payload: Callable[[], int]

    def page_bytes(self) -> int:
        return console.page_bytes(self.max_payload())


Action = Callable[[Reach, Any], Awaitable[Answer]]


async def create_run(reach: Reach, body: c.CreateRun) -> Answer:
    run, changes = await runs.create_run(reach.db, body.run_id, body.shard, body.event, body.starts_at, body.ends_at)
    return {"run": run}, changes


async def run_status(reach: Reach, body: c.SetRunStatus) -> Answer:
    run, changes = await runs.set_run_status(reach.db, body.run_id, body.status)
    return {"run": run}, changes


async def reserve(reach: Reach, body: c.AddResource) -> Answer:
    resource, changes = await reach.hot.reserve(body)
    return {"resource": resource}, changes


async def record(reach: Reach, body: c.AddResource) -> Answer:
    resource, changes = await reach.hot.record(body)
    return {"resource": resource}, changes


async def confirm(reach: Reach, body: c.ResourceRef) -> Answer:
    resource, changes = await reach.hot.confirm(body)
    return {"resource": resource}, changes


async def fail(reach: Reach, body: c.FailResource) -> Answer:
    resource, changes = await reach.hot.fail(body)
    return {"resource": resource}, changes


async def run_console(reach: Reach, body: c.Console) -> Answer:
    return await console.console(reach.db, body.run_id, body.after, body.limit, reach.page_bytes()), []


async def run_log(reach: Reach, body: c.RunLogPage) -> Answer:
    return await console.run_log(reach.db, body.run_id, body.after, body.limit, reach.page_bytes()), []


async def list_runs(reach: Reach, body: c.ListRuns) -> Answer:
    return await console.list_runs(reach.db, body, reach.page_bytes()), []


async def leases_overdue(reach: Reach, body: c.LeasesOverdue) -> Answer:
    _, reply = await console.leases_overdue(reach.db, body.limit, reach.page_bytes())
    return reply, []


async def live(reach: Reach, body: c.LiveRows) -> Answer:
    return await console.live(reach.db, body.module, body.limit, body.after, reach.page_bytes()), []


async def live_modules(reach: Reach, body: c.LiveModules) -> Answer:
    return await console.live_modules(reach.db, body.limit), []


async def settle(reach: Reach, body: c.Settle) -> Answer:
    count, changes = await sweep.settle(reach.db)
    return {"settled": count}, changes


async def candidates(reach: Reach, body: c.Candidates) -> Answer:
    return {"runs": await sweep.candidates(reach.db, body.limit)}, []


async def claim(reach: Reach, body: c.Claim) -> Answer:
    run, changes, more = await sweep.claim(reach.db, body.run_id, body.max_attempts, body.limit,
                                           body.claim_timeout_s, reach.page_bytes())
    # Compact and UTF-8 as it is: at most the bytes the claim measured (its page budget).
    return json.dumps(replies.ok(resources=[change.resource for change in changes], shard=run["shard"],
                                 more=more), separators=(",", ":"), ensure_ascii=False).encode(), changes


async def reverted(reach: Reach, body: c.ResourceRef) -> Answer:
    resource, changes = await reach.hot.outcome(body.resource_id, statuses.SWEEP_REVERTED, None)
    return {"resource": resource}, changes


async def drifted(reach: Reach, body: c.Drifted) -> Answer:
    resource, changes = await reach.hot.outcome(body.resource_id, statuses.SWEEP_DRIFTED, body.error)
    return {"resource": resource}, changes


async def failed(reach: Reach, body: c.SweepFailed) -> Answer:
    resource, changes = await reach.hot.outcome(body.resource_id, statuses.SWEEP_FAILED[body.transient], body.error)
    return {"resource": resource}, changes


async def record_outcomes(reach: Reach, body: c.SweepOutcomes) -> Answer:
    return await sweep.outcomes(reach.db, [(o.resource_id, o.verdict, o.error) for o in body.outcomes],
                                body.away_backoff_s, body.away_backoff_max_s)


async def finish(reach: Reach, body: c.Finish) -> Answer:
    run, changes = await sweep.finish(reach.db, body.run_id, body.max_attempts, body.summary)
    return {"run": run}, changes


async def retry(reach: Reach, body: c.RunRef) -> Answer:
    run, changes = await sweep.retry(reach.db, body.run_id)
    return {"run": run}, changes


async def waiting(reach: Reach, body: c.Waiting) -> Answer:
    found, more = await sweep.waiting(reach.db, body.limit, body.run_id, body.longer_than_s)
    return {"runs": found, "more": more}, []


ACTIONS: dict[str, Action] = {
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
"""Every subject of the ledger's contract but the two that take the module from the subject
(:func:`expired` and :func:`reconcile`, named for their subjects)."""


async def expired(reach: Reach, body: Any, module: str) -> tuple[dict[str, Any], list[Change]]:
    """Read leniently (docs/ledger.md, "Expiry"): a malformed expiry answers {expired: 0}, writes nothing."""
    count, changes = await expiry.expire(reach.db, module, body)
    return replies.ok(expired=count), changes


async def reconcile(reach: Reach, body: c.Reconcile, module: str) -> tuple[dict[str, Any], list[Change]]:
    if not c.is_module_name(module):
        return replies.fail(HTTPStatus.BAD_REQUEST, f"module {module!r} in the subject is not a module name"), []
    count, changes = await resources.reconcile(reach.db, module, body.run_id, body.kind, body.present)
    return replies.ok(orphaned=count), changes
