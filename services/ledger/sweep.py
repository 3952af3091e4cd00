"""What the cleanup service asks of the ledger: settle finished runs, find runs to sweep,
claim rows for a give-back, record each outcome, finish a run's sweep, retry a run a
person has looked at, and list the runs waiting for their shard. Claims use ``FOR UPDATE
SKIP LOCKED`` so sweepers racing on one run take different rows; each outcome is a guarded
transition from ``reverting``.

A give-back that met nobody (verdict ``away``: no gateway held the shard, no module
subscribed, no answer in time) spends no attempt: the row goes back to its status, its
``away`` count goes up by one and it is not claimed again before ``retry_at`` = now +
min(cap, base × 2^away) seconds. Any answered outcome sets ``away`` back to 0 and clears
``retry_at``."""

from __future__ import annotations

import json
from typing import Any

from services.ledger import statuses
from services.ledger.console import PAGE_BYTES
from services.ledger.resources import resource_events, resource_events_cte, resource_json, transition
from services.ledger.statuses import REVERTABLE, RUN_TERMINAL, UNRESOLVED
from services.ledger.store import (Database, Change, Conflict, as_json, first, resource_changes,
                                   resource_or_conflict, rows, run_changes, run_events, run_json,
                                   run_or_not_found)
from services.ledger.tables import ERROR_MAX

CLAIM_ROW_SLACK = 64
"""Bytes a claimed row may grow by when it turns ``reverting`` (its status and ``updatedAt``
change), added to each row's size as measured before the claim."""

_ACTIONABLE = ("((s.status = ANY(:revertable) AND s.attempts < :max_attempts AND NOT s.gave_up) "
               "OR s.status = 'reverting')")
"""SQL: a row of ``s`` a sweep can still act on (revertable with attempts left, or in flight).
A row backing off after its give-back met nobody (``retry_at`` ahead) is one: no attempt
was spent, so its run stays ``pending``."""

_BACKING_OFF = "(s.status = ANY(:revertable) AND s.retry_at IS NOT NULL AND s.retry_at > now())"
"""SQL: a row of ``s`` waiting for its shard or module: not claimed before ``retry_at``."""

AWAY_LOG_KIND = "cleanup.away"
"""The run-log kind (and update event type) of a give-back that met nobody."""

AWAY_EXPONENT_MAX = 40
"""``away`` beyond this doubles the back-off no further (2^40 × the smallest base is far past
any cap; the cap applies anyway): keeps ``power(2, away)`` finite however long the outage."""


async def settle(db: Database) -> tuple[int, list[Change]]:
    """Terminal runs whose cleanup is pending and that hold nothing unresolved become
    ``complete`` (never over ``incomplete``)."""
    async with db.connect() as conn:
        result = await rows(conn, f"""
            WITH changed AS (
                UPDATE runs r SET cleanup_status = 'complete', updated_at = now()
                WHERE r.status = ANY(:terminal) AND r.cleanup_status = 'pending'
                  AND NOT EXISTS (SELECT 1 FROM resources s WHERE s.run_id = r.run_id AND s.status = ANY(:unresolved))
                RETURNING *
            ), logged AS (
                INSERT INTO run_log (run_id, kind, detail)
                SELECT run_id, 'cleanup.settled', '{{"by": "sweep"}}'::jsonb FROM changed
            ), {run_events('changed', "'cleanup.settled'")}""",
                              {"terminal": list(RUN_TERMINAL), "unresolved": list(UNRESOLVED)})
    return len(result), run_changes(result)


async def candidates(db: Database, limit: int) -> list[str]:
    """Terminal runs whose cleanup is pending and that still hold unresolved rows, oldest
    change first (a run whose rows are all beyond the sweep is a candidate too, so that its
    finish marks it ``incomplete``). A run whose unresolved rows are all backing off (their
    give-back met nobody, ``retry_at`` ahead) is not a candidate until the first of them is
    due: sweeping it would claim nothing and only log ``cleanup.swept`` again."""
    async with db.connect() as conn:
        result = await rows(conn, f"""
            SELECT r.run_id FROM runs r
            WHERE r.status = ANY(:terminal) AND r.cleanup_status = 'pending'
              AND EXISTS (SELECT 1 FROM resources s WHERE s.run_id = r.run_id AND s.status = ANY(:unresolved)
                                                      AND NOT {_BACKING_OFF})
            ORDER BY r.updated_at, r.run_id LIMIT :limit""",
                              {"terminal": list(RUN_TERMINAL), "unresolved": list(UNRESOLVED),
                               "revertable": list(REVERTABLE), "limit": limit})
    return [row.run_id for row in result]


