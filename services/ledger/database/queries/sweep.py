"""The sweep's statements (``services/ledger/sweep.py``, and ``batches.py`` for OUTCOMES): settle,
pick candidate runs, claim rows for a give-back, record outcomes, finish, list runs waiting for
their shard, a person's retry."""

from __future__ import annotations

from services.ledger import statuses
from services.ledger.database.queries.fragments import (
    SETTLE_RUNS,
    SETTLED_BY,
    resource_events_cte,
    resource_json,
    run_events,
    run_json,
)
from services.ledger.database.queries.statement import Statement, compose

BACKING_OFF = "(s.status = ANY(:revertable) AND s.retry_at IS NOT NULL AND s.retry_at > now())"
"""A row of ``s`` waiting for its shard or module (its give-back met nobody): not claimed
before ``retry_at``."""

ACTIONABLE = ("((s.status = ANY(:revertable) AND s.attempts < :max_attempts AND NOT s.gave_up)"
              " OR s.status = ANY(:in_flight))")
"""A row of ``s`` a sweep can still act on: revertable with attempts left, or in flight. A row
backing off is one: no attempt was spent, so its run stays ``pending``."""

SETTLE = Statement("SETTLE", """
    Terminal runs whose cleanup is in :allowed and that hold nothing unresolved move their
    cleanup to :to (statuses.SETTLE), logged with {"by": :by}.""",
                   compose(SETTLE_RUNS, which="", events=run_events("changed", SETTLED_BY)))

CANDIDATES = Statement("CANDIDATES", """
    Terminal runs whose cleanup is sweepable and that hold an unresolved row not backing off,
    oldest change first.""", compose("""
    SELECT r.run_id FROM runs r
    WHERE r.status = ANY(:terminal) AND r.cleanup_status = ANY(:sweepable)
      AND EXISTS (SELECT 1 FROM resources s WHERE s.run_id = r.run_id AND s.status = ANY(:unresolved)
                                              AND NOT $backing_off)
    ORDER BY r.updated_at, r.run_id LIMIT :limit""", backing_off=BACKING_OFF))

CLAIM = Statement("CLAIM", """
    Take rows of the run for a give-back, in id order, FOR UPDATE SKIP LOCKED: revertable rows
    (:revertable, statuses.CLAIM) with attempts left and no back-off ahead, and rows in flight
    (:stale, statuses.RECLAIM) claimed more than :timeout seconds ago; at most :limit rows
    whose JSON (plus :slack bytes each) adds up to at most :budget (always the first). Each
    moves to :to remembering its status (a reclaimed row keeps the one it remembered), with its
    log entry and event; "more" says whether claimable rows were left.""", compose("""
    WITH candidates AS (
        SELECT s.id, octet_length($resource::text) + :slack AS bytes FROM resources s
        WHERE s.run_id = :run_id AND (
            (s.status = ANY(:revertable) AND s.attempts < :max_attempts AND NOT s.gave_up
             AND NOT $backing_off)
            OR (s.status = ANY(:stale) AND s.claimed_at < now() - make_interval(secs => :timeout)))
        ORDER BY s.id LIMIT :candidates FOR UPDATE SKIP LOCKED
    ), sized AS (
        SELECT id, row_number() OVER w AS n, sum(bytes) OVER w AS upto
        FROM candidates WINDOW w AS (ORDER BY id)
    ), picked AS (
        SELECT id FROM sized WHERE n <= :limit AND (n = 1 OR upto <= :budget)
    ), changed AS (
        UPDATE resources s SET status = :to, claimed_at = now(), updated_at = now(),
               previous_status = CASE WHEN s.status = ANY(:stale) THEN s.previous_status ELSE s.status END
        FROM picked WHERE s.id = picked.id
        RETURNING s.*
    ), $events
    SELECT id AS event_id, type, run, resource,
           (SELECT count(*) FROM candidates) > (SELECT count(*) FROM picked) AS more
    FROM events ORDER BY id""", resource=resource_json("s"), backing_off=BACKING_OFF,
                                                   events=resource_events_cte(
                                                       "changed", "jsonb_build_object('from', c.previous_status)")))

OUTCOME_DETAIL = """CASE
            WHEN c.to_status IS NOT NULL THEN jsonb_build_object('status', c.status, 'error', c.given_error)
            WHEN c.counts_away THEN jsonb_build_object('error', c.last_error, 'away', c.away, 'retryAt', c.retry_at,
                                                       'attempts', c.attempts)
            ELSE jsonb_build_object('error', c.last_error, 'transient', NOT c.gives_up, 'attempts', c.attempts) END"""
"""The log detail of a recorded outcome: the status reached, or the miss and its back-off, or
the failure and what it spent."""

