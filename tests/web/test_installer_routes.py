"""The installer over HTTP (services/web/installer_routes.py): real HTTP to the door, a real
`shardbus run installer` process behind it, releases from the installer tests' local HTTPS
release host. Every reply is the installer's NATS reply verbatim; a successful install is 201."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from services.web import installer_routes
from shared import subjects
from tests.installer.conftest import ca_file, releases, service_settings, settings, snapshot  # noqa: F401
from tests.web.conftest import MODULE_TOKENS, OPERATOR_TOKEN

ROUTES = [("post", "/modules/install"), ("get", "/modules"), ("delete", "/modules/uo-events")]


async def _nats(nc, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    return json.loads((await nc.request(subject, json.dumps(body).encode(), timeout=30)).data)


async def test_install_upgrade_list_and_remove_over_http(door, services, settings, releases, nc,  # noqa: F811
                                                         unique):
    services.start("installer", **service_settings(settings))
    first = releases.release(f"/{unique}", "uo-events", "1.4.0")
    newer = releases.release(f"/{unique}", "uo-events", "1.5.0")
    other = releases.release(f"/{unique}", "uo-vendors", "1.0.0")
    progress = await nc.subscribe(subjects.installer_progress(unique))
    async with door.client() as http, door.client(OPERATOR_TOKEN) as operator:
        installed = await http.post("/modules/install", json={"url": first, "requestId": unique})
        assert installed.status_code == 201, installed.text
        body = installed.json()
        assert body["status"] == 200 and body["action"] == "installed"  # the installer's reply, verbatim
        assert body["module"] == {"id": "uo-events", "version": "1.4.0"} and body["previous"] is None
        stages = []
        while not stages or stages[-1] != "done":
            stages.append(json.loads((await progress.next_msg(timeout=5)).data)["stage"])
        assert stages[0] == "manifest" and "download" in stages

        again = await operator.post("/modules/install", json={"url": first})
        assert (again.status_code, again.json()["action"]) == (201, "unchanged")
        upgraded = await http.post("/modules/install", json={"url": newer})
        assert (upgraded.status_code, upgraded.json()["action"]) == (201, "upgraded")
        assert upgraded.json()["previous"] == {"id": "uo-events", "version": "1.4.0"}

        listed = await http.get("/modules")
        assert listed.status_code == 200
        assert listed.json() == await _nats(nc, subjects.INSTALLER_LIST, {})
        assert listed.json()["modules"] == [{"id": "uo-events", "version": "1.5.0"}]

        before = snapshot(Path(settings.modules_dir))
        refused = await http.post("/modules/install", json={"url": other})
        assert (refused.status_code, refused.json()["status"]) == (409, 409)
        assert "upgrade uo-events or remove it first" in refused.json()["error"]
        assert snapshot(Path(settings.modules_dir)) == before
        assert releases.hits[f"/{unique}/uo-vendors-1.0.0.tar.gz"] == 0

        removed = await http.delete("/modules/uo-events")
        assert removed.status_code == 200
        assert removed.json()["removed"] == {"id": "uo-events", "version": "1.5.0"}
        gone = await http.delete("/modules/uo-events")
        assert (gone.status_code, gone.json()["status"]) == (404, 404)
        assert gone.json() == await _nats(nc, subjects.INSTALLER_REMOVE, {"id": "uo-events"})
        assert (await http.get("/modules")).json()["modules"] == []


async def test_the_installers_refusals_and_the_doors_own(door, services, settings, releases, unique):  # noqa: F811
    services.start("installer", **service_settings(settings))
    with socket.socket() as probe:  # a port nothing listens on, on an allowed host
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    missing = f"https://127.0.0.1:{releases.port}/{unique}/missing.json"
    cases: list[tuple[bytes, int, str]] = [
        # body, status, a word of the error
        (json.dumps({"url": f"http://127.0.0.1:{releases.port}/x.json"}).encode(), 400, "not https"),
        (json.dumps({"url": "https://elsewhere.example/x.json"}).encode(), 400, "elsewhere.example"),
        (json.dumps({"url": missing}).encode(), 400, "no such release"),
        (json.dumps({"url": f"https://127.0.0.1:{closed_port}/x.json"}).encode(), 502, "127.0.0.1"),
        (json.dumps({"url": missing, "requestId": "a.b"}).encode(), 400, "requestId"),
        (b"{}", 400, "url"),
        (b"", 400, "url"),
        (json.dumps({"url": "https://x/" + "a" * 3000}).encode(), 400, "url"),
        (b'["https://example.org/m.json"]', 400, "body must be a JSON object"),
        (b"https://example.org/m.json", 400, "body is not valid JSON"),
        (b"[" * 100_000, 400, "body is nested too deeply"),
    ]
    before = snapshot(Path(settings.modules_dir))
    async with door.client() as http:
        for payload, status, word in cases:
            got = await http.post("/modules/install", content=payload, headers={"Content-Type": "application/json"})
            assert got.status_code == status, (payload[:80], got.text)
            assert word in got.json()["error"], (payload[:80], got.json())
            if "status" in got.json():  # the installer's answer, not the door's
                assert got.json()["status"] == status
        for module_id in ("UO-events", "a.b", "-x", "x" * 65, "a%0A", "%2A", "a%20b", "%C3%A9"):
            got = await http.delete(f"/modules/{module_id}")
            assert got.status_code == 400 and "module id must match" in got.json()["error"], (module_id, got.text)
    assert snapshot(Path(settings.modules_dir)) == before


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_only_the_website_and_the_operator_may_use_the_installer(door, method, path):
    async with door.client(None) as anonymous:
        for headers, status in (({}, 401), ({"Authorization": "Bearer wrong-token"}, 401),
                                ({"Authorization": "Basic dXNlcjpwYXNz"}, 401),
                                ({"Authorization": f"Bearer {MODULE_TOKENS['events']}"}, 403)):
            got = await anonymous.request(method.upper(), path, headers=headers,
                                          **({"json": {"url": "https://x/m.json"}} if method == "post" else {}))
            assert got.status_code == status, (headers, got.text)
            assert set(got.json()) == {"error"}


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_with_no_installer_running_each_route_is_a_503(door, method, path):
    async with door.client() as http:
        got = await http.request(method.upper(), path, **({"json": {"url": "https://x/m.json"}}
                                                          if method == "post" else {}))
    subject = {"post": subjects.INSTALLER_INSTALL, "get": subjects.INSTALLER_LIST,
               "delete": subjects.INSTALLER_REMOVE}[method]
    assert got.status_code == 503
    assert got.json() == {"error": f"the installer is not running (no replica answers {subject})"}


async def test_an_install_that_outlasts_its_wait_is_a_504(start_door, nc, monkeypatch):
    monkeypatch.setattr(installer_routes, "INSTALL_TIMEOUT_S", 0.2)
    door = await start_door(web_request_timeout_s=0.2)
    silent = await nc.subscribe(subjects.INSTALLER_INSTALL, queue="installer")  # hears, never answers
    await nc.flush()
    try:
        async with door.client() as http:
            got = await http.post("/modules/install", json={"url": "https://x/m.json"})
    finally:
        await silent.unsubscribe()
    assert got.status_code == 504
    assert got.json() == {"error": "the installer did not answer installer.install within 0.2 s"}
