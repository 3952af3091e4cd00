"""The console's changes and streams, behind its session cookie: "sweep now" and "retry cleanup"
(``cleanup.sweep`` / ``cleanup.retry`` for one run), a module's install and removal
(``installer.install`` / ``installer.remove``), each relayed verbatim as the door's HTTP routes
relay them (a change also wants the CSRF token); an install's progress
(``installer.progress.<requestId>``) as server-sent events; and the live feed (``/events``)
for a browser that holds the cookie instead of a token. The installer's requests, replies and
progress events are read and written with its contract (:mod:`shared.contracts.installer`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from services.web.console import auth
from services.web.feed.filter import FeedFilter, FeedQueryError, sequence
from services.web.feed.routes import open_event_stream
from services.web.installer_routes import INSTALL_TIMEOUT_S, MODULE_ID_RULE, REMOVE_TIMEOUT_S, ask_installer
from services.web.ledger_routes import CLEANUP_TIMEOUT_S
from services.web.nats_route import json_object, relay
from shared import subjects
from shared.contracts import installer as c
from shared.contracts.ids import LEDGER_ID_PATTERN, REQUEST_ID_PATTERN, is_ledger_id, is_module_id

router = APIRouter(include_in_schema=False)

Change = Annotated[str, Depends(auth.operator_change)]
Reader = Annotated[str, Depends(auth.operator_api)]
Body = Annotated[dict[str, Any], Depends(json_object)]

PROGRESS_MAX_S = INSTALL_TIMEOUT_S
"""The longest an install's progress stream stays open."""

PROGRESS_KEEPALIVE_S = 10.0


def _run_id(run_id: str) -> str:
    if not is_ledger_id(run_id):
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"runId must match {LEDGER_ID_PATTERN}")
    return run_id


@router.post("/console/api/runs/{run_id}/sweep")
async def sweep(request: Request, run_id: str, _session: Change) -> Response:
    return await relay(request, subjects.CLEANUP_SWEEP, {"runId": _run_id(run_id)}, service="cleanup service",
                       timeout_s=CLEANUP_TIMEOUT_S)


@router.post("/console/api/runs/{run_id}/retry")
async def retry(request: Request, run_id: str, _session: Change) -> Response:
    return await relay(request, subjects.CLEANUP_RETRY, {"runId": _run_id(run_id)}, service="cleanup service",
                       timeout_s=CLEANUP_TIMEOUT_S)


@router.post("/console/api/module/install")
async def install(request: Request, _session: Change, body: Body) -> Response:
    return await ask_installer(request, subjects.INSTALLER_INSTALL, c.InstallRequest, body, c.InstallReply,
                               timeout_s=INSTALL_TIMEOUT_S, success=HTTPStatus.CREATED)


@router.post("/console/api/module/{module_id}/remove")
async def remove(request: Request, module_id: str, _session: Change) -> Response:
    if not is_module_id(module_id):
        raise HTTPException(HTTPStatus.BAD_REQUEST, MODULE_ID_RULE)
    return await ask_installer(request, subjects.INSTALLER_REMOVE, c.RemoveRequest, {"id": module_id}, c.RemoveReply,
                               timeout_s=REMOVE_TIMEOUT_S)


@router.get("/console/api/install-progress/{request_id}")
async def install_progress(request: Request, request_id: str, _session: Reader) -> Response:
    """``event: ready`` once subscribed (start the install then), then each progress event
    (``{requestId, stage, done, total}``) until the stage ``done``."""
    if re.fullmatch(REQUEST_ID_PATTERN, request_id) is None:
        raise HTTPException(HTTPStatus.BAD_REQUEST, f"requestId must match {REQUEST_ID_PATTERN}")
    nc = request.app.state.nc
    if nc is None or not nc.is_connected:
        raise HTTPException(HTTPStatus.SERVICE_UNAVAILABLE, "the web door is not connected to NATS; retry shortly")
    queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=256)

    async def heard(msg: Any) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(msg.data)

    sub = await nc.subscribe(subjects.installer_progress(request_id), cb=heard)
    await nc.flush()
    return StreamingResponse(_progress(sub, queue), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _progress(sub: Any, queue: asyncio.Queue[bytes]) -> AsyncIterator[bytes]:
    deadline = time.monotonic() + PROGRESS_MAX_S
    try:
        yield b"event: ready\ndata: {}\n\n"
        while time.monotonic() < deadline:
            try:
                data = await asyncio.wait_for(queue.get(), PROGRESS_KEEPALIVE_S)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            try:
                event = c.ProgressEvent.model_validate_json(data)
            except ValidationError:  # not JSON, or not a progress event: not the installer's
                continue
            yield f"data: {json.dumps(event.wire(), separators=(',', ':'))}\n\n".encode()
            if event.stage == "done":
                return
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


@router.get("/console/events")
async def console_events(request: Request, _session: Reader) -> Response:
    """The live feed (docs/web.md, "The live feed"), the console's session standing for a token."""
    app = request.app
    query: dict[str, list[str]] = {}
    for key, value in request.query_params.multi_items():
        query.setdefault(key, []).append(value)
    try:
        wanted = FeedFilter.parse(query, app.state.settings.web_feed_boards)
        given = query.get("since")
        since = sequence("since", given[-1] if given else None)
        if (last := request.headers.get("last-event-id")) is not None:
            since = sequence("Last-Event-ID", last.strip())
    except FeedQueryError as exc:
        raise HTTPException(HTTPStatus.BAD_REQUEST, str(exc)) from None
    return await open_event_stream(app, wanted, since)
