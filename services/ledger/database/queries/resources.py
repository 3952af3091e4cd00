"""A resource's statements (``services/ledger/resources.py``, and ``batches.py`` for the batch
forms ADD_RESOURCES and TRANSITIONS): reserve or record it, confirm or fail it, find its key
or its target's holder, tell a replay from a conflict, reconcile a module's rows."""

from __future__ import annotations

from services.ledger.database.queries.fragments import TARGET_DETAIL, resource_events, resource_json
from services.ledger.database.queries.statement import Statement, compose


def _added() -> str:
    """The end of a statement adding resources (CTE ``inserted``): its run's cleanup reopened if
    it was complete (statuses.REOPEN), and each row's log entry, its event (ADD_RESOURCE,
    ADD_RESOURCES)."""
    return compose("""reopened AS (
            UPDATE runs SET cleanup_status = :reopen_to, updated_at = now()
            WHERE run_id IN (SELECT run_id FROM inserted) AND cleanup_status = ANY(:reopen_from)
            RETURNING run_id
        ), $events""", events=resource_events(
        "inserted", "jsonb_build_object('status', c.status, 'module', c.module, 'kind', c.kind, 'ref', c.ref)"))


_ADDED = _added()

ADD_RESOURCE = Statement("ADD_RESOURCE", """
    Reserve or record a resource (status :status: statuses.RESERVE or RECORD) of a run that
    exists (and, when :open_only, is not over), unless its idempotency key was used; log it, and
    reopen the run's cleanup if it was complete (statuses.REOPEN). A live row already holding
    the target makes it fail on uq_resources_live_target.""", compose("""
    WITH inserted AS (
        INSERT INTO resources (run_id, module, kind, ref, status, lease_deadline, revert, idempotency_key)
        SELECT CAST(:run_id AS text), CAST(:module AS text), CAST(:kind AS text), CAST(:ref AS text),
               CAST(:status AS text), CAST(:deadline AS bigint), CAST(:revert AS jsonb), CAST(:key AS text)
        FROM runs WHERE run_id = CAST(:run_id AS text) AND NOT (:open_only AND status = ANY(:terminal))
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING *
    ), $added""", added=_ADDED))

KEY_USED = Statement("KEY_USED", "Whether a resource holds the idempotency key :key.", """
    SELECT 1 FROM resources WHERE idempotency_key = :key""")

RESOURCE_BY_KEY = Statement("RESOURCE_BY_KEY", "The wire JSON of the resource holding idempotency key :key.",
                            compose("""
    SELECT $resource::text AS resource FROM resources s WHERE idempotency_key = :key""",
                                    resource=resource_json("s")))

TARGET_HOLDER = Statement("TARGET_HOLDER", "The live row (status in :live) holding the target (module, kind, ref).", """
    SELECT id, status, run_id FROM resources
    WHERE module = :module AND kind = :kind AND ref = :ref AND status = ANY(:live)""")

TRANSITION = Statement("TRANSITION", """
    One guarded resource transition to a fixed status (confirm, fail): the row :id moves to :to
    if its status is one of :allowed, with its log entry and event; nothing otherwise.""", compose("""
    WITH changed AS (
        UPDATE resources SET status = :to, updated_at = now(),
               last_error = COALESCE(:error, last_error), claimed_at = NULL
        WHERE id = :id AND status = ANY(:allowed)
        RETURNING *
    ), $events""", events=resource_events("changed",
                                          "jsonb_build_object('status', c.status, 'error', CAST(:error AS text))")))

ADD_RESOURCES = Statement("ADD_RESOURCES", """
    ADD_RESOURCE for a batch (services/ledger/serving/batches.py): one row of the unnest arrays per
    resource, all of status :status, each inserted, logged and its run's cleanup reopened exactly
    as ADD_RESOURCE does it alone. A row whose key was used, or whose run is missing (or over,
    when :open_only), is not inserted and not returned; its request is answered alone. A live
    row already holding a target fails the whole statement (uq_resources_live_target).""", compose("""
    WITH given AS (
        SELECT * FROM unnest(CAST(:run_ids AS text[]), CAST(:modules AS text[]), CAST(:kinds AS text[]),
                             CAST(:refs AS text[]), CAST(:deadlines AS bigint[]), CAST(:reverts AS text[]),
                             CAST(:keys AS text[])) WITH ORDINALITY
            AS g(run_id, module, kind, ref, deadline, revert, key, n)
    ), inserted AS (
        INSERT INTO resources (run_id, module, kind, ref, status, lease_deadline, revert, idempotency_key)
        SELECT g.run_id, g.module, g.kind, g.ref, CAST(:status AS text), g.deadline, CAST(g.revert AS jsonb), g.key
        FROM given g JOIN runs r ON r.run_id = g.run_id
        WHERE NOT (:open_only AND r.status = ANY(:terminal))
        ORDER BY g.n
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING *
    ), $added""", added=_ADDED))

TRANSITIONS = Statement("TRANSITIONS", """
    TRANSITION for a batch (services/ledger/serving/batches.py): each row :ids (with its error of
    :errors) moves to :to if its status is one of :allowed, with its log entry and event, as
    TRANSITION does it alone. Rows elsewhere, and unknown ids, are not returned; their requests
    are answered alone.""", compose("""
    WITH given AS (
        SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[])) AS g(id, error)
    ), changed AS (
        UPDATE resources s SET status = :to, updated_at = now(),
               last_error = COALESCE(g.error, s.last_error), claimed_at = NULL
        FROM given g WHERE s.id = g.id AND s.status = ANY(:allowed)
        RETURNING s.*, g.error AS given_error
    ), $events""", events=resource_events("changed", "jsonb_build_object('status', c.status, 'error', c.given_error)")))

REPLAY_STATE = Statement("REPLAY_STATE", """
    Why a guarded transition changed nothing: the row's status, stored error, wire JSON and
    latest log kind (statuses.is_replay), or no row at all.""", compose("""
    SELECT s.status, s.last_error, $resource::text AS resource,
           (SELECT l.kind FROM run_log l WHERE l.run_id = s.run_id AND l.resource_id = s.id
            ORDER BY l.id DESC LIMIT 1) AS last_kind
    FROM resources s WHERE s.id = :id""", resource=resource_json("s")))

RECONCILE = Statement("RECONCILE", """
    The module's rows of the run (and kind, if given) in :allowed whose ref is not in :present
    move to :to (statuses.ORPHAN), each with its log entry and event.""", compose("""
    WITH changed AS (
        UPDATE resources SET status = :to, updated_at = now()
        WHERE run_id = :run_id AND module = :module AND (CAST(:kind AS text) IS NULL OR kind = :kind)
          AND status = ANY(:allowed) AND NOT (ref = ANY(:present))
        RETURNING *
    ), $events""", events=resource_events("changed", TARGET_DETAIL)))
