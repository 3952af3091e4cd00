"""The console's NATS reads: one request whose failure becomes a sentence for the page (never an
exception), and a scatter-gather for subjects every replica answers (``gateway.status``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from fastapi import Request

from services.web.nats_calls import BadReply, NatsAway, NoAnswer, NoResponders, TooLarge, call
from shared.scatter_gather import scatter_gather

GATHER_AFTER_FIRST_S = 0.15
"""After the first reply of a scatter-gather, how long the other replicas get."""


@dataclass
class Answer:
    """A service's reply (``reply``), or why there is none or it is an error (``error``)."""

    reply: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def status(self) -> int:
        value = self.reply.get("status")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def ok(self) -> bool:
        return self.error is None


async def ask(request: Request, subject: str, body: dict[str, Any], service: str,
              timeout_s: float | None = None) -> Answer:
    """One request; an answer that is not 2xx carries the service's ``error`` sentence."""
    state = request.app.state
    timeout = timeout_s or state.settings.web_request_timeout_s
    try:
        reply = await call(state.nc, subject, body, timeout)
    except NoResponders:
        return Answer(error=f"the {service} is not running (no replica answers {subject})")
    except NoAnswer:
        return Answer(error=f"the {service} did not answer {subject} within {timeout:g} s")
    except NatsAway:
        return Answer(error="the web door is not connected to NATS; retry shortly")
    except BadReply:
        return Answer(error=f"the {service} answered {subject} with something that is not a JSON object")
    except TooLarge as exc:
        return Answer(error=str(exc))
    answer = Answer(reply)
    if not HTTPStatus.OK <= answer.status < HTTPStatus.MULTIPLE_CHOICES:
        said = reply.get("error")
        why = said if isinstance(said, str) else f"the {service} refused"
        answer.error = f"{answer.status or 'no status'}: {why}"
    return answer


async def gather(request: Request, subject: str, wait_s: float = 2.0) -> list[dict[str, Any]] | None:
    """Every JSON object reply to one request published on ``subject`` (every replica answers):
    up to ``wait_s`` for the first, then :data:`GATHER_AFTER_FIRST_S` for the rest. None when
    the door is not connected; ``[]`` when nobody answers."""
    nc = request.app.state.nc
    if nc is None or not nc.is_connected:
        return None
    return await scatter_gather(nc, subject, b"{}", wait_s, settle_s=GATHER_AFTER_FIRST_S)
