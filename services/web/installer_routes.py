"""The installer over HTTP (docs/contracts.md, "Installer"): install or upgrade the site's one
module, list it, remove it. The website's (and the operator's); each reply relayed verbatim, an
install that succeeds answered 201 as the website seed's admin route answers it (the body keeps
the installer's own ``"status": 200``)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from services.web import auth
from services.web.auth import Caller
from services.web.relay import json_object, relay
from shared import subjects

router = APIRouter(tags=["installer"])

Website = Annotated[Caller, Depends(auth.website)]
Body = Annotated[dict[str, Any], Depends(json_object)]

INSTALL_TIMEOUT_S = 900.0
"""How long an install may take before the door answers 504 (a large artifact on a slow link;
the CLI waits as long). The install goes on regardless: ``GET /modules`` tells its outcome."""

REMOVE_TIMEOUT_S = 120.0
"""How long a removal may wait (for the site lock, then the delete)."""


@router.post("/modules/install", status_code=201, summary="Install or upgrade the site's module (installer.install)")
async def install(request: Request, _caller: Website, body: Body) -> Response:
    return await relay(request, subjects.INSTALLER_INSTALL, body, service="installer",
                       timeout_s=INSTALL_TIMEOUT_S, success=201)


@router.get("/modules", summary="The installed module and the declared modules' fate (installer.list)")
async def list_modules(request: Request, _caller: Website) -> Response:
    return await relay(request, subjects.INSTALLER_LIST, {}, service="installer")


@router.delete("/modules/{id}", summary="Remove the installed module, freeing the site (installer.remove)")
async def remove(request: Request, _caller: Website, id: str) -> Response:  # noqa: A002 (the path's name)
    if re.fullmatch(subjects.MODULE_ID_PATTERN, id) is None:
        raise HTTPException(400, f"a module id must match {subjects.MODULE_ID_PATTERN}")
    return await relay(request, subjects.INSTALLER_REMOVE, {"id": id}, service="installer",
                       timeout_s=REMOVE_TIMEOUT_S)
