"""The sidecar's table (services/web/sidecar/fast.py) picks, for every method and path, the
route Starlette's router would pick, with the same path parameters, or leaves the request to
FastAPI: the door's routing is the same with and without it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr
from starlette.routing import Match

from services.web.http_app import build_http_app
from services.web.settings import WebSettings
from services.web.sidecar.routes import BOARDS, ROUTES

APP = build_http_app(WebSettings(web_token=SecretStr("fast-table-test-token")))
TABLE = APP.sidecar
assert TABLE is not None

FILLED = {"{shard}": "s1", "{run_id}": "r-7", "{page_id}": "p9"}
TEMPLATES = sorted({path for route in APP.router.routes if isinstance(path := getattr(route, "path", None), str)})
PATHS = sorted({
    *(t.replace("{shard}", FILLED["{shard}"]).replace("{run_id}", FILLED["{run_id}"])
      .replace("{page_id}", FILLED["{page_id}"]) for t in TEMPLATES),
    "/world/save", "/shards/s1/world/save", "/world/save/despawn", "/shards/world/save", "/shards/s1",
    "/shards//items", "/items/", "/shards/s1/items/", "//items", "/world/x/y", "/shards/shards/items",
    "/participation/save/snapshot", "/pages/x", "/lease/release/x", "/health", "/docs", "/openapi.json",
})
SIDECAR = {id(t.route) for t in TABLE.targets()}
METHODS = ("GET", "POST", "PUT", "DELETE", "HEAD")


def starlette_choice(method: str, path: str) -> tuple[Any, dict[str, str]] | None:
    """The route the app's router would run, and its path parameters (first full match)."""
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    for route in APP.router.routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            return route, child.get("path_params", {})
    return None


@pytest.mark.parametrize("path", PATHS)
def test_the_table_routes_as_starlette_does(path):
    for method in METHODS:
        chosen = starlette_choice(method, path)
        found = TABLE.find(method, path)
        if found is None:  # left to FastAPI: then it is no sidecar route FastAPI would run
            assert chosen is None or id(chosen[0]) not in SIDECAR, (method, path)
        else:
            target, params = found
            assert chosen is not None and target.route is chosen[0] and params == chosen[1], (method, path)


def test_every_sidecar_route_is_in_the_table():
    sidecar = {id(r) for r in APP.router.routes if "sidecar" in " ".join(getattr(r, "tags", []))}
    assert sidecar == SIDECAR and len(SIDECAR) == 2 * (len(ROUTES) + len(BOARDS))  # bare and per shard
