"""The installer over HTTP (docs/contracts.md, "Installer"): install or upgrade the site's one
module, list it, remove it. The website's (and the operator's); each reply relayed verbatim, an
install that succeeds answered 201 as the website seed's admin route answers it (the body keeps
the installer's own ``"status": 200``).

Requests are built and replies read with the installer's contract
(:mod:`shared.contracts.installer`): a body the installer would refuse gets the installer's own
400 without being sent, and a reply that does not fit the contract is a 502."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from services.web import auth
from services.web.auth import Caller
from services.web.nats_route import json_object, relay, reply_response
from shared import subjects
from shared.contracts import installer as c
from shared.contracts.ids import MODULE_ID_PATTERN, is_module_id

router = APIRouter(tags=["installer"])

Website = Annotated[Caller, Depends(auth.website)]
Body = Annotated[dict[str, Any], Depends(json_object)]

INSTALL_TIMEOUT_S = c.INSTALL_TIMEOUT_S
"""How long an install may take before the door answers 504 (a large artifact on a slow link;
the CLI waits as long). The install goes on regardless: ``GET /modules`` tells its outcome."""

REMOVE_TIMEOUT_S = c.REMOVE_TIMEOUT_S
"""How long a removal may wait (for the site lock, then the delete)."""

MODULE_ID_RULE = f"a module id must match {MODULE_ID_PATTERN}"
"""The door's 400 for a path that names no module id (it becomes ``installer.remove``'s ``id``)."""


async def ask_installer(request: Request, subject: str, model: type[c.InstallerRequest], body: Mapping[str, Any],
                        reply: type[c.InstallerReply], *, timeout_s: float | None = None,
                        success: HTTPStatus | None = None) -> Response:
    """Ask the installer on ``subject`` with ``body`` built as ``model``, and answer with its
    reply, which must be ``reply`` (2xx) or an :class:`~shared.contracts.installer.ErrorReply`."""
    try:
        wanted = c.build(model, body)
    except c.RequestRefused as exc:  # the installer's own 400, word for word
        return reply_response(exc.reply.wire(), exc.reply.status)
    return await relay(request, subject, wanted.wire(), service="installer", timeout_s=timeout_s, success=success,
                       read=functools.partial(c.read_reply, reply))


@router.post("/modules/install", status_code=HTTPStatus.CREATED,
             summary="Install or upgrade the site's module (installer.install)")
async def install(request: Request, _caller: Website, body: Body) -> Response:
    return await ask_installer(request, subjects.INSTALLER_INSTALL, c.InstallRequest, body, c.InstallReply,
                               timeout_s=INSTALL_TIMEOUT_S, success=HTTPStatus.CREATED)


@router.get("/modules", summary="The installed module and the declared modules' fate (installer.list)")
async def list_modules(request: Request, _caller: Website) -> Response:
    return await ask_installer(request, subjects.INSTALLER_LIST, c.ListRequest, {}, c.ListReply)


@router.delete("/modules/{id}", summary="Remove the installed module, freeing the site (installer.remove)")
async def remove(request: Request, _caller: Website, id: str) -> Response:
    if not is_module_id(id):
        raise HTTPException(HTTPStatus.BAD_REQUEST, MODULE_ID_RULE)
    return await ask_installer(request, subjects.INSTALLER_REMOVE, c.RemoveRequest, {"id": id}, c.RemoveReply,
                               timeout_s=REMOVE_TIMEOUT_S)
