"""A run's statements (``services/ledger/runs.py``): create it, move its status."""

from __future__ import annotations

from services.ledger.database.queries.fragments import run_events
from services.ledger.database.queries.statement import Statement, compose

CREATE_RUN = Statement("CREATE_RUN", """
    A new run (status and cleanup status: the columns' defaults) with its run.created entry and
    event; nothing when the run id exists (the caller then reads it: a repeat or a 409).""", compose("""
    WITH created AS (
        INSERT INTO runs (run_id, shard, event, starts_at, ends_at)
        VALUES (:run_id, :shard, :event, CAST(:starts_at AS bigint), CAST(:ends_at AS bigint))
        ON CONFLICT (run_id) DO NOTHING RETURNING *
    ), $events""", events=run_events("created", "jsonb_build_object('shard', c.shard, 'event', c.event)")))

SET_RUN_STATUS = Statement("SET_RUN_STATUS", """
    Move the run to :to if its status is one of :allowed (statuses.RUN_STATUS_FROM), stamping
    ended_at when :terminal; with its log entry and event. Nothing when the run is elsewhere.""", compose("""
    WITH changed AS (
        UPDATE runs SET status = :to, updated_at = now(),
               ended_at = CASE WHEN :terminal THEN now() ELSE ended_at END
        WHERE run_id = :run_id AND status = ANY(:allowed)
        RETURNING *
    ), $events""", events=run_events("changed", "jsonb_build_object('status', c.status)")))
