"""What the cleanup service asks of the ledger: settle finished runs, find runs to sweep,
claim rows for a give-back, record each outcome, finish a run's sweep, retry a run a
person has looked at, and list the runs waiting for their shard. Claims use ``FOR UPDATE
SKIP LOCKED`` so sweepers racing on one run take different rows; each outcome is a guarded
transition from ``reverting``.

A give-back that met nobody (verdict ``away``: no gateway held the shard, no module
subscribed, no answer in time) spends no attempt: the row goes back to its status, its
``away`` count goes up by one and it is not claimed again before ``retry_at`` = now +
min(cap, base × 2^away) seconds. Any answered outcome of a batch sets ``away`` back to 0 and
clears ``retry_at`` (the older one-row subjects leave both as they are).

Every outcome, batched or one-row, is one statement (``queries/sweep.py``: OUTCOMES) driven by its rule in
``statuses.OUTCOMES``: a one-row subject is a batch of one."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from services.ledger import statuses
from services.ledger.console import PAGE_BYTES
from services.ledger.database.queries.sweep import (
    CANDIDATES,
    CLAIM,
    FINISH,
    LAST_LOG_KIND,
    OUTCOMES,
    RETRY,
    RETRY_WAITING,
    RUN_TO_FINISH,
    SETTLE,
    WAITING,
)
from services.ledger.database.store import (
    Change,
    Conflict,
    Database,
    Json,
    NotFound,
    Row,
    as_object,
    first,
    one,
    resource_changes,
    rows,
    run_changes,
    run_or_not_found,
)
from services.ledger.resources import cut, replay_or_conflict, resource_of
from services.ledger.statuses import Outcome, Verdict
from shared.contracts import ledger as c

CLAIM_ROW_SLACK = 64
"""Bytes a claimed row may grow by when it turns ``reverting`` (its status and ``updatedAt``
change), added to each row's size as measured before the claim."""

AWAY_EXPONENT_MAX = 40
"""``away`` beyond this doubles the back-off no further (2^40 × the smallest base is far past
any cap; the cap applies anyway): keeps ``power(2, away)`` finite however long the outage."""

SETTLED_BY = "sweep"
"""Who settled a run, as its ``cleanup.settled`` entry says (``{"by": "sweep"}``)."""


async def settle(db: Database) -> tuple[int, list[Change]]:
    """Terminal runs whose cleanup is pending and that hold nothing unresolved become
    ``complete`` (never over ``incomplete``)."""
    step = statuses.SETTLE
    async with db.connect() as conn:
        result = await rows(conn, SETTLE,
                            {"terminal": list(statuses.RUN_TERMINAL), "unresolved": list(statuses.UNRESOLVED),
                             "to": step.to, "allowed": list(step.allowed), "log_kind": step.log_kind,
                             "by": SETTLED_BY})
    return len(result), run_changes(result)


async def candidates(db: Database, limit: int) -> list[str]:
    """Terminal runs whose cleanup is pending and that still hold unresolved rows, oldest
    change first (a run whose rows are all beyond the sweep is a candidate too, so that its
    finish marks it ``incomplete``). A run whose unresolved rows are all backing off (their
    give-back met nobody, ``retry_at`` ahead) is not a candidate until the first of them is
    due: sweeping it would claim nothing and only log ``cleanup.swept`` again."""
    async with db.connect() as conn:
        result = await rows(conn, CANDIDATES,
                            {"terminal": list(statuses.RUN_TERMINAL), "sweepable": list(statuses.SWEEPABLE),
                             "unresolved": list(statuses.UNRESOLVED), "revertable": list(statuses.REVERTABLE),
                             "limit": limit})
    return [row["run_id"] for row in result]


