"""The sidecar's routes answered without FastAPI's per-request machinery.

Profiled (docs/performance.md, "Web door"): FastAPI's route path (its telemetry and body-limit
middleware, router scan, exception and exit-stack wrappers, dependency solving) cost the door
more per request than its NATS call. :class:`Front` looks a request's method and path up in a
table of the sidecar's routes and hands a match to the door's own middleware (the same body
cap, metrics and 500 as every route) around that route's own endpoint, with the route's auth
checked first, as FastAPI would. Anything else (other paths and methods, a trailing slash)
goes to FastAPI's stack unchanged. The routes stay registered with FastAPI too, so the OpenAPI
document is generated exactly as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import Response

from services.web.auth import website
from services.web.nats_route import error

SCOPED = "/shards/{shard}"
PARAM = "{}"
"""A path parameter's place in a table key."""


@dataclass(frozen=True, slots=True)
class Target:
    """One route: ``route`` is what Starlette would put in the scope (the metrics read its
    path template); ``param`` names its path parameter (``run_id``, ``page_id``), if any."""

    route: Any
    endpoint: Callable[..., Awaitable[Response]]
    param: str | None


class Table:
    """Sidecar routes by method and path segments, a parameter as ``{}``."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str, bool, tuple[str, ...]], Target] = {}

    def add(self, method: str, path: str, route: Any, endpoint: Callable[..., Awaitable[Response]]) -> None:
        scoped = path.startswith(SCOPED + "/")
        segments = path[len(SCOPED) if scoped else 0:].split("/")[1:]
        params = [s[1:-1] for s in segments if s.startswith("{")]
        key = tuple(PARAM if s.startswith("{") else s for s in segments)
        if len(params) > 1 or (params and key[1] != PARAM):
            raise ValueError(f"{path}: the table takes one parameter at most, as the second segment")
        self._routes[(method, scoped, key)] = Target(route, endpoint, params[0] if params else None)

    def targets(self) -> list[Target]:
        return list(self._routes.values())

    def find(self, method: str, path: str) -> tuple[Target, dict[str, str]] | None:
        """The route and its path parameters, as Starlette would match them (a literal route
        before a parameter's: ``/world/save`` before ``/world/{run_id}``), or None."""
        segments = path.split("/")[1:]
        if "" in segments:  # an empty segment never matches a parameter; a trailing slash redirects
            return None
        params: dict[str, str] = {}
        scoped = len(segments) >= 3 and segments[0] == "shards"
        if scoped:
            params["shard"], segments = segments[1], segments[2:]
        target = self._routes.get((method, scoped, tuple(segments)))
        if target is None and len(segments) >= 2:
            target = self._routes.get((method, scoped, (segments[0], PARAM, *segments[2:])))
            if target is not None and target.param is not None:
                params[target.param] = segments[1]
        return None if target is None else (target, params)


class SidecarCore:
    """Answers a request :class:`Front` found in the table (``scope["endpoint"]``): the routes'
    auth first, as FastAPI's dependency would, then the route's own endpoint."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        try:
            await website(request)
            response = await scope["endpoint"](request, **scope["path_params"])
        except HTTPException as exc:  # as the app's handler answers it (http_app.py)
            response = error(exc.status_code, str(exc.detail), dict(exc.headers) if exc.headers else None)
        await response(scope, receive, send)


class Front:
    """The door's front: a sidecar route goes to ``fast`` (the door's own middleware — body
    cap, metrics, the 500 — around :class:`SidecarCore`), all else to ``full`` (FastAPI)."""

    def __init__(self, full: Any, fast: Any, table: Table, app: Any) -> None:
        self.full, self.fast, self.table, self.app = full, fast, table, app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        found = None
        if scope["type"] == "http" and not scope.get("root_path"):
            found = self.table.find(scope["method"], scope["path"])
        if found is None:
            await self.full(scope, receive, send)
            return
        target, params = found
        # What Starlette's app and router would have put in the scope.
        scope["app"], scope["route"], scope["endpoint"], scope["path_params"] = \
            self.app, target.route, target.endpoint, params
        await self.fast(scope, receive, send)
