"""The shard's answer to a command → the HTTP-style status a caller acts on (docs/gateway.md, "Statuses",
has the table). Pure: the verb that was sent and the shard's answer in, a status out.

A shard error is a reply whose ``kind`` ends in ``.error`` (``bridge.error`` is the generic
one) with a ``reason`` sentence; the status follows the plane of the verb and words in the
reason, as the table lists them."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

EVENT_PLANE = frozenset({"lease", "participation", "world", "item"})
"""Verb prefixes of the event plane (acted on by a run, named by ``runId``): every verb the
seed's ``event_call`` carries, ``world.save`` and the ``item`` one-shots included (docs/gateway.md, "Statuses")."""

ACCOUNT_PLANE = frozenset({"account", "link"})
"""Verb prefixes of the account plane: accounts and their links to website users (docs/gateway.md, "Statuses")."""

ADMIN_PLANE = frozenset({"admin"})
"""Verb prefixes of the staff (admin) plane; these verbs need an ``actor``."""

BUSY = "bridge.busy"
"""The shard's answer while a command under the same idempotency key is still in flight."""

DRIFTED = "lease.drifted"
"""Compare-and-set refused to overwrite somebody's change: a success of the mechanism."""


def plane(verb: str) -> str:
    """``event``, ``account``, ``admin`` or ``generic`` for a verb such as ``lease.apply``."""
    head = verb.split(".", 1)[0]
    if head in EVENT_PLANE:
        return "event"
    if head in ACCOUNT_PLANE:
        return "account"
    if head in ADMIN_PLANE:
        return "admin"
    return "generic"


def _has(reason: str, *words: str) -> bool:
    return any(word in reason for word in words)


def _event_error(reason: str) -> HTTPStatus:
    """The seed's ``respond_event`` (docs/gateway.md, "Statuses"): the gate off is 403; an unknown lease key, a run not
    counted or with no ledger is 404; the save rate limit is 429; any other refusal 400."""
    if _has(reason, "disabled"):
        return HTTPStatus.FORBIDDEN
    if _has(reason, "no lease is offered", "not counting", "no participation ledger"):
        return HTTPStatus.NOT_FOUND
    if _has(reason, "saves at most every"):
        return HTTPStatus.TOO_MANY_REQUESTS
    return HTTPStatus.BAD_REQUEST


def _account_error(reason: str) -> HTTPStatus:
    """The seed's ``respond_account`` (docs/gateway.md, "Statuses"): a name clash ("already exists") 409; the
    per-IP cap 429; disabled, protected or refused 403; an unknown target or "not linked" 404."""
    if _has(reason, "already exists", "name clash", "already taken"):
        return HTTPStatus.CONFLICT
    if _has(reason, "per-ip", "per ip"):
        return HTTPStatus.TOO_MANY_REQUESTS
    if _has(reason, "disabled", "protected", "refused"):
        return HTTPStatus.FORBIDDEN
    if _has(reason, "unknown", "not linked"):
        return HTTPStatus.NOT_FOUND
    return HTTPStatus.BAD_REQUEST


def _admin_error(reason: str) -> HTTPStatus:
    """The seed's ``respond_admin`` (docs/gateway.md, "Statuses"; "protected" is 403)."""
    if _has(reason, "protected", "disabled"):
        return HTTPStatus.FORBIDDEN
    if _has(reason, "unknown"):
        return HTTPStatus.NOT_FOUND
    return HTTPStatus.BAD_REQUEST


def _generic_error(reason: str) -> HTTPStatus:
    """The seed's generic ``respond`` (docs/gateway.md, "Statuses"; "unknown account" is 404)."""
    return HTTPStatus.NOT_FOUND if _has(reason, "unknown") else HTTPStatus.BAD_REQUEST


def status_for(verb: str, answer: dict[str, Any]) -> HTTPStatus:
    """The status of the shard's ``answer`` to a command of ``verb``."""
    kind = str(answer.get("kind", ""))
    if kind == BUSY:
        return HTTPStatus.TOO_EARLY
    if kind == DRIFTED or not kind.endswith(".error"):
        return HTTPStatus.OK
    reason = str(answer.get("reason") or answer.get("error") or "").lower()
    where = plane(verb)
    # The event plane reads every ``*.error`` by its reason, ``bridge.error`` included
    # (docs/gateway.md, "Statuses"); the other planes read ``bridge.error`` as the generic responder does.
    if kind == "bridge.error" and where != "event":
        return _generic_error(reason)
    if where == "event":
        return _event_error(reason)
    if where == "account":
        return _account_error(reason)
    if where == "admin":
        return _admin_error(reason)
    return _generic_error(reason)