async def claim(db: Database, run_id: str, max_attempts: int, limit: int, claim_timeout_s: float,
                budget: int = PAGE_BYTES) -> tuple[Json, list[Change], bool]:
    """Take up to ``limit`` of the run's rows for a give-back: revertable rows with attempts
    left and no back-off ahead (``retry_at``: their last give-back met nobody), and
    ``reverting`` rows whose claim is older than ``claim_timeout_s`` (a sweeper died). Each
    remembers the status it had, for a transient failure to return to. The run comes back
    too: a sweeper needs its shard and would otherwise ask for it.

    The claim is bounded by bytes as well as by count, *before* it commits: it takes rows in
    id order while their JSON adds up to at most ``budget`` (always the first),
    so the reply listing them can be sent, and no row turns ``reverting`` unseen. The third
    value says whether claimable rows were left (by the limit or by the byte budget): the
    sweeper claims again."""
    step, again = statuses.CLAIM, statuses.RECLAIM
    async with db.connect() as conn:
        run = await run_or_not_found(conn, run_id)
        if run["status"] not in statuses.RUN_TERMINAL:
            raise Conflict(f"run {run_id!r} is {run['status']}; its resources are given back only once it is over")
        result = await rows(conn, CLAIM,
                            {"run_id": run_id, "revertable": list(step.allowed), "stale": list(again.allowed),
                             "to": step.to, "log_kind": step.log_kind, "max_attempts": max_attempts,
                             "timeout": float(claim_timeout_s), "limit": limit, "candidates": limit + 1,
                             "slack": CLAIM_ROW_SLACK, "budget": budget})
    changes = resource_changes(result)
    return run, changes, bool(result and result[0]["more"])


async def reverted(db: Database, resource_id: int) -> tuple[Json, list[Change]]:
    """The give-back succeeded: ``reverting → reverted`` (``ledger.sweep.reverted``)."""
    return await one_outcome(db, resource_id, statuses.SWEEP_REVERTED, None)


async def drifted(db: Database, resource_id: int, error: str | None) -> tuple[Json, list[Change]]:
    """Somebody changed it deliberately: ``reverting → drifted``, left alone from now on
    (``ledger.sweep.drifted``)."""
    return await one_outcome(db, resource_id, statuses.SWEEP_DRIFTED, error)


async def failed(db: Database, resource_id: int, error: str, transient: bool) -> tuple[Json, list[Change]]:
    """The give-back failed: back to the status before the claim with ``attempts + 1``; a
    refusal (not transient) also spends the row's attempts (``ledger.sweep.failed``)."""
    return await one_outcome(db, resource_id, statuses.SWEEP_FAILED[transient], error)


async def one_outcome(db: Database, resource_id: int, outcome: Outcome,
                       error: str | None) -> tuple[Json, list[Change]]:
    """A one-row subject: the batch of outcomes with one row, answered as a transition is —
    the row and its change; else the same request again (a replay: the row, nothing changed),
    404 or 409 (statuses.is_replay)."""
    async with db.connect() as conn:
        result = await outcome_rows(conn, outcome_params([(resource_id, outcome, cut(error))]))
        changes = resource_changes([row for row in result if row["run"] is not None])
        if not changes:
            return await replay_or_conflict(conn, resource_id, outcome.step, cut(error)), []
    return resource_of(changes), changes


def outcome_params(given: list[tuple[int, Outcome, str | None]], away_backoff_s: float = c.AWAY_BACKOFF_S,
                    away_backoff_max_s: float = c.AWAY_BACKOFF_MAX_S) -> dict[str, Any]:
    """The parameters of OUTCOMES (``queries/sweep.py``): each row's rule from the state machine, as arrays
    to ``unnest`` (one element per row)."""
    return {"ids": [row_id for row_id, _, _ in given],
            "errors": [error for _, _, error in given],
            "tos": [outcome.step.to for _, outcome, _ in given],
            "spends": [int(outcome.spends_attempt) for _, outcome, _ in given],
            "gives_up": [outcome.gives_up for _, outcome, _ in given],
            "counts_away": [outcome.counts_away for _, outcome, _ in given],
            "clears_away": [outcome.clears_away for _, outcome, _ in given],
            "log_kinds": [outcome.step.log_kind for _, outcome, _ in given],
            "allowed": list(statuses.OUTCOMES_FROM), "fallback": statuses.PREVIOUS_UNKNOWN,
            "live": list(statuses.LIVE), "displaced": statuses.DISPLACED,
            "backoff": float(away_backoff_s), "backoff_max": float(away_backoff_max_s),
            "exponent_max": AWAY_EXPONENT_MAX}


