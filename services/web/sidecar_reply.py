"""A gateway reply (or NATS's own failure) → the HTTP status and body the seed's sidecar gives.
Pure.

The gateway already maps a shard's answer to a status per plane (services/gateway's
reply_mapping, the seed's ``respond_*``); the door passes that status on and, as the sidecar
does, answers with the shard's line itself as the body (S004:1049, ``(code, Json(value))``).
What the sidecar answers by itself is quoted: no shard is ``{"error": "shard not connected"}``
(S004:1054-1057), no answer in time ``{"error": "shard did not reply in time"}`` (S004:1058-1061).
"""

from __future__ import annotations

from typing import Any

NOT_CONNECTED: dict[str, str] = {"error": "shard not connected"}
"""The sidecar's 503 body (S004:1054-1057): no gateway holds the shard, or it left mid-command."""

NO_REPLY: dict[str, str] = {"error": "shard did not reply in time"}
"""The sidecar's 504 body (S004:1058-1061)."""


def command_answer(reply: dict[str, Any]) -> tuple[int, Any]:
    """The gateway's ``{"status", "body"}`` or ``{"status", "error"}`` as (status, HTTP body)."""
    status = reply.get("status")
    if not isinstance(status, int) or not 100 <= status <= 599:
        return 502, {"error": "the gateway answered without a status"}
    if "body" in reply:
        return status, reply["body"]
    if status == 503:
        return 503, NOT_CONNECTED
    if status == 504:
        return 504, NO_REPLY
    return status, {"error": str(reply.get("error") or f"the gateway answered {status}")}


def board_answer(reply: dict[str, Any]) -> tuple[int, Any]:
    """A board read's ``{"status": 200, "items": [...]}`` as the sidecar's bare array
    (``GET /guilds`` answers the list itself, S004:610-631); an error as ``{"error"}``."""
    status = reply.get("status")
    if status == 200 and isinstance(reply.get("items"), list):
        return 200, reply["items"]
    if not isinstance(status, int) or not 100 <= status <= 599 or status == 200:
        return 502, {"error": "the gateway answered a board read without its items"}
    return status, {"error": str(reply.get("error") or f"the gateway answered {status}")}
