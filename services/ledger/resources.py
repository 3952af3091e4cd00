"""Resources a run holds: reserve (pending) or record (confirmed) one — idempotent on its
key, refused while its target is held by a live row — then confirm, fail or orphan it.
Each change is one guarded statement that also writes its run-log entry."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from services.ledger import statuses
from services.ledger.database.queries.resources import (
    ADD_RESOURCE,
    KEY_USED,
    RECONCILE,
    REPLAY_STATE,
    RESOURCE_BY_KEY,
    TARGET_HOLDER,
    TRANSITION,
)
from services.ledger.database.store import (
    Change,
    Conflict,
    Database,
    Json,
    NotFound,
    as_object,
    conflict,
    first,
    resource_changes,
    rows,
    run_or_not_found,
)
from services.ledger.statuses import Transition
from shared.contracts.ledger import ERROR_MAX

__all__ = ["LIVE_TARGET_INDEX", "add_resource", "cut", "reconcile", "replay_or_conflict",
           "resource_of", "transition"]

LIVE_TARGET_INDEX = "uq_resources_live_target"
"""The partial unique index that holds a target for one live row."""


async def add_resource(db: Database, *, run_id: str, module: str, kind: str, ref: str,
                       idempotency_key: str, revert: dict[str, Any], lease_deadline: int | None,
                       confirmed: bool) -> tuple[Json, list[Change]]:
    """Reserve (``pending``) or record (``confirmed``) a resource of the run.

    A retry with the same idempotency key returns the first row. A reservation needs a run
    that is not over; a record (the thing is already out there) is taken whatever the run's
    status, and reopens a finished cleanup so the sweep gives it back."""
    step = statuses.RECORD if confirmed else statuses.RESERVE
    params = {"run_id": run_id, "module": module, "kind": kind, "ref": ref, "status": step.to,
              "key": idempotency_key, "revert": json.dumps(revert), "deadline": lease_deadline,
              "open_only": not confirmed, "terminal": list(statuses.RUN_TERMINAL), "log_kind": step.log_kind,
              "reopen_to": statuses.REOPEN.to, "reopen_from": list(statuses.REOPEN.allowed)}
    try:
        async with db.connect() as conn:
            result = await rows(conn, ADD_RESOURCE, params)
            if result:
                changes = resource_changes(result)
                return resource_of(changes), changes
            return await _explain_no_insert(conn, run_id, module, kind, ref, idempotency_key)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name != LIVE_TARGET_INDEX:
            raise
    async with db.connect() as conn:
        # The same retry may have raced us to the target: then it is the first row.
        if await first(conn, KEY_USED, {"key": idempotency_key}):
            return await _explain_no_insert(conn, run_id, module, kind, ref, idempotency_key)
        holder = await first(conn, TARGET_HOLDER,
                             {"module": module, "kind": kind, "ref": ref, "live": list(statuses.LIVE)})
    who = (f"resource {holder['id']} ({holder['status']}, run {holder['run_id']!r})" if holder
           else "a live row")
    raise Conflict(f"target {module}/{kind}/{ref} is held by {who}; it is free again once that row is resolved")


async def _explain_no_insert(conn: asyncpg.Connection, run_id: str, module: str, kind: str, ref: str,
                             key: str) -> tuple[Json, list[Change]]:
    """Nothing was inserted: the key was used before (answer its row), or the run is
    missing or over."""
    row = await first(conn, RESOURCE_BY_KEY, {"key": key})
    if row is not None:
        first_row = as_object(row["resource"])
        if (first_row["runId"], first_row["module"], first_row["kind"], first_row["ref"]) != (run_id, module, kind,
                                                                                             ref):
            raise Conflict(f"idempotencyKey {key!r} already names resource {first_row['resourceId']}, "
                           f"a different target; use a new key for a new resource")
        return first_row, []
    run = await run_or_not_found(conn, run_id)
    raise Conflict(f"run {run_id!r} is {run['status']}; nothing new may be reserved for it")


async def transition(db: Database, resource_id: int, step: Transition,
                     error: str | None = None) -> tuple[Json, list[Change]]:
    """Apply ``step`` (confirm, fail: a fixed target status) to one resource: one guarded UPDATE.
    The outcomes of a give-back (reverted, drifted, failed) are ``sweep``'s."""
    if step.to is None:
        raise ValueError(f"{step.name} has no fixed target status; it is a give-back's outcome (sweep.py)")
    async with db.connect() as conn:
        result = await rows(conn, TRANSITION,
                            {"id": resource_id, "to": step.to, "allowed": list(step.allowed),
                             "log_kind": step.log_kind, "error": cut(error)})
        if not result:
            return await replay_or_conflict(conn, resource_id, step, cut(error)), []
    changes = resource_changes(result)
    return resource_of(changes), changes


async def replay_or_conflict(conn: asyncpg.Connection, resource_id: int, step: Transition,
                             error: str | None) -> Json:
    """A transition that changed nothing: the row, if this is the same request again
    (statuses.is_replay); else NotFound or Conflict."""
    row = await first(conn, REPLAY_STATE, {"id": resource_id})
    if row is None:
        raise NotFound(f"no resource {resource_id}")
    if statuses.is_replay(step, row["status"], row["last_kind"], row["last_error"], error):
        return as_object(row["resource"])
    raise conflict(resource_id, row["status"], step.action, step.allowed)


async def reconcile(db: Database, module: str, run_id: str, kind: str | None,
                    present: list[str]) -> tuple[int, list[Change]]:
    """The module's confirmed rows of the run (and kind) whose ref the shard no longer lists
    become ``orphaned``."""
    step = statuses.ORPHAN
    async with db.connect() as conn:
        await run_or_not_found(conn, run_id)
        result = await rows(conn, RECONCILE,
                            {"run_id": run_id, "module": module, "kind": kind, "present": present,
                             "to": step.to, "allowed": list(step.allowed), "log_kind": step.log_kind})
    return len(result), resource_changes(result)


def cut(error: str | None) -> str | None:
    """An error sentence cut to what the column holds."""
    return None if error is None else error[:ERROR_MAX]


def resource_of(changes: list[Change]) -> Json:
    """The row of a one-row change (its update event carries it)."""
    resource = changes[0].resource
    if resource is None:  # pragma: no cover - resource events always carry the row
        raise RuntimeError("a resource change without its row")
    return resource