OUTCOMES = Statement("OUTCOMES", """
    Record give-back outcomes, one row of the unnest arrays per resource, each row carrying its
    rule from statuses.OUTCOMES (or a one-row subject's): its target (NULL: back to the status
    before the claim, else :fallback; :displaced instead of a :live status that another live row
    of the target holds now), whether it spends an attempt, gives up, counts a
    give-back that met nobody (away + 1, retry_at = now + min(:backoff_max, :backoff ×
    2^min(away, :exponent_max)), away_since = now on the first miss in a row) or clears that
    count (and away_since), and its log kind. Only rows in :allowed
    change, each with its log entry and event; the others come back with their status (a
    conflict), unknown ids not at all (missing).""", compose("""
    WITH given AS (
        SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[]), CAST(:tos AS text[]),
                             CAST(:spends AS integer[]), CAST(:gives_up AS boolean[]),
                             CAST(:counts_away AS boolean[]), CAST(:clears_away AS boolean[]),
                             CAST(:log_kinds AS text[]))
            AS g(id, error, to_status, spends, gives_up, counts_away, clears_away, log_kind)
    ), changed AS (
        UPDATE resources s SET
               status = CASE
                   WHEN g.to_status IS NOT NULL THEN g.to_status
                   WHEN COALESCE(s.previous_status, :fallback) = ANY(:live) AND EXISTS (
                       SELECT 1 FROM resources h WHERE h.module = s.module AND h.kind = s.kind
                          AND h.ref = s.ref AND h.id <> s.id AND $held) THEN :displaced
                   ELSE COALESCE(s.previous_status, :fallback) END,
               previous_status = CASE WHEN g.to_status IS NULL THEN NULL ELSE s.previous_status END,
               attempts = s.attempts + g.spends,
               gave_up = s.gave_up OR g.gives_up,
               away = CASE WHEN g.counts_away THEN s.away + 1 WHEN g.clears_away THEN 0 ELSE s.away END,
               retry_at = CASE WHEN g.counts_away THEN now() + make_interval(secs => least(
                                   CAST(:backoff_max AS double precision),
                                   CAST(:backoff AS double precision) * power(2, least(s.away, :exponent_max))))
                               WHEN g.clears_away THEN NULL ELSE s.retry_at END,
               away_since = CASE WHEN g.counts_away THEN COALESCE(CASE WHEN s.away > 0 THEN s.away_since END, now())
                                 WHEN g.clears_away THEN NULL ELSE s.away_since END,
               last_error = COALESCE(g.error, s.last_error), claimed_at = NULL, updated_at = now()
        FROM given g WHERE s.id = g.id AND s.status = ANY(:allowed)
        RETURNING s.*, g.error AS given_error, g.to_status, g.gives_up, g.counts_away, g.log_kind
    ), $events
    SELECT e.id AS event_id, e.type, e.run, e.resource, NULL::text AS status, e.resource_id AS id FROM events e
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, s.status, s.id FROM resources s
    WHERE s.id = ANY(CAST(:ids AS bigint[])) AND s.id NOT IN (SELECT id FROM changed)
    ORDER BY id""", events=resource_events_cte("changed", OUTCOME_DETAIL, "c.log_kind"),
    # Generated, not a parameter: the holder is found through uq_resources_live_target's predicate.
    held=statuses.sql_one_of("h.status", statuses.LIVE)))

RUN_TO_FINISH = Statement("RUN_TO_FINISH", """
    The run's wire JSON, its row locked until the transaction ends: a finish reads the cleanup
    status it starts from and changes it as one step, so a second finish racing it reads what
    the first committed, not what was there before (none: no such run).""", compose("""
    SELECT $run::text AS run FROM runs r WHERE run_id = :id FOR UPDATE""", run=run_json("r")))

