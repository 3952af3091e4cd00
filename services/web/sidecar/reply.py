"""A gateway reply (or NATS's own failure) → the HTTP status and body the seed's sidecar gives.
Pure.

The gateway already maps a shard's answer to a status per plane (services/gateway's
reply_mapping, the seed's ``respond_*``); the door passes that status on and, as the sidecar
does, answers with the shard's line itself as the body (docs/web.md, "Routes and verbs").
What the sidecar answers by itself is quoted: no shard is ``{"error": "shard not connected"}``,
no answer in time ``{"error": "shard did not reply in time"}`` (docs/web.md, "Statuses and the
door's own answers").
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import ValidationError

from services.web.nats_route import STATUS_MAX
from shared.contracts import gateway

NOT_CONNECTED: dict[str, str] = {"error": "shard not connected"}
"""The sidecar's 503 body: no gateway holds the shard, or it left mid-command (docs/web.md, "Statuses")."""

NO_REPLY: dict[str, str] = {"error": "shard did not reply in time"}
"""The sidecar's 504 body: the shard did not answer in time (docs/web.md, "Statuses")."""


def _contract_broken(what: str, exc: ValidationError) -> tuple[int, dict[str, str]]:
    """A reply outside the gateway's contract (shared/contracts/gateway.py): the door's 502."""
    field = ".".join(str(p) for p in exc.errors()[0].get("loc", ())) or "the reply"
    return HTTPStatus.BAD_GATEWAY, {"error": f"the gateway answered {what} outside its contract ({field})"}


def _status_ok(status: int) -> bool:
    return HTTPStatus.CONTINUE <= status <= STATUS_MAX


def command_answer(reply: dict[str, Any]) -> tuple[int, Any]:
    """The gateway's ``{"status", "body"}`` or ``{"status", "error"}`` (its contract's
    :class:`CommandReply`) as (status, HTTP body); the shard's line goes out as it came."""
    try:
        parsed = gateway.CommandReply.model_validate(reply)
    except ValidationError as exc:
        return _contract_broken("a command", exc)
    if not _status_ok(parsed.status):
        return HTTPStatus.BAD_GATEWAY, {"error": "the gateway answered without a status"}
    if parsed.body is not None:
        return parsed.status, reply["body"]
    if parsed.status == HTTPStatus.SERVICE_UNAVAILABLE:
        return HTTPStatus.SERVICE_UNAVAILABLE, NOT_CONNECTED
    if parsed.status == HTTPStatus.GATEWAY_TIMEOUT:
        return HTTPStatus.GATEWAY_TIMEOUT, NO_REPLY
    return parsed.status, {"error": parsed.error or f"the gateway answered {parsed.status}"}


def board_answer(reply: dict[str, Any]) -> tuple[int, Any]:
    """A board read's ``{"status": 200, "items": [...]}`` (the contract's :class:`BoardReply`) as
    the sidecar's bare array (``GET /guilds`` answers the list itself, docs/web.md, "Boards"); an error as
    ``{"error"}``."""
    try:
        parsed = gateway.BoardReply.model_validate(reply)
    except ValidationError as exc:
        return _contract_broken("a board read", exc)
    if parsed.status == HTTPStatus.OK and parsed.items is not None:
        return HTTPStatus.OK, reply["items"]
    if not _status_ok(parsed.status) or parsed.status == HTTPStatus.OK:
        return HTTPStatus.BAD_GATEWAY, {"error": "the gateway answered a board read without its items"}
    return parsed.status, {"error": parsed.error or f"the gateway answered {parsed.status}"}
