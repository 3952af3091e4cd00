"""The seed sidecar's HTTP API, drop-in (docs/web.md, "The sidecar's API, drop-in"): every route
with its method, body and statuses, forwarded as a command to ``shard.<shard>.cmd.<verb>`` or a
board read.

Each route is served twice: under ``/shards/{shard}/…`` for any shard, and at the sidecar's
bare path for the default shard (``SHARDBUS_WEB_DEFAULT_SHARD``), so a website written for the
sidecar changes only its base URL. Body rules are the seed's (docs/web.md, "Body rules"): a
plain route takes a JSON object (``null`` or empty = ``{}``; anything else 400 ``body must be a
JSON object``); a route with a path id puts it in the body (``runId``, ``id``), the path
winning, and reads a body that is not an object as ``{}``. ``reqId`` is the gateway's, fresh
per call; ``idempotencyKey`` passes untouched.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from services.web import nats_calls, nats_route
from services.web.auth import Caller, website
from services.web.sidecar.fast import Table
from services.web.sidecar.reply import NO_REPLY, NOT_CONNECTED, board_answer, command_answer
from shared import subjects
from shared.contracts.ids import is_shard_id
from shared.errors import ShardbusError

PROTOCOL_HEADER = "Shard-Protocol"
"""Passed on to the gateway: a shard speaking another protocol answers 409."""

SHARD_RULE = "shard must match [a-z0-9_-]{1,32}"
NO_DEFAULT = ("no default shard is configured (SHARDBUS_WEB_DEFAULT_SHARD): "
              "use /shards/{shard}/… paths")
BOARDS_AWAY = {"error": "no gateway is running to read the boards"}
BOARDS_LATE = {"error": "the gateway did not answer the board read in time"}
PATH_ID_MAX = 256
"""Longest run or page id taken from a path."""


@dataclass(frozen=True)
class Route:
    """One sidecar route: ``path_id`` names the body field its path id fills; ``query`` the
    query parameters copied into the body (``GET /lease?key=&target=``, docs/web.md, "Body rules")."""

    method: str
    path: str
    verb: str
    path_id: str | None = None
    query: tuple[str, ...] = ()
    example: dict[str, Any] | None = None


ROUTES: tuple[Route, ...] = (
    Route("POST", "/admin/ban", "admin.ban",
          example={"actor": "gm-ada", "account": "alice", "durationSec": 3600, "reason": "spam"}),
    Route("POST", "/admin/unban", "admin.unban", example={"actor": "gm-ada", "account": "alice"}),
    Route("POST", "/admin/broadcast", "admin.broadcast",
          example={"actor": "gm-ada", "text": "Server restart in 5 minutes", "hue": 33}),
    Route("GET", "/lease", "lease.list", query=("key", "target")),
    Route("POST", "/lease", "lease.apply",
          example={"key": "PlayerCaps.SkillCap", "value": "1300", "holdMs": 600000,
                   "untilMs": 1733000600000, "runId": "42", "idempotencyKey": "run42:step3"}),
    Route("POST", "/lease/release", "lease.release",
          example={"key": "PlayerCaps.SkillCap", "expected": "1300", "baseline": "1200",
                   "idempotencyKey": "run42:teardown:lease"}),
    Route("POST", "/participation", "participation.open",
          example={"runId": "42", "map": "Felucca", "x": 1400, "y": 1600, "radius": 30, "holdMs": 3600000}),
    Route("POST", "/participation/{run_id}/snapshot", "participation.snapshot", path_id="runId",
          example={"idempotencyKey": "run42:snapshot"}),
    Route("POST", "/participation/{run_id}/close", "participation.close", path_id="runId",
          example={"idempotencyKey": "run42:close"}),
    Route("POST", "/world", "world.spawn",
          example={"runId": "42", "what": "creature", "map": "Felucca", "x": 1400, "y": 1600}),
    Route("POST", "/world/save", "world.save", example={"idempotencyKey": "run42:save"}),
    Route("GET", "/world/{run_id}", "world.owned", path_id="runId"),
    Route("POST", "/world/{run_id}/despawn", "world.despawn", path_id="runId",
          example={"serials": ["0x40000001"], "idempotencyKey": "run42:teardown"}),
    Route("GET", "/items", "item.catalog"),
    Route("POST", "/items/grant", "item.grant",
          example={"runId": "42", "item": "gold", "amount": 500, "idempotencyKey": "run42:grant"}),
    Route("GET", "/pages", "pages.list"),
    Route("POST", "/pages/{page_id}/respond", "pages.respond", path_id="id",
          example={"text": "freed you"}),
    # The account plane: the seed names its verbs, not these paths (docs/web.md, "Routes and verbs").
    Route("POST", "/account/create", "account.create", example={"account": "carol"}),
    Route("POST", "/account/link", "account.link", example={"account": "carol", "userId": "u-17"}),
    Route("POST", "/account/unlink", "account.unlink", example={"account": "carol"}),
)
"""Every sidecar route (docs/web.md, "Routes and verbs"), in the order a router must try them
(``/world/save`` before ``/world/{run_id}``)."""

BOARDS: tuple[str, ...] = ("guilds", "market", "houses", "champions", "news", "ruleset", "points")
"""``GET /<board>``: the sidecar's boards and shardbus's houses, champions, news (docs/web.md, "Boards")."""


class BodyError(ShardbusError):
    """The request body cannot be a command's body."""

    status = HTTPStatus.BAD_REQUEST