async def claim(db: Database, run_id: str, max_attempts: int, limit: int, claim_timeout_s: float,
                budget: int = PAGE_BYTES) -> tuple[dict, list[Change], bool]:
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
    async with db.connect() as conn:
        run = await run_or_not_found(conn, run_id)
        if run["status"] not in RUN_TERMINAL:
            raise Conflict(f"run {run_id!r} is {run['status']}; its resources are given back only once it is over")
        result = await rows(conn, f"""
            WITH candidates AS (
                SELECT s.id, octet_length({resource_json('s')}::text) + :slack AS bytes FROM resources s
                WHERE s.run_id = :run_id AND (
                    (s.status = ANY(:revertable) AND s.attempts < :max_attempts AND NOT s.gave_up
                     AND NOT {_BACKING_OFF})
                    OR (s.status = 'reverting' AND s.claimed_at < now() - make_interval(secs => :timeout)))
                ORDER BY s.id LIMIT :candidates FOR UPDATE SKIP LOCKED
            ), sized AS (
                SELECT id, row_number() OVER w AS n, sum(bytes) OVER w AS upto
                FROM candidates WINDOW w AS (ORDER BY id)
            ), picked AS (
                SELECT id FROM sized WHERE n <= :limit AND (n = 1 OR upto <= :budget)
            ), changed AS (
                UPDATE resources s SET status = 'reverting', claimed_at = now(), updated_at = now(),
                       previous_status = CASE WHEN s.status = 'reverting' THEN s.previous_status ELSE s.status END
                FROM picked WHERE s.id = picked.id
                RETURNING s.*
            ), logged AS (
                INSERT INTO run_log (run_id, resource_id, kind, detail)
                SELECT run_id, id, 'cleanup.claimed', jsonb_build_object('from', previous_status) FROM changed
            ), {resource_events_cte('changed', "'cleanup.claimed'")}
            SELECT id AS event_id, type, run, resource,
                   (SELECT count(*) FROM candidates) > (SELECT count(*) FROM picked) AS more
            FROM events ORDER BY id""",
                              {"run_id": run_id, "revertable": list(REVERTABLE), "max_attempts": max_attempts,
                               "timeout": float(claim_timeout_s), "limit": limit, "candidates": limit + 1,
                               "slack": CLAIM_ROW_SLACK, "budget": budget})
    changes = resource_changes(result)
    return run, changes, bool(result and result[0].more)


async def reverted(db: Database, resource_id: int) -> tuple[dict, list[Change]]:
    """The give-back succeeded: ``reverting → reverted``."""
    return await transition(db, resource_id, statuses.REVERTED)


async def drifted(db: Database, resource_id: int, error: str | None) -> tuple[dict, list[Change]]:
    """Somebody changed it deliberately: ``reverting → drifted``, left alone from now on."""
    return await transition(db, resource_id, statuses.DRIFTED, error)


async def failed(db: Database, resource_id: int, error: str, transient: bool) -> tuple[dict, list[Change]]:
    """The give-back failed: back to the status before the claim with ``attempts + 1``; a
    refusal (not transient) also spends the row's attempts."""
    step = statuses.FAILED
    async with db.connect() as conn:
        result = await rows(conn, f"""
            WITH changed AS (
                UPDATE resources SET status = COALESCE(previous_status, 'confirmed'), previous_status = NULL,
                       attempts = attempts + 1, gave_up = gave_up OR NOT :transient, last_error = :error,
                       claimed_at = NULL, updated_at = now()
                WHERE id = :id AND status = ANY(:allowed)
                RETURNING *
            ), logged AS (
                INSERT INTO run_log (run_id, resource_id, kind, detail)
                SELECT run_id, id, :log_kind, jsonb_build_object('error', last_error, 'transient', :transient,
                                                                 'attempts', attempts)
                FROM changed
            ), {resource_events('changed', ':log_kind')}""",
                              {"id": resource_id, "allowed": list(step.allowed), "transient": transient,
                               "error": error[:ERROR_MAX], "log_kind": step.log_kind})
        if not result:
            raise await resource_or_conflict(conn, resource_id, "a failed give-back", step.allowed)
    changes = resource_changes(result)
    return changes[0].resource, changes


_OUTCOME_LOG_KINDS = {"reverted": statuses.REVERTED.log_kind, "drifted": statuses.DRIFTED.log_kind,
                      "failed": statuses.FAILED.log_kind, "transient": statuses.FAILED.log_kind,
                      "away": AWAY_LOG_KIND}
"""The run-log kind each verdict writes (the same entries as the one-row requests; ``away``
has no one-row request)."""


