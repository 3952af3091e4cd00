"""The door's OpenAPI document is committed, current, and lists every route of the seed's
sidecar (S004:908-951) both bare and under /shards/{shard}."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.web.openapi import document

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "openapi" / "web.json"

SEED_ROUTES = [  # (method, axum path) from S004:911-951
    ("post", "/admin/ban"), ("post", "/admin/unban"), ("post", "/admin/broadcast"),
    ("get", "/lease"), ("post", "/lease"), ("post", "/lease/release"),
    ("post", "/participation"), ("post", "/participation/{run_id}/snapshot"),
    ("post", "/participation/{run_id}/close"),
    ("post", "/world"), ("get", "/world/{run_id}"), ("post", "/world/{run_id}/despawn"),
    ("get", "/items"), ("post", "/items/grant"), ("post", "/world/save"),
    ("get", "/pages"), ("post", "/pages/{page_id}/respond"),
    ("get", "/guilds"), ("get", "/market"), ("get", "/ruleset"), ("get", "/points"),
]


def test_the_committed_openapi_document_matches_the_code():
    assert COMMITTED.exists(), "run `make docs`"
    assert json.loads(COMMITTED.read_text()) == json.loads(json.dumps(document())), "run `make docs`"


@pytest.mark.parametrize(("method", "path"), SEED_ROUTES, ids=[f"{m} {p}" for m, p in SEED_ROUTES])
def test_every_sidecar_route_is_documented_bare_and_per_shard(method, path):
    paths = json.loads(COMMITTED.read_text())["paths"]
    assert method in paths[path]
    assert method in paths["/shards/{shard}" + path]


def test_no_token_is_in_the_document():
    assert "openapi-placeholder" not in COMMITTED.read_text()
