"""Who is calling: a bearer token, compared in constant time, names a caller and its role.

Three roles, mirroring the NATS users of deploy/nats/nats.conf: the ``website`` (commands,
boards, news, runs and resources, the installer, a cleanup retry, the feed), the ``operator``
(all of that, plus sweeps and reconciles) and a ``module`` (its own expiries and reconciles
only: the owner is the token's module, never anything in the body). A token is never logged
nor echoed.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal

from fastapi import HTTPException, Request

from services.web.settings import WebSettings

Role = Literal["website", "operator", "module"]


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: its role, and for a module, which one."""

    role: Role
    module: str | None = None


NO_TOKEN = "missing bearer token: send 'Authorization: Bearer <token>'"
WRONG_TOKEN = "the bearer token is not valid here"


class Tokens:
    """The configured tokens, checked without revealing by timing which one nearly matched."""

    def __init__(self, settings: WebSettings) -> None:
        entries: list[tuple[bytes, Caller]] = [(settings.web_token.get_secret_value().encode(), Caller("website"))]
        if operator := settings.web_operator_token.get_secret_value():
            entries.append((operator.encode(), Caller("operator")))
        for module, token in sorted(settings.web_module_tokens.items()):
            if value := token.get_secret_value():
                entries.append((value.encode(), Caller("module", module)))
        self._entries = entries

    def caller(self, authorization: str | None) -> Caller:
        """The caller a request's ``Authorization`` header names; 401 otherwise."""
        if not authorization:
            raise HTTPException(HTTPStatus.UNAUTHORIZED, NO_TOKEN, headers={"WWW-Authenticate": "Bearer"})
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() not in ("bearer", "token") or not presented.strip():
            raise HTTPException(HTTPStatus.UNAUTHORIZED, NO_TOKEN, headers={"WWW-Authenticate": "Bearer"})
        given = presented.strip().encode()
        found: Caller | None = None
        for token, caller in self._entries:  # every entry compared: no early exit to time
            if hmac.compare_digest(token, given):
                found = caller
        if found is None:
            raise HTTPException(HTTPStatus.UNAUTHORIZED, WRONG_TOKEN, headers={"WWW-Authenticate": "Bearer"})
        return found


# The dependencies are ``async def``: FastAPI runs a plain ``def`` in a thread pool, a thread
# hop per request for a few microseconds of work.
def _caller(request: Request) -> Caller:
    tokens: Tokens = request.app.state.tokens
    # A browser's WebSocket cannot set headers: the feed also takes ?token= (see feed/routes.py).
    return tokens.caller(request.headers.get("authorization"))


async def website(request: Request) -> Caller:
    """Dependency: the website or the operator."""
    caller = _caller(request)
    if caller.role == "module":
        raise HTTPException(HTTPStatus.FORBIDDEN,
                            f"module {caller.module!r} may only report its own expiries and reconciles")
    return caller


async def operator(request: Request) -> Caller:
    """Dependency: the operator only."""
    caller = _caller(request)
    if caller.role != "operator":
        raise HTTPException(HTTPStatus.FORBIDDEN, "this route is the operator's: use the operator token")
    return caller


async def module(request: Request) -> Caller:
    """Dependency: a module (acting for itself) or the operator."""
    caller = _caller(request)
    if caller.role == "website":
        raise HTTPException(HTTPStatus.FORBIDDEN, "this route is a module's: use that module's token")
    return caller
