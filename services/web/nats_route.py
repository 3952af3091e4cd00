"""One HTTP route as one NATS request: the request's JSON body read with every hostile shape
refused (400), and the service's reply relayed verbatim: its ``status`` is the HTTP status and
the reply object is the body, so a website sees exactly what docs/contracts.md describes.
NATS's own failures become sentences: nobody answering is a 503, no answer in time a 504."""

from __future__ import annotations

import json
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import Response
from pydantic import ValidationError

from services.web.nats_calls import BadReply, NatsAway, NoAnswer, NoResponders, TooLarge, call

INT_DIGITS_MAX = 4300
"""Python's limit on the digits of an integer read from text (a longer one is a 400 here)."""

NOT_AN_OBJECT = "body must be a JSON object"

STATUS_MAX = 599
"""The highest status a reply may carry: the end of the 5xx class (no ``HTTPStatus`` member is
599; the replies' statuses themselves are ``HTTPStatus`` members)."""


def _int(text: str) -> int:
    if len(text) - text.startswith("-") > INT_DIGITS_MAX:
        raise ValueError(f"it holds an integer of more than {INT_DIGITS_MAX} digits")
    return int(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _encoded(body: Any) -> bytes:
    """``body`` as :func:`nats_calls.call` will send it (so what it cannot send is refused here)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


_NO_BODY: Any = object()


async def json_value(request: Request, empty: Any = None) -> Any:
    """The request's body as a JSON value (``empty`` when there is none), read up to the door's body cap
    even when no Content-Length announced its size. 400 for what is not JSON or cannot be
    passed on: NaN, an integer too long to read, nesting too deep to read, a lone surrogate
    (PostgreSQL stores none, and it cannot be sent as UTF-8); 413 past the cap."""
    cap = request.app.state.settings.web_max_body_bytes
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > cap:
            raise HTTPException(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {cap} bytes")
    if not data.strip():
        return empty
    try:
        body = json.loads(bytes(data), parse_int=_int, parse_constant=_no_constant)
        _encoded(body)
    except RecursionError:
        raise HTTPException(HTTPStatus.BAD_REQUEST, "body is nested too deeply to read") from None
    except UnicodeEncodeError:
        raise HTTPException(HTTPStatus.BAD_REQUEST, "body must not hold a lone surrogate (U+D800 to U+DFFF)") from None
    except ValueError as exc:  # JSONDecodeError, bad UTF-8 (UnicodeDecodeError), _int, _no_constant
        reason = str(exc).split(":")[0] if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"body is not valid JSON ({reason[:200]})") from None
    return body


async def json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object (an empty body is ``{}``, a ``null`` one a 400); see
    :func:`json_value`."""
    body = await json_value(request, empty=_NO_BODY)
    if body is _NO_BODY:
        return {}
    if not isinstance(body, dict):
        raise HTTPException(HTTPStatus.BAD_REQUEST, NOT_AN_OBJECT)
    return body


def reply_response(reply: dict[str, Any], status: int) -> Response:
    """``reply`` as the response body, verbatim, with HTTP ``status``."""
    try:
        content = json.dumps(reply, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except (ValueError, RecursionError):  # NaN, a lone surrogate, absurd nesting: not ours to pass on
        return error(HTTPStatus.BAD_GATEWAY, "the service's reply cannot be passed on as JSON")
    return Response(content, status_code=status, media_type="application/json")


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """The door's own error shape, ``{"error": "…"}``, for every route and handler."""
    return Response(json.dumps({"error": message}, ensure_ascii=False).encode(), status_code=status,
                    headers=headers, media_type="application/json")


async def relay(request: Request, subject: str, body: dict[str, Any], *, service: str,
                timeout_s: float | None = None, success: int | None = None,
                read: Callable[[dict[str, Any]], object] | None = None) -> Response:
    """Ask ``service`` on ``subject`` with ``body`` and answer with its reply (``success``, when
    given, replaces a 2xx status: the installer's 201). ``read``, when given, reads the reply with
    the subject's contract: a reply it refuses (ValidationError) is a 502, not passed on."""
    timeout = max(request.app.state.settings.web_request_timeout_s, timeout_s or 0.0)
    try:
        reply = await call(request.app.state.nc, subject, body, timeout)
    except NoResponders:
        return error(HTTPStatus.SERVICE_UNAVAILABLE, f"the {service} is not running (no replica answers {subject})")
    except NoAnswer:
        return error(HTTPStatus.GATEWAY_TIMEOUT, f"the {service} did not answer {subject} within {timeout:g} s")
    except NatsAway:
        return error(HTTPStatus.SERVICE_UNAVAILABLE, "the web door is not connected to NATS; retry shortly")
    except BadReply:
        return error(HTTPStatus.BAD_GATEWAY,
                     f"the {service} answered {subject} with something that is not a JSON object")
    except TooLarge as exc:
        return error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(exc))
    status = reply.get("status")
    if (isinstance(status, bool) or not isinstance(status, int)
            or not HTTPStatus.OK <= status <= STATUS_MAX):
        return error(HTTPStatus.BAD_GATEWAY, f"the {service} answered {subject} without a valid status")
    if read is not None:
        try:
            read(reply)
        except ValidationError:
            return error(HTTPStatus.BAD_GATEWAY, f"the {service}'s reply to {subject} does not fit its contract")
    if success is not None and status < HTTPStatus.MULTIPLE_CHOICES:
        status = success
    return reply_response(reply, status)