FINISH = Statement("FINISH", """
    End a sweep of the run: if its cleanup is in :allowed it becomes :clean with nothing
    unresolved left, :stuck with nothing left in the sweep's reach, else :unfinished
    (statuses.FINISH); a log entry (the summary, the counts, the cleanup status after, :before
    if it did not change) and an event either way.""", compose("""
    WITH left_over AS (
        SELECT count(*) FILTER (WHERE s.status = ANY(:unresolved)) AS unresolved,
               count(*) FILTER (WHERE $actionable) AS actionable
        FROM resources s WHERE s.run_id = :run_id
    ), changed AS (
        UPDATE runs r SET updated_at = now(),
               cleanup_status = CASE WHEN left_over.unresolved = 0 THEN :clean
                                     WHEN left_over.actionable = 0 THEN :stuck
                                     ELSE :unfinished END
        FROM left_over WHERE r.run_id = :run_id AND r.cleanup_status = ANY(:allowed)
        RETURNING r.*
    ), events AS (
        INSERT INTO run_log (run_id, kind, detail, run)
        SELECT :run_id, :log_kind, CAST(:summary AS jsonb) || jsonb_build_object(
            'unresolved', left_over.unresolved, 'actionable', left_over.actionable,
            'cleanupStatus', COALESCE((SELECT cleanup_status FROM changed), :before)),
            (SELECT COALESCE((SELECT $changed_run FROM changed c), $run) FROM runs r WHERE r.run_id = :run_id)
        FROM left_over
        RETURNING id, run IS NOT NULL AS is_event
    )
    SELECT (SELECT $changed_run::text FROM changed c) AS run, (SELECT id FROM events WHERE is_event) AS event_id""",
                                                     actionable=ACTIONABLE, changed_run=run_json("c"),
                                                     run=run_json("r")))

WAITING = Statement("WAITING", """
    Terminal runs whose cleanup is sweepable and that hold rows (status in :waiting) whose last
    give-back met nobody (away > 0): shard, how many, first due, most misses, waiting since
    (the earliest first miss in a row; a row from before revision 0006 without one counts from
    its last change); due first first. Only :run_id when given; only runs waiting more than
    :longer_than seconds when given.""",
                    """
    SELECT json_build_object('runId', r.run_id, 'shard', r.shard, 'rows', w.rows,
                             'retryAt', w.retry_at, 'away', w.away, 'waitingSince', w.since)::text AS run
    FROM runs r
    CROSS JOIN LATERAL (
        SELECT count(*) AS rows, min(s.retry_at) AS retry_at, max(s.away) AS away,
               min(COALESCE(s.away_since, s.updated_at)) AS since
        FROM resources s
        WHERE s.run_id = r.run_id AND s.status = ANY(:waiting) AND s.away > 0
    ) w
    WHERE r.status = ANY(:terminal) AND r.cleanup_status = ANY(:sweepable) AND w.rows > 0
      AND (CAST(:run_id AS text) IS NULL OR r.run_id = :run_id)
      AND (CAST(:longer_than AS double precision) IS NULL
           OR w.since < now() - make_interval(secs => CAST(:longer_than AS double precision)))
    ORDER BY w.retry_at NULLS LAST, r.run_id LIMIT :limit""")

RETRY = Statement("RETRY", """
    A person's retry: the run's cleanup moves from :allowed to :to (statuses.RETRY) and its
    unresolved rows get their attempts back (no give-up, no back-off), with its log entry and
    event.""", compose("""
    WITH changed AS (
        UPDATE runs SET cleanup_status = :to, updated_at = now()
        WHERE run_id = :run_id AND cleanup_status = ANY(:allowed)
        RETURNING *
    ), reset AS (
        UPDATE resources SET attempts = 0, gave_up = false, away = 0, retry_at = NULL, away_since = NULL,
                             updated_at = now()
        WHERE run_id IN (SELECT run_id FROM changed) AND status = ANY(:unresolved)
        RETURNING id
    ), $events""", events=run_events("changed", "jsonb_build_object('reset', (SELECT count(*) FROM reset))")))

RETRY_WAITING = Statement("RETRY_WAITING", """
    A person's retry of a run waiting for its shard or module (terminal, cleanup in :sweepable,
    holding rows in :waiting whose give-back met nobody): those rows' back-off is cleared
    (retry_at NULL: the next claim takes them at once; their misses and waiting-since stay until
    an answer), with the run's log entry (:log_kind, how many came due) and event. The run itself
    is left as it is (its place among the candidates too).""", compose("""
    WITH changed AS (
        SELECT r.* FROM runs r
        WHERE r.run_id = :run_id AND r.status = ANY(:terminal) AND r.cleanup_status = ANY(:sweepable)
          AND EXISTS (SELECT 1 FROM resources s WHERE s.run_id = r.run_id AND s.status = ANY(:waiting)
                                                  AND s.away > 0)
        FOR UPDATE
    ), due AS (
        UPDATE resources s SET retry_at = NULL
        WHERE s.run_id IN (SELECT run_id FROM changed) AND s.status = ANY(:waiting) AND s.away > 0
          AND s.retry_at IS NOT NULL
        RETURNING s.id
    ), $events""", events=run_events("changed", "jsonb_build_object('dueNow', (SELECT count(*) FROM due))")))

LAST_LOG_KIND = Statement("LAST_LOG_KIND", "The run's latest log kind among :kinds (none: no such entry).", """
    SELECT kind FROM run_log WHERE run_id = :run_id AND kind = ANY(:kinds) ORDER BY id DESC LIMIT 1""")