OUTCOME_ARRAYS = ("ids", "errors", "tos", "spends", "gives_up", "counts_away", "clears_away", "log_kinds")
"""The parameters of OUTCOMES that hold one element per row."""


async def outcome_rows(conn: asyncpg.Connection, params: dict[str, Any]) -> list[Row]:
    """OUTCOMES with ``params``; once more row by row, in id order, when it would put two rows of
    one target back live (``uq_resources_live_target``). One statement sees the target as it was
    before it, so two of its own rows, or a row another statement put back live while this one ran,
    both look free; alone, each later row sees the earlier one back and goes to DISPLACED."""
    try:
        return await rows(conn, OUTCOMES, params)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name != "uq_resources_live_target":
            raise
    found: list[Row] = []
    for i in sorted(range(len(params["ids"])), key=lambda i: params["ids"][i]):
        found += await rows(conn, OUTCOMES, {**params, **{key: [params[key][i]] for key in OUTCOME_ARRAYS}})
    return found


async def outcomes(db: Database, given: list[tuple[int, Verdict, str | None]], away_backoff_s: float = c.AWAY_BACKOFF_S,
                   away_backoff_max_s: float = c.AWAY_BACKOFF_MAX_S) -> tuple[dict[str, Any], list[Change]]:
    """Record a batch of give-back outcomes ``(resource id, verdict, error)`` in one statement.

    Each verdict's step is ``statuses.OUTCOMES``: ``reverted`` and ``drifted`` lead to their
    status; ``failed`` (a refusal: gives up on the row) and ``transient`` return the row to its
    previous status and spend an attempt; ``away`` (nobody answered) returns it *without*
    spending an attempt, counts ``away + 1`` and sets ``retry_at`` to now +
    min(``away_backoff_max_s``, ``away_backoff_s`` × 2^away) seconds (``away`` as it was: the
    first miss waits the base); every other verdict sets ``away`` to 0 and clears ``retry_at``.
    All from ``reverting`` only. One commit for the batch instead of one per row. Rows that
    were not ``reverting`` (another sweeper recorded them first) are listed as conflicts with
    their status, unknown ids as missing; the rest of the batch still lands."""
    ids = [row_id for row_id, _, _ in given]
    async with db.connect() as conn:
        result = await outcome_rows(conn, outcome_params(
            [(row_id, statuses.OUTCOMES[verdict], cut(error)) for row_id, verdict, error in given],
            away_backoff_s, away_backoff_max_s))
    changes = resource_changes([row for row in result if row["run"] is not None])
    conflicts = [{"resourceId": row["id"], "status": row["status"]} for row in result if row["run"] is None]
    known = {row["id"] for row in result}
    return {"recorded": [row["id"] for row in result if row["run"] is not None], "conflicts": conflicts,
            "missing": [row_id for row_id in ids if row_id not in known]}, changes


