"""The FastAPI application: the routers of each part of the door, one error shape
(``{"error": "…"}``), the body-size cap, and ``GET /health``.

Every router reads the NATS connection, settings and tokens from ``request.app.state``
(``nc``, ``settings``, ``tokens``; the feed adds ``feed``), set by :func:`build_http_app`;
app.py owns their life.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from services.web import installer_routes, ledger_routes
from services.web.auth import Tokens
from services.web.console import actions as console_actions
from services.web.console import routes as console_routes
from services.web.feed import routes as feed_routes
from services.web.nats_route import error
from services.web.openapi_doc import describe
from services.web.settings import WebSettings
from services.web.sidecar import routes as sidecar_routes
from services.web.sidecar.fast import Front, SidecarCore, Table

PROTOCOL_VERSION = 7
"""The shard protocol the door's sidecar routes speak (the sidecar seed's PROTOCOL_VERSION)."""


class BodyCap:
    """Pure ASGI middleware: a declared body over ``limit`` is 413 before it is read. (A body
    without a length is capped while read, in the routes.) Not ``@app.middleware("http")``,
    whose wrapping costs every request a task and a queue."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
                    response = error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {self.limit} bytes")
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class DoorApp(FastAPI):
    """FastAPI with the sidecar's routes served in front of it (sidecar/fast.py): through the
    door's own middleware (``user_middleware``: body cap, metrics) and the same 500, without
    FastAPI's other layers (its telemetry reads the environment on every request)."""

    sidecar: Table | None = None
    _front: Front | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.sidecar is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if self._front is None:  # at the first request: the middleware is all added by then
            fast: ASGIApp = SidecarCore()
            for middleware in reversed(self.user_middleware):
                fast = middleware.cls(fast, *middleware.args, **middleware.kwargs)
            handlers = self.exception_handlers  # the one FastAPI gives its own ServerErrorMiddleware
            handler = handlers.get(HTTPStatus.INTERNAL_SERVER_ERROR) or handlers.get(Exception)
            fast = ServerErrorMiddleware(fast, handler=handler, debug=self.debug)
            self._front = Front(super().__call__, fast, self.sidecar, self)
        await self._front(scope, receive, send)


METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
"""The methods a 405's ``Allow`` may name (the door serves no other)."""


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route of ``app`` answers at the request's path, for a 405's ``Allow``
    (docs/web.md, "Methods"): each method is matched against the routes as the router would.
    Starlette's own 405 names the methods of the first route whose path matched only
    (``OPTIONS /runs`` said ``Allow: POST`` although ``GET /runs`` is served too)."""
    allowed = []
    for method in METHODS:
        probe = {**scope, "type": "http", "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in app.router.routes):
            allowed.append(method)
    return allowed


def build_http_app(settings: WebSettings, nc: Any = None) -> DoorApp:
    """The door's ASGI app. ``nc`` (a connected nats-py client) may be set later, as
    ``app.state.nc``, once NATS is reached."""

    app = DoorApp(title="shardbus web door", version=str(PROTOCOL_VERSION),
                  description="The shard sidecar's HTTP API (protocol 7), the ledger and installer "
                  "over HTTP, and the live feed. See docs/web.md.")
    app.state.settings = settings
    app.state.tokens = Tokens(settings)
    app.state.nc = nc

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = getattr(exc, "headers", None)
        if exc.status_code == HTTPStatus.METHOD_NOT_ALLOWED:
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(app, request.scope))}
        return error(exc.status_code, str(exc.detail), headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> Response:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",)) or "body"
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return error(HTTPStatus.BAD_REQUEST, "invalid request: " + "; ".join(parts))

    # The sidecar's routes first: the drop-in path is the hot one, and routes match in order.
    # DoorApp serves them from a table (FastAPI's route path cost more than the call).
    app.sidecar = sidecar_routes.register(app.router)
    app.add_middleware(BodyCap, limit=settings.web_max_body_bytes)

    def exact_openapi() -> dict[str, Any]:
        """The document docs/openapi/web.json holds (services/web/openapi_doc.py), not
        FastAPI's default: made at the first request for it."""
        if app.openapi_schema is None:
            app.openapi_schema = describe(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = exact_openapi  # type: ignore[method-assign]

    @app.get("/health", include_in_schema=False)
    async def health() -> dict[str, Any]:
        nc_ = app.state.nc
        return {"status": HTTPStatus.OK, "service": "web", "nats": bool(nc_ is not None and nc_.is_connected),
                "protocol": PROTOCOL_VERSION}

    for router in (ledger_routes.router, installer_routes.router, feed_routes.router):
        app.include_router(router)
    # The operator's console (docs/console.md): HTML pages behind a session cookie.
    for router in (console_routes.router, console_actions.router):
        app.include_router(router)
    return app