def command_body(route: Route, value: Any, path_value: str | None, query: dict[str, str]) -> dict[str, Any]:
    """The body the command carries, by the seed's rules (see the module's docstring)."""
    if route.path_id is not None:
        body = dict(value) if isinstance(value, dict) else {}
        body[route.path_id] = path_value
        return body
    if value is None:
        body = {}
    elif isinstance(value, dict):
        body = dict(value)
    else:
        raise BodyError("body must be a JSON object")
    body.update({name: query[name] for name in route.query if name in query})
    return body


def _shard(request: Request, given: str | None) -> str | Response:
    if given is None:
        default = request.app.state.settings.web_default_shard
        return default or nats_route.error(HTTPStatus.NOT_FOUND, NO_DEFAULT)
    if not is_shard_id(given):
        return nats_route.error(HTTPStatus.BAD_REQUEST, SHARD_RULE)
    return given


async def _ask(request: Request, subject: str, body: dict[str, Any], headers: dict[str, str] | None,
               nobody: dict[str, str], late: dict[str, str]) -> dict[str, Any] | Response:
    """The gateway's reply, or the door's answer when there is none: ``nobody`` (503) when no
    gateway holds the subject or the door's NATS is away, ``late`` (504) when none came in time."""
    state = request.app.state
    try:
        return await nats_calls.call(state.nc, subject, body, state.settings.web_request_timeout_s, headers)
    except (nats_calls.NoResponders, nats_calls.NatsAway):
        return JSONResponse(nobody, status_code=HTTPStatus.SERVICE_UNAVAILABLE)
    except nats_calls.NoAnswer:
        return JSONResponse(late, status_code=HTTPStatus.GATEWAY_TIMEOUT)
    except nats_calls.TooLarge as exc:
        return nats_route.error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(exc))
    except nats_calls.BadReply:
        return nats_route.error(HTTPStatus.BAD_GATEWAY, "the gateway answered something that is not JSON")


async def forward(request: Request, shard: str, verb: str, body: dict[str, Any]) -> Response:
    """Send the command and answer as the sidecar does."""
    headers = None
    if (expected := request.headers.get(PROTOCOL_HEADER)) is not None:
        headers = {PROTOCOL_HEADER: expected[:64]}
    reply = await _ask(request, subjects.command(shard, verb), body, headers, NOT_CONNECTED, NO_REPLY)
    if isinstance(reply, Response):
        return reply
    status, answer = command_answer(reply)
    return JSONResponse(answer, status_code=status)