async def outcomes(db: Database, given: list[tuple[int, str, str | None]], away_backoff_s: float = 2.0,
                   away_backoff_max_s: float = 60.0) -> tuple[dict[str, Any], list[Change]]:
    """Record a batch of give-back outcomes ``(resource id, verdict, error)`` in one statement.

    Each row's transition is the same guarded step as its one-row request (``reverted``,
    ``drifted``, ``failed``; ``transient`` is a failure that does not give up on the row),
    from ``reverting`` only. ``away`` (nobody answered) returns the row to its previous status
    *without* spending an attempt, counts ``away + 1`` and sets ``retry_at`` to now +
    min(``away_backoff_max_s``, ``away_backoff_s`` × 2^away) seconds (``away`` as it was: the
    first miss waits the base); every other verdict sets ``away`` to 0 and clears ``retry_at``.
    One commit for the batch instead of one per row. Rows that were not ``reverting`` (another
    sweeper recorded them first) are listed as conflicts with their status, unknown ids as
    missing; the rest of the batch still lands."""
    ids = [row_id for row_id, _, _ in given]
    async with db.connect() as conn:
        result = await rows(conn, f"""
            WITH given AS (
                SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:verdicts AS text[]), CAST(:errors AS text[]),
                                     CAST(:log_kinds AS text[])) AS g(id, verdict, error, log_kind)
            ), changed AS (
                UPDATE resources s SET
                       status = CASE g.verdict WHEN 'reverted' THEN 'reverted' WHEN 'drifted' THEN 'drifted'
                                ELSE COALESCE(s.previous_status, 'confirmed') END,
                       previous_status = CASE WHEN g.verdict IN ('failed', 'transient', 'away') THEN NULL
                                         ELSE s.previous_status END,
                       attempts = s.attempts + CASE WHEN g.verdict IN ('failed', 'transient') THEN 1 ELSE 0 END,
                       gave_up = s.gave_up OR g.verdict = 'failed',
                       away = CASE WHEN g.verdict = 'away' THEN s.away + 1 ELSE 0 END,
                       retry_at = CASE WHEN g.verdict = 'away' THEN now() + make_interval(secs => least(
                                      CAST(:backoff_max AS double precision),
                                      CAST(:backoff AS double precision) * power(2, least(s.away, :exponent_max))))
                                  END,
                       last_error = COALESCE(g.error, s.last_error), claimed_at = NULL, updated_at = now()
                FROM given g WHERE s.id = g.id AND s.status = 'reverting'
                RETURNING s.*, g.verdict, g.error AS given_error, g.log_kind
            ), logged AS (
                INSERT INTO run_log (run_id, resource_id, kind, detail)
                SELECT run_id, id, log_kind, CASE WHEN verdict IN ('reverted', 'drifted')
                    THEN jsonb_build_object('status', status, 'error', given_error)
                    WHEN verdict = 'away'
                    THEN jsonb_build_object('error', last_error, 'away', away, 'retryAt', retry_at,
                                            'attempts', attempts)
                    ELSE jsonb_build_object('error', last_error, 'transient', verdict = 'transient',
                                            'attempts', attempts) END
                FROM changed
            ), {resource_events_cte('changed', 'c.log_kind')}
            SELECT e.id AS event_id, e.type, e.run, e.resource, NULL::text AS status, e.resource_id AS id FROM events e
            UNION ALL
            SELECT NULL, NULL, NULL, NULL, s.status, s.id FROM resources s
            WHERE s.id = ANY(CAST(:ids AS bigint[])) AND s.id NOT IN (SELECT id FROM changed)
            ORDER BY id""",
                              {"ids": ids, "verdicts": [verdict for _, verdict, _ in given],
                               "errors": [None if error is None else error[:ERROR_MAX] for _, _, error in given],
                               "log_kinds": [_OUTCOME_LOG_KINDS[verdict] for _, verdict, _ in given],
                               "backoff": float(away_backoff_s), "backoff_max": float(away_backoff_max_s),
                               "exponent_max": AWAY_EXPONENT_MAX})
    changes = resource_changes([row for row in result if row.run])
    conflicts = [{"resourceId": row.id, "status": row.status} for row in result if not row.run]
    known = {row.id for row in result}
    return {"recorded": [row.id for row in result if row.run], "conflicts": conflicts,
            "missing": [row_id for row_id in ids if row_id not in known]}, changes


