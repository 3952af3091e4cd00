"""Commands from NATS to a shard: validating a request's body and turning it into the one
line the shard receives. Pure; the wiring that waits for the answer is in ``command_relay.py``."""

from __future__ import annotations

import itertools
import json
import uuid
from http import HTTPStatus
from typing import Any

from services.gateway.commands.reply_mapping import plane
from shared.errors import ShardbusError
from shared.subjects import is_safe_kind

PROTOCOL_HEADER = "Shard-Protocol"
"""Request header in which a caller may state the protocol version it expects (else 409)."""


class CommandRejected(ShardbusError):
    """The gateway answers the command itself, without asking the shard: ``status`` and the
    ``sentence`` of the reply."""

    def __init__(self, status: HTTPStatus, sentence: str) -> None:
        super().__init__(sentence, status)


_REQ_PREFIX = uuid.uuid4().hex[:12]
"""This process's part of every request id (replicas never share one)."""

_req_numbers = itertools.count(1)


def new_req_id() -> str:
    """A fresh request id: every call, retries included, gets its own. A counter behind a
    random per-process prefix: as unique as a uuid4 per call, at a fraction of its cost."""
    return f"{_REQ_PREFIX}-{next(_req_numbers):x}"


def parse_body(verb: str, payload: bytes) -> dict[str, Any]:
    """The command's body as an object (empty → ``{}``); CommandRejected(400) names what is wrong."""
    if not is_safe_kind(verb):
        raise CommandRejected(HTTPStatus.BAD_REQUEST, f"verb {verb[:80]!r} is not a valid command name")
    if not payload.strip():
        body: Any = {}
    else:
        try:
            body = json.loads(payload)
        except (ValueError, RecursionError):
            raise CommandRejected(HTTPStatus.BAD_REQUEST, "body must be a JSON object (it is not valid JSON)") from None
    if body is None:  # a null body is an empty one, as the seed's sidecar reads it (docs/gateway.md, "Commands")
        body = {}
    if not isinstance(body, dict):
        raise CommandRejected(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
    if plane(verb) == "admin":
        actor = body.get("actor")
        if not isinstance(actor, str) or not actor.strip():
            raise CommandRejected(HTTPStatus.BAD_REQUEST, f"{verb} is a staff verb: actor (who is acting) is required")
    return body


def check_protocol(expected: str | None, spoken: int) -> None:
    """The protocol gate: a caller expecting another protocol than the shard speaks gets 409."""
    if expected is None:
        return
    if expected.strip() != str(spoken):
        raise CommandRejected(HTTPStatus.CONFLICT, f"the shard speaks protocol {spoken}, the caller expects "
                                                   f"{expected.strip()[:16]!r}: a deployment mismatch, do not retry")


_LINE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""Built once: ``json.dumps`` with these options would build an encoder per command."""


def command_line(verb: str, body: dict[str, Any], req_id: str) -> bytes:
    """The line sent to the shard: the body verbatim, ``kind`` set to the verb, a fresh ``reqId``."""
    return _LINE.encode({**body, "kind": verb, "reqId": req_id}).encode() + b"\n"
