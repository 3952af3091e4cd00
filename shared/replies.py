"""The reply envelope: every answer to a request is a JSON object with an HTTP-style
integer ``status`` and either the result's fields or an ``error`` sentence."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

# HTTPStatus is an IntEnum: a reply carrying one is sent as its plain number (json.dumps, and
# pydantic's int fields, read it as the int).
OK = HTTPStatus.OK
BAD_REQUEST = HTTPStatus.BAD_REQUEST
NOT_FOUND = HTTPStatus.NOT_FOUND
CONFLICT = HTTPStatus.CONFLICT
UNAVAILABLE = HTTPStatus.SERVICE_UNAVAILABLE


class Reply(BaseModel):
    """A reply as a caller reads it: ``status``, maybe ``error``, and the result's fields."""

    model_config = ConfigDict(extra="allow")

    status: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True for a 2xx status."""
        return HTTPStatus.OK <= self.status < HTTPStatus.MULTIPLE_CHOICES

    def to_dict(self) -> dict[str, Any]:
        """The reply as sent on the wire (no ``error`` key on success)."""
        return self.model_dump(exclude_none=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reply:
        """Read a reply received from the wire."""
        return cls.model_validate(data)


def ok(**result: Any) -> dict[str, Any]:
    """A 200 reply carrying ``result``'s fields."""
    return {"status": OK, **result}


def fail(status: int, error: str, **extra: Any) -> dict[str, Any]:
    """An error reply; ``error`` is a sentence a person can act on."""
    return {"status": status, "error": error, **extra}


def describe_validation_error(exc: ValidationError, within: tuple[str, ...] = ()) -> str:
    """One sentence naming every field that failed and why, e.g.
    ``invalid request: kind: String should have at most 64 characters``; each field's place
    begins with ``within`` (``("body",)``: as FastStream names the fields of a handler's body)."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in (*within, *err.get("loc", ())) if p != "__root__") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)