async def finish(db: Database, run_id: str, max_attempts: int,
                 summary: dict[str, Any]) -> tuple[dict, list[Change]]:
    """End a sweep of the run: log ``cleanup.swept`` with ``summary``, then its cleanup is
    ``complete`` with nothing unresolved, ``incomplete`` when nothing left is within the
    sweep's reach (drifted, refused, attempts spent), else it stays ``pending``."""
    async with db.connect() as conn:
        run = await run_or_not_found(conn, run_id)
        if run["status"] not in RUN_TERMINAL:
            raise Conflict(f"run {run_id!r} is {run['status']}; a sweep finishes only a run that is over")
        row = await first(conn, f"""
            WITH left_over AS (
                SELECT count(*) FILTER (WHERE s.status = ANY(:unresolved)) AS unresolved,
                       count(*) FILTER (WHERE {_ACTIONABLE}) AS actionable
                FROM resources s WHERE s.run_id = :run_id
            ), changed AS (
                UPDATE runs r SET updated_at = now(),
                       cleanup_status = CASE WHEN left_over.unresolved = 0 THEN 'complete'
                                             WHEN left_over.actionable = 0 THEN 'incomplete'
                                             ELSE 'pending' END
                FROM left_over WHERE r.run_id = :run_id AND r.cleanup_status = 'pending'
                RETURNING r.*
            ), logged AS (
                INSERT INTO run_log (run_id, kind, detail)
                SELECT :run_id, 'cleanup.swept', CAST(:summary AS jsonb) || jsonb_build_object(
                    'unresolved', left_over.unresolved, 'actionable', left_over.actionable,
                    'cleanupStatus', COALESCE((SELECT cleanup_status FROM changed), :before))
                FROM left_over
            ), events AS (
                INSERT INTO ledger_outbox (run_id, type, run)
                SELECT r.run_id, 'cleanup.swept', COALESCE((SELECT {run_json('c')} FROM changed c), {run_json('r')})
                FROM runs r WHERE r.run_id = :run_id
                RETURNING id
            )
            SELECT (SELECT {run_json('c')}::text FROM changed c) AS run, (SELECT id FROM events) AS event_id""",
                          {"run_id": run_id, "unresolved": list(UNRESOLVED), "revertable": list(REVERTABLE),
                           "max_attempts": max_attempts, "summary": json.dumps(summary),
                           "before": run["cleanupStatus"]})
    after = as_json(row.run) if row.run is not None else run
    return after, [Change("cleanup.swept", after, None, row.event_id)]


async def waiting(db: Database, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Runs waiting for their shard (or a module): finished runs whose cleanup is pending and
    that hold rows whose last give-back met nobody (``away`` > 0, not yet given back), each
    with its shard, how many such rows, when the first of them is due again (``retryAt``;
    past when the next sweep is due to try) and the most misses in a row (``away``); the
    run due first comes first. The second value says whether more runs wait than listed."""
    async with db.connect() as conn:
        result = await rows(conn, """
            SELECT json_build_object('runId', r.run_id, 'shard', r.shard, 'rows', w.rows,
                                     'retryAt', w.retry_at, 'away', w.away)::text AS run
            FROM runs r
            CROSS JOIN LATERAL (
                SELECT count(*) AS rows, min(s.retry_at) AS retry_at, max(s.away) AS away
                FROM resources s
                WHERE s.run_id = r.run_id AND s.status = ANY(:waiting) AND s.away > 0
            ) w
            WHERE r.status = ANY(:terminal) AND r.cleanup_status = 'pending' AND w.rows > 0
            ORDER BY w.retry_at NULLS LAST, r.run_id LIMIT :limit""",
                              {"waiting": [*REVERTABLE, "reverting"], "terminal": list(RUN_TERMINAL),
                               "limit": limit + 1})
    runs = [as_json(row.run) for row in result]
    return runs[:limit], len(runs) > limit


async def retry(db: Database, run_id: str) -> tuple[dict, list[Change]]:
    """A person's retry of an ``incomplete`` run: attempts reset, cleanup back to ``pending``."""
    async with db.connect() as conn:
        row = await first(conn, f"""
            WITH changed AS (
                UPDATE runs SET cleanup_status = 'pending', updated_at = now()
                WHERE run_id = :run_id AND cleanup_status = 'incomplete'
                RETURNING *
            ), reset AS (
                UPDATE resources SET attempts = 0, gave_up = false, away = 0, retry_at = NULL, updated_at = now()
                WHERE run_id IN (SELECT run_id FROM changed) AND status = ANY(:unresolved)
                RETURNING id
            ), logged AS (
                INSERT INTO run_log (run_id, kind, detail)
                SELECT run_id, 'cleanup.retried', jsonb_build_object('reset', (SELECT count(*) FROM reset))
                FROM changed
            ), {run_events('changed', "'cleanup.retried'")}""",
                          {"run_id": run_id, "unresolved": list(UNRESOLVED)})
        if row is None:
            run = await run_or_not_found(conn, run_id)
            last_kind = (await first(conn, "SELECT kind FROM run_log WHERE run_id = :id AND kind IN ('cleanup.retried', 'cleanup.swept') "
                                     "ORDER BY id DESC LIMIT 1", {"id": run_id}) or {}).get("kind")
            if statuses.is_retry_replay(run["cleanupStatus"], last_kind):
                return run, []  # the same retry again (its reply was lost): 200, nothing changes
            raise Conflict(f"run {run_id!r} cleanup is {run['cleanupStatus']}; only an incomplete cleanup is retried")
    change = run_changes([row])[0]
    return change.run, [change]
