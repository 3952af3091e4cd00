"""The door's OpenAPI document (docs/web.md, "The OpenAPI document") is committed, current, lists
every sidecar route both bare and under /shards/{shard} (docs/web.md, "The sidecar's API,
drop-in"), and says what the door answers: no 422 (the door answers 400), every route's token,
its body's and its answers' schemas from shared/contracts, the 401's WWW-Authenticate, the
feed as text/event-stream, and the boards shardbus does not serve as always 404."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.web.openapi import document
from services.web.sidecar.routes import ROUTES
from shared.contracts import installer, ledger

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "openapi" / "web.json"
DOC = json.loads(COMMITTED.read_text())
OPERATIONS = [(path, method, op) for path, ops in DOC["paths"].items() for method, op in ops.items()]

SIDECAR_ROUTES = [  # (method, path) as docs/web.md's table lists them, not services/web's ROUTES
    ("post", "/admin/ban"), ("post", "/admin/unban"), ("post", "/admin/broadcast"),
    ("get", "/lease"), ("post", "/lease"), ("post", "/lease/release"),
    ("post", "/participation"), ("post", "/participation/{run_id}/snapshot"),
    ("post", "/participation/{run_id}/close"),
    ("post", "/world"), ("get", "/world/{run_id}"), ("post", "/world/{run_id}/despawn"),
    ("get", "/items"), ("post", "/items/grant"), ("post", "/world/save"),
    ("get", "/pages"), ("post", "/pages/{page_id}/respond"),
    ("post", "/account/create"), ("post", "/account/link"), ("post", "/account/unlink"),
    ("get", "/guilds"), ("get", "/market"), ("get", "/houses"), ("get", "/champions"), ("get", "/news"),
    ("get", "/ruleset"), ("get", "/points"),
]


def _schema(ref: dict) -> dict:
    return DOC["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]


def test_the_committed_openapi_document_matches_the_code():
    assert json.loads(COMMITTED.read_text()) == json.loads(json.dumps(document())), "run `make docs`"


@pytest.mark.parametrize(("method", "path"), SIDECAR_ROUTES, ids=[f"{m} {p}" for m, p in SIDECAR_ROUTES])
def test_every_sidecar_route_is_documented_bare_and_per_shard(method, path):
    assert method in DOC["paths"][path]
    assert method in DOC["paths"]["/shards/{shard}" + path]


async def test_a_running_door_serves_the_same_document(door):
    async with door.client(None) as http:
        served = await http.get("/openapi.json")
    assert served.status_code == 200 and served.json() == DOC


def test_no_token_is_in_the_document():
    assert "openapi-placeholder" not in COMMITTED.read_text()


def test_no_route_answers_422_and_every_error_has_the_error_body():
    for path, method, op in OPERATIONS:
        assert "422" not in op["responses"], f"{method} {path}"
        for status, answer in op["responses"].items():
            if status.startswith(("4", "5")):
                schema = json.dumps(answer["content"]["application/json"]["schema"])
                assert "#/components/schemas/Error" in schema, f"{method} {path} {status}"
    assert DOC["components"]["schemas"]["Error"]["required"] == ["error"]
    assert "HTTPValidationError" not in DOC["components"]["schemas"]


def test_every_route_takes_a_bearer_token_and_says_which():
    schemes = DOC["components"]["securitySchemes"]
    assert {name: (s["type"], s["scheme"]) for name, s in schemes.items()} == {
        "website": ("http", "bearer"), "operator": ("http", "bearer"), "module": ("http", "bearer")}
    for path, method, op in OPERATIONS:
        assert op["security"], f"{method} {path}"
        unauthorized = op["responses"]["401"]
        assert unauthorized["headers"]["WWW-Authenticate"]["schema"]["enum"] == ["Bearer"], f"{method} {path}"
        assert "403" in op["responses"], f"{method} {path}"
    takes = {(path, method): [next(iter(s)) for s in op["security"]] for path, method, op in OPERATIONS}
    assert takes[("/runs", "post")] == ["website", "operator"]
    assert takes[("/cleanup/sweep", "post")] == ["operator"]
    assert takes[("/modules/{module}/expired", "post")] == ["module", "operator"]


def test_bodies_and_answers_are_the_contracts_models():
    runs = DOC["paths"]["/runs"]
    assert runs["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CreateRun"}
    created = _schema(runs["post"]["responses"]["200"]["content"]["application/json"]["schema"])
    assert created["required"] == ["status", "run"]
    assert set(_schema({"$ref": "#/components/schemas/Run"})["properties"]) == {
        field.alias or name for name, field in ledger.Run.model_fields.items()}
    install = DOC["paths"]["/modules/install"]["post"]
    assert set(install["responses"]) >= {"201", "400", "409", "502", "503", "504"} and "200" not in install["responses"]
    assert _schema(install["requestBody"]["content"]["application/json"]["schema"])["required"] == ["url"]
    assert set(_schema(install["responses"]["201"]["content"]["application/json"]["schema"])["properties"]) >= {
        field.alias or name for name, field in installer.InstallReply.model_fields.items() if field.is_required()}
    # A path id is the path's: the body's schema does not ask for it.
    moved = DOC["paths"]["/runs/{runId}/status"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert moved["required"] == ["status"] and "runId" not in moved["properties"]
    # Every POST that takes a body declares it.
    for path, method, op in OPERATIONS:
        if method == "post":
            assert "application/json" in op["requestBody"]["content"], path


def test_parameters_carry_their_patterns_and_bounds():
    def parameter(path: str, method: str, name: str) -> dict:
        return next(p for p in DOC["paths"][path][method]["parameters"] if p["name"] == name)["schema"]

    assert parameter("/shards/{shard}/lease", "get", "shard")["pattern"] == "^[a-z0-9_-]{1,32}$"
    assert parameter("/runs/{runId}", "get", "runId")["pattern"] == "^[A-Za-z0-9_-]{1,64}$"
    assert parameter("/modules/{module}/reconcile", "post", "module")["pattern"] == "^[A-Za-z0-9_-]{1,64}$"
    assert parameter("/modules/{id}", "delete", "id")["pattern"] == "^[a-z0-9][a-z0-9_-]{0,63}$"
    assert parameter("/runs", "get", "limit") == {"type": "integer", "minimum": 1, "maximum": 1000}
    assert parameter("/live", "get", "limit")["maximum"] == 10_000
    assert parameter("/world/{run_id}", "get", "run_id")["maxLength"] == 256


def test_the_feed_is_an_event_stream_and_its_503_says_when_to_retry():
    events = DOC["paths"]["/events"]["get"]
    assert list(events["responses"]["200"]["content"]) == ["text/event-stream"]
    assert "Retry-After" in events["responses"]["503"]["headers"]


@pytest.mark.parametrize("board", ["ruleset", "points"])
def test_the_boards_shardbus_does_not_serve_are_documented_always_404(board):
    for path in (f"/{board}", f"/shards/{{shard}}/{board}"):
        answers = DOC["paths"][path]["get"]["responses"]
        assert "404" in answers and not any(status.startswith("2") for status in answers)


def test_a_sidecar_route_documents_the_shards_own_verdict():
    for route in ROUTES:
        answers = DOC["paths"][route.path][route.method.lower()]["responses"]
        assert set(answers) >= {"200", "400", "401", "403", "404", "409", "425", "429", "502", "503", "504"}
        assert "ShardAnswer" in json.dumps(answers["400"]) and "ShardAnswer" in json.dumps(answers["200"])
