"""The door's own answers, as docs/web.md words them: a 405 names every method its path takes
(``Allow``), and the 503 of a door without NATS is the sentence the docs quote."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (method, path, what Allow must name): a path two routes share, on FastAPI's routes and on the
# sidecar's fast table (docs/adr/0008), and a path of one route.
NOT_ALLOWED = [
    ("OPTIONS", "/runs", "GET, POST"),
    ("PUT", "/runs", "GET, POST"),
    ("OPTIONS", "/lease", "GET, POST"),
    ("DELETE", "/shards/uo1/lease", "GET, POST"),
    ("PATCH", "/modules/uo-events", "DELETE"),
    ("POST", "/modules", "GET"),
    ("POST", "/events", "GET"),
]


@pytest.mark.parametrize(("method", "path", "allow"), NOT_ALLOWED, ids=[f"{m} {p}" for m, p, _a in NOT_ALLOWED])
async def test_a_405_names_every_method_of_its_path(door, method, path, allow):
    async with door.client() as http:
        reply = await http.request(method, path)
    assert reply.status_code == 405
    assert reply.headers["allow"] == allow
    assert reply.json() == {"error": "Method Not Allowed"}


async def test_a_door_without_nats_answers_the_503_the_docs_quote(door):
    sentence = "the web door is not connected to NATS; retry shortly"
    assert f'`{{"error": "{sentence}"}}`' in (ROOT / "docs" / "web.md").read_text()
    await door.nc.close()
    async with door.client() as http:
        reply = await http.post("/runs", json={"runId": "r1", "shard": "uo1", "event": "invasion"})
    assert (reply.status_code, reply.json()) == (503, {"error": sentence})
