"""Resources a run holds: reserve (pending) or record (confirmed) one — idempotent on its
key, refused while its target is held by a live row — then confirm, fail or orphan it.
Each change is one guarded statement that also writes its run-log entry."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from services.ledger import statuses, store
from services.ledger.statuses import RUN_TERMINAL, Transition
from services.ledger.store import (Database, Change, Conflict, NotFound, as_json, conflict, first,
                                   resource_changes, rows, run_json, run_or_not_found)
from services.ledger.tables import ERROR_MAX

LIVE_TARGET_INDEX = "uq_resources_live_target"
"""The partial unique index that holds a target for one live row."""

REVERT_INLINE_MAX = 64 * 1024
"""The largest stored ``revert`` a reply or an update event carries (bytes as PostgreSQL prints
it). Requests are capped far lower (``requests.REVERT_MAX_BYTES``, 8 KiB), so only a row written
before that cap can pass this: its revert is left out (``"revert": null``) and
``"revertOmitted"`` gives its size, so that one row never outgrows a NATS message. The revert
itself stays in the database, whole."""


def resource_json(alias: str) -> str:
    """SQL rendering the resource row ``alias`` as its wire JSON (``store.resource_json``), but
    with a revert over :data:`REVERT_INLINE_MAX` left out and sized. Every reply and event
    renders rows through this."""
    whole = store.resource_json(alias)
    field = f"'revert', {alias}.revert"
    if whole.count(field) != 1:  # pragma: no cover - store.resource_json changed shape
        raise RuntimeError("store.resource_json no longer renders the revert as expected")
    size = f"octet_length({alias}.revert::text)"
    omitted = whole.replace(field, f"'revert', NULL, 'revertOmitted', {size}")
    return f"(CASE WHEN {size} <= {REVERT_INLINE_MAX} THEN {whole} ELSE {omitted} END)"


def resource_events_cte(source: str, type_sql: str) -> str:
    """SQL: a CTE ``events`` writing one outbox event of type ``type_sql`` (SQL: a constant,
    a parameter or a column of ``source``) for each resource row of the CTE ``source``, with
    the row and its run as wire JSON. The change and its event commit together."""
    return (f"events AS (INSERT INTO ledger_outbox (run_id, type, run, resource) "
            f"SELECT c.run_id, {type_sql}, {run_json('r')}, {resource_json('c')} "
            f"FROM {source} c JOIN runs r ON r.run_id = c.run_id ORDER BY c.id "
            f"RETURNING id, type, run::text AS run, resource::text AS resource, "
            f"(resource->>'resourceId')::bigint AS resource_id)")


EVENTS_SELECT = "SELECT id AS event_id, type, run, resource FROM events ORDER BY id"
"""The SELECT a resource-changing statement ends with: ``(event_id, type, run, resource)``."""


def resource_events(source: str, type_sql: str) -> str:
    """:func:`resource_events_cte` and :data:`EVENTS_SELECT`: the end of a statement whose
    ``WITH`` list ends in a comma."""
    return f"{resource_events_cte(source, type_sql)}\n{EVENTS_SELECT}"


async def add_resource(db: Database, *, run_id: str, module: str, kind: str, ref: str,
                       idempotency_key: str, revert: dict[str, Any], lease_deadline: int | None,
                       confirmed: bool) -> tuple[dict, list[Change]]:
    """Reserve (``pending``) or record (``confirmed``) a resource of the run.

    A retry with the same idempotency key returns the first row. A reservation needs a run
    that is not over; a record (the thing is already out there) is taken whatever the run's
    status, and reopens a finished cleanup so the sweep gives it back."""
    status = "confirmed" if confirmed else "pending"
    params = {"run_id": run_id, "module": module, "kind": kind, "ref": ref, "status": status,
              "key": idempotency_key, "revert": json.dumps(revert), "deadline": lease_deadline,
              "open_only": not confirmed, "terminal": list(RUN_TERMINAL)}
    try:
        async with db.connect() as conn:
            result = await rows(conn, f"""
                WITH inserted AS (
                    INSERT INTO resources (run_id, module, kind, ref, status, lease_deadline, revert, idempotency_key)
                    SELECT CAST(:run_id AS text), CAST(:module AS text), CAST(:kind AS text), CAST(:ref AS text),
                           CAST(:status AS text), CAST(:deadline AS bigint), CAST(:revert AS jsonb), CAST(:key AS text)
                    FROM runs WHERE run_id = CAST(:run_id AS text) AND NOT (:open_only AND status = ANY(:terminal))
                    ON CONFLICT (idempotency_key) DO NOTHING
                    RETURNING *
                ), logged AS (
                    INSERT INTO run_log (run_id, resource_id, kind, detail)
                    SELECT run_id, id, 'resource.recorded',
                           jsonb_build_object('status', status, 'module', module, 'kind', kind, 'ref', ref)
                    FROM inserted
                ), reopened AS (
                    UPDATE runs SET cleanup_status = 'pending', updated_at = now()
                    WHERE run_id = :run_id AND cleanup_status = 'complete' AND EXISTS (SELECT 1 FROM inserted)
                    RETURNING run_id
                ), {resource_events('inserted', "'resource.recorded'")}""", params)
            if result:
                changes = resource_changes(result)
                return changes[0].resource, changes
            return await _explain_no_insert(conn, run_id, module, kind, ref, idempotency_key)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name != LIVE_TARGET_INDEX:
            raise
    async with db.connect() as conn:
        # The same retry may have raced us to the target: then it is the first row.
        if await first(conn, "SELECT 1 FROM resources WHERE idempotency_key = :key", {"key": idempotency_key}):
            return await _explain_no_insert(conn, run_id, module, kind, ref, idempotency_key)
        holder = await first(conn, "SELECT id, status, run_id FROM resources WHERE module = :m AND kind = :k "
                             "AND ref = :r AND status = ANY(:live)",
                             {"m": module, "k": kind, "r": ref, "live": list(statuses.LIVE)})
    who = f"resource {holder.id} ({holder.status}, run {holder.run_id!r})" if holder else "a live row"
    raise Conflict(f"target {module}/{kind}/{ref} is held by {who}; it is free again once that row is resolved")


async def _explain_no_insert(conn: asyncpg.Connection, run_id: str, module: str, kind: str, ref: str,
                             key: str) -> tuple[dict, list[Change]]:
    """Nothing was inserted: the key was used before (answer its row), or the run is
    missing or over."""
    row = await first(conn, f"SELECT {resource_json('s')}::text AS resource FROM resources s "
                      "WHERE idempotency_key = :key", {"key": key})
    if row is not None:
        first_row = as_json(row.resource)
        if (first_row["runId"], first_row["module"], first_row["kind"], first_row["ref"]) != (run_id, module, kind, ref):
            raise Conflict(f"idempotencyKey {key!r} already names resource {first_row['resourceId']}, "
                           f"a different target; use a new key for a new resource")
        return first_row, []
    run = await run_or_not_found(conn, run_id)
    raise Conflict(f"run {run_id!r} is {run['status']}; nothing new may be reserved for it")


async def transition(db: Database, resource_id: int, step: Transition,
                     error: str | None = None) -> tuple[dict, list[Change]]:
    """Apply ``step`` (confirm, fail, reverted, drifted) to one resource: one guarded UPDATE."""
    async with db.connect() as conn:
        result = await rows(conn, f"""
            WITH changed AS (
                UPDATE resources SET status = :to, updated_at = now(),
                       last_error = COALESCE(:error, last_error), claimed_at = NULL
                WHERE id = :id AND status = ANY(:allowed)
                RETURNING *
            ), logged AS (
                INSERT INTO run_log (run_id, resource_id, kind, detail)
                SELECT run_id, id, :log_kind, jsonb_build_object('status', status, 'error', CAST(:error AS text))
                FROM changed
            ), {resource_events('changed', ':log_kind')}""",
                              {"id": resource_id, "to": step.to, "allowed": list(step.allowed),
                               "log_kind": step.log_kind, "error": _cut(error)})
        if not result:
            return await _replay_or_conflict(conn, resource_id, step, _cut(error)), []
    changes = resource_changes(result)
    return changes[0].resource, changes


async def _replay_or_conflict(conn: asyncpg.Connection, resource_id: int, step: Transition,
                              error: str | None) -> dict:
    """A transition that changed nothing: the row, if this is the same request again
    (statuses.is_replay); else NotFound or Conflict."""
    row = await first(conn, f"""
        SELECT s.status, s.last_error, {resource_json('s')}::text AS resource,
               (SELECT l.kind FROM run_log l WHERE l.run_id = s.run_id AND l.resource_id = s.id
                ORDER BY l.id DESC LIMIT 1) AS last_kind
        FROM resources s WHERE s.id = :id""", {"id": resource_id})
    if row is None:
        raise NotFound(f"no resource {resource_id}")
    if statuses.is_replay(step, row.status, row.last_kind, row.last_error, error):
        return as_json(row.resource)
    raise conflict(resource_id, row.status, step.name, step.allowed)


async def reconcile(db: Database, module: str, run_id: str, kind: str | None,
                    present: list[str]) -> tuple[int, list[Change]]:
    """The module's confirmed rows of the run (and kind) whose ref the shard no longer lists
    become ``orphaned``."""
    step = statuses.ORPHAN
    async with db.connect() as conn:
        await run_or_not_found(conn, run_id)
        result = await rows(conn, f"""
            WITH changed AS (
                UPDATE resources SET status = :to, updated_at = now()
                WHERE run_id = :run_id AND module = :module AND (CAST(:kind AS text) IS NULL OR kind = :kind)
                  AND status = ANY(:allowed) AND NOT (ref = ANY(:present))
                RETURNING *
            ), logged AS (
                INSERT INTO run_log (run_id, resource_id, kind, detail)
                SELECT run_id, id, :log_kind, jsonb_build_object('module', module, 'kind', kind, 'ref', ref)
                FROM changed
            ), {resource_events('changed', ':log_kind')}""",
                              {"run_id": run_id, "module": module, "kind": kind, "present": present,
                               "to": step.to, "allowed": list(step.allowed), "log_kind": step.log_kind})
    return len(result), resource_changes(result)


def _cut(error: str | None) -> str | None:
    """An error sentence cut to what the column holds."""
    return None if error is None else error[:ERROR_MAX]

