"""The console's door, over plain HTTP: only the operator token opens it; the session cookie
is HttpOnly, SameSite=Strict, scoped to /console, not the token, tamper-proof and ended by a
new operator token; a change wants the session's CSRF token; the login never sends anyone to
another site; the feed takes the cookie."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time

import httpx
import pytest

from services.web.console import auth as console_auth
from tests.web.conftest import MODULE_TOKENS, OPERATOR_TOKEN, WEBSITE_TOKEN


def _browser(door, **kwargs) -> httpx.AsyncClient:
    """A client like a browser: no bearer token, cookies kept, redirects not followed."""
    return door.client(None, follow_redirects=False, **kwargs)


async def _logged_in(http: httpx.AsyncClient) -> str:
    reply = await http.post("/console/login", data={"token": OPERATOR_TOKEN})
    assert reply.status_code == 303, reply.text
    return reply.cookies[console_auth.COOKIE]


async def test_only_the_operator_token_opens_the_console(door, caplog):
    caplog.set_level(logging.DEBUG)
    async with _browser(door) as http:
        page = await http.get("/console/runs?status=running")
        assert page.status_code == 303
        assert page.headers["location"] == "/console/login?next=%2Fconsole%2Fruns%3Fstatus%3Drunning"
        for wrong in ("", "nope", WEBSITE_TOKEN, MODULE_TOKENS["events"], OPERATOR_TOKEN + "x"):
            refused = await http.post("/console/login", data={"token": wrong})
            assert refused.status_code == 401, wrong
            assert "the console takes the operator token only" in refused.text
            assert "set-cookie" not in refused.headers
            assert not wrong or wrong not in refused.text  # never echoed

        reply = await http.post("/console/login", data={"token": OPERATOR_TOKEN, "next": "/console/shards"})
        assert (reply.status_code, reply.headers["location"]) == (303, "/console/shards")
        cookie = reply.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
        assert OPERATOR_TOKEN not in cookie
        runs = await http.get("/console/runs")
        assert runs.status_code == 200 and "<h1>Runs</h1>" in runs.text
        assert "the ledger is not running" in runs.text  # no ledger here: said, not a 500
        assert runs.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")
        assert OPERATOR_TOKEN not in runs.text
    assert OPERATOR_TOKEN not in caplog.text


async def test_every_console_page_carries_server_timing(door):
    # docs/console.md, "Login and session": every page carries Server-Timing; the login page did not.
    async with _browser(door) as http:
        answers = [await http.get("/console/login"),
                   await http.post("/console/login", data={"token": "nope"})]
        await _logged_in(http)
        answers += [await http.get("/console/runs"),
                    await http.post("/console/logout", data={"csrf": "stale"})]
    assert [a.status_code for a in answers] == [200, 401, 200, 403]
    for answer in answers:
        assert answer.headers["content-type"].startswith("text/html")
        assert re.fullmatch(r"app;dur=\d+\.\d\d", answer.headers["server-timing"]), answer.request.url


@pytest.mark.parametrize("target", ["https://elsewhere.example/", "//elsewhere.example/x", "/console/../x",
                                    "/elsewhere", "javascript:alert(1)", "/console\\x"])
async def test_the_login_goes_nowhere_but_the_console(door, target):
    async with _browser(door) as http:
        reply = await http.post("/console/login", data={"token": OPERATOR_TOKEN, "next": target})
    assert reply.headers["location"] == "/console/runs"


async def test_a_forged_stale_or_foreign_cookie_is_no_session(door, start_door):
    async with _browser(door) as http:
        value = await _logged_in(http)
    expiry, nonce, mac = value.split(".")
    key = hmac.new(OPERATOR_TOKEN.encode(), b"shardbus console session v1", hashlib.sha256).digest()
    old = f"{int(time.time()) - 1}.{nonce}"
    forged = [f"{expiry}.{nonce}.{'0' * 64}", f"{int(expiry) + 999}.{nonce}.{mac}", value + "0", "x",
              f"{old}.{hmac.new(key, old.encode(), hashlib.sha256).hexdigest()}"]
    for cookie in forged:
        async with _browser(door, cookies={console_auth.COOKIE: cookie}) as http:
            assert (await http.get("/console/runs")).status_code == 303, cookie
    async with _browser(door, cookies={console_auth.COOKIE: value}) as http:
        assert (await http.get("/console/runs")).status_code == 200
    other = await start_door(web_operator_token="another-operator-token-3311")  # the token changed
    async with _browser(other, cookies={console_auth.COOKIE: value}) as http:
        assert (await http.get("/console/runs")).status_code == 303


async def test_a_change_wants_the_session_and_its_csrf_token(door):
    async with _browser(door) as anonymous:
        assert (await anonymous.post("/console/api/runs/r1/sweep")).status_code == 401
        # The bearer token is the HTTP API's; the console's routes take the session only.
        bearer = await anonymous.post("/console/api/runs/r1/sweep",
                                      headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
        assert bearer.status_code == 401
        assert (await anonymous.get("/console/events")).status_code == 401
        assert (await anonymous.get("/console/api/install-progress/abc")).status_code == 401
    async with _browser(door) as http:
        await _logged_in(http)
        page = (await http.get("/console/runs/r1")).text
        csrf = page.split('name="console-csrf" content="')[1].split('"')[0]
        assert len(csrf) == 40
        for headers in ({}, {"X-Console-Csrf": "0" * 40}):
            refused = await http.post("/console/api/runs/r1/sweep", headers=headers)
            assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
        # With the token the change is asked (no cleanup service runs here: its 503).
        asked = await http.post("/console/api/runs/r1/sweep", headers={"X-Console-Csrf": csrf})
        assert asked.status_code == 503 and "cleanup service is not running" in asked.json()["error"]
        bad = await http.post("/console/api/module/UO.x/remove", headers={"X-Console-Csrf": csrf})
        assert bad.status_code == 400

        # Logging out ends the session (a stale form is refused).
        assert (await http.post("/console/logout", data={"csrf": "stale"})).status_code == 403
        out = await http.post("/console/logout", data={"csrf": csrf})
        assert out.status_code == 303 and console_auth.COOKIE in out.headers["set-cookie"]
        assert (await http.get("/console/runs")).status_code == 303


async def test_the_feed_takes_the_console_session(door):
    async with _browser(door) as http:
        await _logged_in(http)
        async with http.stream("GET", "/console/events", params={"types": "ledger", "shards": "uo1"}) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            async for line in stream.aiter_lines():
                if line.startswith("data:"):
                    assert '"type":"hello"' in line
                    break
        bad = await http.get("/console/events", params={"shards": "UO!"})
        assert bad.status_code == 400 and "not a shard id" in bad.json()["error"]
