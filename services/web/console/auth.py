"""Who may use the operator's console: the operator token, given once on the login page, then
a session cookie that is not the token.

The cookie is ``<expiry>.<nonce>.<mac>``: an expiry (epoch seconds), a random nonce and an
HMAC-SHA256 of both under a key derived from the operator token. Every replica of the door
checks it the same way without shared state; changing the operator token ends every session.
It is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it),
``Path=/console`` and ``Secure`` when the console is served over HTTPS. A change the console
makes (a sweep, an install) also wants the session's CSRF token in ``X-Console-Csrf``, which
only the console's own pages know. The token is never logged nor echoed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from http import HTTPStatus
from typing import Literal, TypedDict

from fastapi import HTTPException, Request

COOKIE = "shardbus_console"
"""The session cookie's name."""

SESSION_S = 12 * 3600
"""How long a session lasts before the token is asked again."""

CSRF_HEADER = "x-console-csrf"
"""The header a console change carries its CSRF token in."""

NOT_OPERATOR = "that token is not the operator's: the console takes the operator token only"
NO_OPERATOR = "no operator token is configured (SHARDBUS_WEB_OPERATOR_TOKEN): the console is closed"


def _key(request: Request) -> bytes | None:
    """The session key, derived from the operator token (None: no operator token)."""
    token = request.app.state.settings.web_operator_token.get_secret_value()
    if not token:
        return None
    return hmac.new(token.encode(), b"shardbus console session v1", hashlib.sha256).digest()


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def check_token(request: Request, presented: str) -> str | None:
    """None when ``presented`` is the operator token; else why it is refused."""
    if _key(request) is None:
        return NO_OPERATOR
    try:
        caller = request.app.state.tokens.caller(f"Bearer {presented.strip()}")
    except HTTPException:
        return NOT_OPERATOR
    return None if caller.role == "operator" else NOT_OPERATOR


def new_session(request: Request) -> str:
    """A fresh session cookie value (call after :func:`check_token` said yes)."""
    key = _key(request)
    assert key is not None
    head = f"{int(time.time()) + SESSION_S}.{secrets.token_hex(16)}"
    return f"{head}.{_mac(key, head)}"


def session(request: Request) -> str | None:
    """The session's nonce when the request carries a valid, unexpired cookie; else None."""
    value = request.cookies.get(COOKIE)
    key = _key(request)
    if not value or key is None or len(value) > 200:
        return None
    expiry, _, rest = value.partition(".")
    nonce, _, mac = rest.partition(".")
    if not expiry.isdigit() or not nonce or not mac:
        return None
    if not hmac.compare_digest(_mac(key, f"{expiry}.{nonce}"), mac):
        return None
    return nonce if int(expiry) > time.time() else None


def csrf_token(request: Request, nonce: str) -> str:
    """The session's CSRF token (put in the page; sent back in ``X-Console-Csrf``)."""
    key = _key(request)
    assert key is not None
    return _mac(key, f"csrf.{nonce}")[:40]


class CookieFlags(TypedDict):
    """The session cookie's attributes, as ``Response.set_cookie`` and ``delete_cookie`` take them."""

    httponly: bool
    samesite: Literal["lax", "strict", "none"]
    path: str
    secure: bool


def cookie_flags(request: Request) -> CookieFlags:
    """The cookie's attributes (``Response.set_cookie`` keywords)."""
    return {"httponly": True, "samesite": "strict", "path": "/console",
            "secure": request.url.scheme == "https"}


async def operator_api(request: Request) -> str:
    """Dependency of the console's JSON and event routes: the session's nonce, or 401."""
    nonce = session(request)
    if nonce is None:
        raise HTTPException(HTTPStatus.UNAUTHORIZED, "log in to the console first (/console/login)")
    return nonce


async def operator_change(request: Request) -> str:
    """Dependency of a console change: a session and its CSRF token, or 401 / 403."""
    nonce = await operator_api(request)
    given = request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(given.encode(), csrf_token(request, nonce).encode()):
        raise HTTPException(HTTPStatus.FORBIDDEN, "missing or wrong console CSRF token: reload the page")
    return nonce
