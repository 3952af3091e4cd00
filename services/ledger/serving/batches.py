"""The hot subjects' changes for many requests at once, one statement a batch: reserve or record
(``queries/resources.py``: ADD_RESOURCES), confirm or fail (TRANSITIONS) and the one-row give-back
outcomes (``queries/sweep.py``: OUTCOMES, which was a batch already). Each is the single-row statement
over ``unnest`` arrays: the same guards, the same log entry (its update event) per changed row,
all in one commit. A request the statement did not change is :data:`~services.ledger.serving.coalescer.UNCHANGED`:
the single-row path (``resources.py``, ``sweep.py``) answers it, with its replay, 409 or 404.

Each function returns one answer per request, in order, and each answer is what the single-row
path returns for a change: ``(row, changes)``."""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from typing import Any

from services.ledger import statuses
from services.ledger.database.queries.resources import ADD_RESOURCES, TRANSITIONS
from services.ledger.database.store import Change, Database, Json, resource_changes, rows
from services.ledger.resources import cut
from services.ledger.serving.coalescer import UNCHANGED
from services.ledger.statuses import Outcome, Transition
from services.ledger.sweep import outcome_params, outcome_rows
from shared.contracts import ledger as c

Answer = tuple[Json, list[Change]]
"""A changed row and its change (its event is its run-log entry)."""


def _by(changes: list[Change], field: str) -> dict[Any, Change]:
    """Each change by a field of its row (``resourceId``, ``idempotencyKey``)."""
    found: dict[Any, Change] = {}
    for change in changes:
        if change.resource is not None:
            found[change.resource[field]] = change
    return found


def _answers(requests: Sequence[Any], changes: dict[Any, Change], key: Sequence[Any]) -> list[Answer | Any]:
    answers: list[Answer | Any] = []
    for k in key:
        change = changes.get(k)
        answers.append(UNCHANGED if change is None or change.resource is None else (change.resource, [change]))
    return answers


def add_keys(body: c.AddResource) -> tuple[Hashable, ...]:
    """What two reservations in one batch must not share: an idempotency key, a target."""
    return ("key", body.idempotency_key), ("target", body.module, body.kind, body.ref)


async def add_resources(db: Database, bodies: Sequence[c.AddResource], confirmed: bool) -> list[Answer | Any]:
    """Reserve (``pending``) or record (``confirmed``) each resource of ``bodies`` in one statement
    (``resources.add_resource`` for many; keys and targets distinct, :func:`add_keys`)."""
    step = statuses.RECORD if confirmed else statuses.RESERVE
    params = {"run_ids": [b.run_id for b in bodies], "modules": [b.module for b in bodies],
              "kinds": [b.kind for b in bodies], "refs": [b.ref for b in bodies],
              "deadlines": [b.lease_deadline for b in bodies], "reverts": [json.dumps(b.revert) for b in bodies],
              "keys": [b.idempotency_key for b in bodies], "status": step.to, "open_only": not confirmed,
              "terminal": list(statuses.RUN_TERMINAL), "log_kind": step.log_kind,
              "reopen_to": statuses.REOPEN.to, "reopen_from": list(statuses.REOPEN.allowed)}
    async with db.connect() as conn:
        changes = resource_changes(await rows(conn, ADD_RESOURCES, params))
    return _answers(bodies, _by(changes, "idempotencyKey"), [b.idempotency_key for b in bodies])


def resource_keys(body: c.ResourceRef | c.FailResource | c.Drifted | c.SweepFailed) -> tuple[Hashable, ...]:
    """What two transitions in one batch must not share: their row."""
    return (body.resource_id,)


async def transitions(db: Database, given: Sequence[tuple[int, str | None]], step: Transition) -> list[Answer | Any]:
    """Apply ``step`` (confirm, fail) to each ``(resource id, error)`` in one statement
    (``resources.transition`` for many; ids distinct)."""
    if step.to is None:
        raise ValueError(f"{step.name} has no fixed target status")
    async with db.connect() as conn:
        changes = resource_changes(await rows(conn, TRANSITIONS, {
            "ids": [row_id for row_id, _ in given], "errors": [cut(error) for _, error in given],
            "to": step.to, "allowed": list(step.allowed), "log_kind": step.log_kind}))
    return _answers(given, _by(changes, "resourceId"), [row_id for row_id, _ in given])


async def outcomes(db: Database, given: Sequence[tuple[int, Outcome, str | None]]) -> list[Answer | Any]:
    """Record each one-row give-back outcome ``(resource id, outcome, error)`` in one statement
    (``sweep.reverted``, ``drifted``, ``failed`` for many; ids distinct)."""
    async with db.connect() as conn:
        result = await outcome_rows(conn, outcome_params(
            [(row_id, outcome, cut(error)) for row_id, outcome, error in given]))
    changes = resource_changes([row for row in result if row["run"] is not None])
    return _answers(given, _by(changes, "resourceId"), [row_id for row_id, _, _ in given])