async def finish(db: Database, run_id: str, max_attempts: int,
                 summary: dict[str, Any]) -> tuple[Json, list[Change]]:
    """End a sweep of the run: log ``cleanup.swept`` with ``summary``, then its cleanup is
    ``complete`` with nothing unresolved, ``incomplete`` when nothing left is within the
    sweep's reach (drifted, refused, attempts spent), else it stays ``pending``."""
    rule = statuses.FINISH
    async with db.connect() as conn, conn.transaction():
        # The run's row stays locked from this read to the change: a finish racing this one
        # (two sweepers) waits, then reads what this one committed (a READ COMMITTED statement
        # would otherwise log, publish and answer the cleanup status from before it).
        found = await first(conn, RUN_TO_FINISH, {"id": run_id})
        if found is None:
            raise NotFound(f"no run {run_id!r}")
        run = as_object(found["run"])
        if run["status"] not in statuses.RUN_TERMINAL:
            raise Conflict(f"run {run_id!r} is {run['status']}; a sweep finishes only a run that is over")
        row = await one(conn, FINISH,
                        {"run_id": run_id, "unresolved": list(statuses.UNRESOLVED),
                         "revertable": list(statuses.REVERTABLE), "in_flight": list(statuses.IN_FLIGHT),
                         "max_attempts": max_attempts, "summary": json.dumps(summary),
                         "allowed": list(rule.allowed), "clean": rule.clean, "stuck": rule.stuck,
                         "unfinished": rule.unfinished, "log_kind": rule.log_kind,
                         "before": run["cleanupStatus"]})
    after = as_object(row["run"]) if row["run"] is not None else run
    return after, [Change(rule.log_kind, after, None, row["event_id"])]


async def waiting(db: Database, limit: int, run_id: str | None = None,
                  longer_than_s: float | None = None) -> tuple[list[Json], bool]:
    """Runs waiting for their shard (or a module): finished runs whose cleanup is pending and
    that hold rows whose last give-back met nobody (``away`` > 0, not yet given back), each
    with its shard, how many such rows, when the first of them is due again (``retryAt``;
    past when the next sweep is due to try), the most misses in a row (``away``) and since
    when the run has waited (``waitingSince``: the first miss in a row of its longest-waiting
    row); the run due first comes first. Only ``run_id`` when given; only runs waiting longer
    than ``longer_than_s`` when given (the away alert). The second value says whether more runs
    wait than listed."""
    async with db.connect() as conn:
        result = await rows(conn, WAITING,
                            {"waiting": list(statuses.WAITING), "terminal": list(statuses.RUN_TERMINAL),
                             "sweepable": list(statuses.SWEEPABLE), "limit": limit + 1, "run_id": run_id,
                             "longer_than": longer_than_s})
    runs = [as_object(row["run"]) for row in result]
    return runs[:limit], len(runs) > limit


async def retry(db: Database, run_id: str) -> tuple[Json, list[Change]]:
    """A person's retry of an ``incomplete`` run: attempts reset, cleanup back to ``pending``.
    Of a run waiting for its shard or module (``pending``, rows whose give-back met nobody): its
    rows' back-off is cleared, so the next claim takes them at once (the cleanup stays
    ``pending``; logged ``cleanup.retried`` with ``dueNow``)."""
    step = statuses.RETRY
    async with db.connect() as conn:
        row = await first(conn, RETRY,
                          {"run_id": run_id, "unresolved": list(statuses.UNRESOLVED), "to": step.to,
                           "allowed": list(step.allowed), "log_kind": step.log_kind})
        if row is None:
            row = await first(conn, RETRY_WAITING,
                              {"run_id": run_id, "terminal": list(statuses.RUN_TERMINAL),
                               "sweepable": list(statuses.SWEEPABLE), "waiting": list(statuses.WAITING),
                               "log_kind": step.log_kind})
        if row is None:
            run = await run_or_not_found(conn, run_id)
            last = await first(conn, LAST_LOG_KIND,
                               {"run_id": run_id, "kinds": [step.log_kind, statuses.FINISH.log_kind]})
            if statuses.is_retry_replay(run["cleanupStatus"], None if last is None else last["kind"]):
                return run, []  # the same retry again (its reply was lost): 200, nothing changes
            raise Conflict(f"run {run_id!r} cleanup is {run['cleanupStatus']}; only an incomplete cleanup is retried")
    change = run_changes([row])[0]
    return change.run, [change]