def _parameters(scoped: bool) -> list[inspect.Parameter]:
    """An endpoint's declared parameters: FastAPI reads the signature, for the auth dependency
    and for the path and query parameters of the OpenAPI document."""
    parameters = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
                  inspect.Parameter("caller", inspect.Parameter.KEYWORD_ONLY, annotation=Caller,
                                    default=Depends(website))]
    if scoped:
        parameters.append(inspect.Parameter("shard", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                                            default=Path(description="the shard's id, [a-z0-9_-]{1,32}")))
    return parameters


def _endpoint(route: Route, scoped: bool) -> Any:
    async def endpoint(request: Request, **params: Any) -> Response:
        shard = _shard(request, params.get("shard"))
        if isinstance(shard, Response):
            return shard
        path_value = params.get("run_id", params.get("page_id"))
        if path_value is not None and len(path_value) > PATH_ID_MAX:
            return nats_route.error(HTTPStatus.BAD_REQUEST, f"{route.path_id} is longer than {PATH_ID_MAX} characters")
        try:
            value = None if route.method == "GET" else await nats_route.json_value(request)
            body = command_body(route, value, path_value, dict(request.query_params))
        except BodyError as exc:
            return nats_route.error(HTTPStatus.BAD_REQUEST, str(exc))
        return await forward(request, shard, route.verb, body)

    parameters = _parameters(scoped)
    for name in ("run_id", "page_id"):
        if "{" + name + "}" in route.path:
            parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str,
                                                default=Path(description=f"becomes {route.path_id} in the body")))
    for name in route.query:
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                                            default=Query(None)))
    endpoint.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    endpoint.__name__ = f"{route.verb.replace('.', '_')}{'_shard' if scoped else ''}"
    return endpoint


def _board_endpoint(board: str, scoped: bool) -> Any:
    async def endpoint(request: Request, **params: Any) -> Response:
        shard = _shard(request, params.get("shard"))
        if isinstance(shard, Response):
            return shard
        reply = await _ask(request, subjects.board(shard, board), {}, None, BOARDS_AWAY, BOARDS_LATE)
        if isinstance(reply, Response):
            return reply
        status, answer = board_answer(reply)
        return JSONResponse(answer, status_code=status)

    endpoint.__signature__ = inspect.Signature(_parameters(scoped))  # type: ignore[attr-defined]
    endpoint.__name__ = f"board_{board}{'_shard' if scoped else ''}"
    return endpoint


def register(router: APIRouter) -> Table:
    """Add every sidecar route to ``router`` — the app's own: an included router's matching
    cost the hot path more than the whole NATS round trip (measured, docs/performance.md) —
    and return them as the table fast.py serves them from (FastAPI keeps them for OpenAPI)."""
    table = Table()
    for scoped in (True, False):
        prefix = "/shards/{shard}" if scoped else ""
        tag = "sidecar (any shard)" if scoped else "sidecar (default shard)"
        for route in ROUTES:
            extra = None
            if route.method == "POST":
                extra = {"requestBody": {"content": {"application/json": {
                    "schema": {"type": "object"}, "example": route.example or {}}}}}
            endpoint = _endpoint(route, scoped)
            router.add_api_route(prefix + route.path, endpoint, methods=[route.method],
                                 tags=[tag], summary=f"Send the shard the {route.verb} command",
                                 openapi_extra=extra, response_class=JSONResponse)
            table.add(route.method, prefix + route.path, router.routes[-1], endpoint)
        for board in BOARDS:
            endpoint = _board_endpoint(board, scoped)
            router.add_api_route(f"{prefix}/{board}", endpoint, methods=["GET"],
                                 tags=[tag], summary=f"the {board} board, as a JSON array",
                                 response_class=JSONResponse)
            table.add("GET", f"{prefix}/{board}", router.routes[-1], endpoint)
    return table

