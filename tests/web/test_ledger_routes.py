"""The ledger and cleanup over HTTP (services/web/ledger_routes.py): real HTTP to the door, a
real ledger on NATS and PostgreSQL behind it (and a real cleanup process for the cleanup
routes). Every reply is the ledger's NATS reply verbatim, its ``status`` the HTTP status."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from shared import subjects
from tests.cleanup.conftest import start_cleanup
from tests.ledger.conftest import db, ledger, ledger_db  # noqa: F401 — fixtures
from tests.web.conftest import MODULE_TOKENS, OPERATOR_TOKEN, WEBSITE_TOKEN

EVENTS, QUESTS = MODULE_TOKENS["events"], MODULE_TOKENS["quests"]


async def _nats(ledger, subject: str, body: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
    """The same request straight over NATS (what the HTTP body must equal)."""
    return await ledger.ask(subject, **body)


async def _tables(conn: asyncpg.Connection) -> list[Any]:
    """Everything the ledger holds, to prove a refused request changed nothing."""
    return [tuple(r) for r in await conn.fetch(
        "SELECT 'run', run_id, status || '/' || cleanup_status FROM runs UNION ALL "
        "SELECT 'res', id::text, status || '/' || module FROM resources UNION ALL "
        "SELECT 'log', id::text, kind FROM run_log ORDER BY 1, 2")]


async def _run_with_rows(http, run: str) -> list[dict[str, Any]]:
    """A running run holding one confirmed row of ``events`` and one of ``quests``."""
    assert (await http.post("/runs", json={"runId": run, "shard": "uo1", "event": "invasion"})).status_code == 200
    assert (await http.post(f"/runs/{run}/status", json={"status": "running"})).status_code == 200
    rows = []
    for module in ("events", "quests"):
        reply = await http.post("/resources/record", json={"runId": run, "module": module, "kind": "banner",
                                                           "ref": "b1", "idempotencyKey": f"{run}:{module}"})
        assert reply.status_code == 200, reply.text
        rows.append(reply.json()["resource"])
    return rows


# --- success: every route, its reply the NATS reply ------------------------------------

async def test_runs_and_resources_over_http_answer_what_nats_answers(door, ledger, unique):  # noqa: F811
    run = f"r{unique}"
    async with door.client() as http:
        created = await http.post("/runs", json={"runId": run, "shard": "uo1", "event": "invasion"})
        assert created.status_code == 200 and created.json()["status"] == 200
        assert created.json()["run"]["runId"] == run and created.json()["run"]["status"] == "scheduled"
        # The path wins over the body.
        moved = await http.post(f"/runs/{run}/status", json={"runId": "someone-else", "status": "running"})
        assert moved.status_code == 200 and moved.json()["run"] == {**moved.json()["run"], "runId": run,
                                                                       "status": "running"}
        key = {"runId": run, "module": "events", "kind": "banner"}
        reserved = await http.post("/resources/reserve", json={**key, "ref": "b1", "idempotencyKey": "k1",
                                                               "revert": {"flag": "off"}})
        assert reserved.status_code == 200 and reserved.json()["resource"]["status"] == "pending"
        rid = reserved.json()["resource"]["resourceId"]
        confirmed = await http.post("/resources/confirm", json={"resourceId": rid})
        assert confirmed.status_code == 200 and confirmed.json()["resource"]["status"] == "confirmed"
        failing = await http.post("/resources/reserve", json={**key, "ref": "b2", "idempotencyKey": "k2"})
        failed = await http.post("/resources/fail", json={"resourceId": failing.json()["resource"]["resourceId"],
                                                          "error": "the shard said no"})
        assert failed.status_code == 200 and failed.json()["resource"]["status"] == "reverted"
        recorded = await http.post("/resources/record", json={**key, "ref": "b3", "idempotencyKey": "k3"})
        assert recorded.status_code == 200 and recorded.json()["resource"]["status"] == "confirmed"

        # Reads: the HTTP body is the NATS reply, byte for byte once decoded.
        reads = [
            ("/runs", {"status": "running"}, subjects.LEDGER_RUNS, {"status": "running"}),
            ("/runs", {"status": "running", "cleanupStatus": "pending", "limit": "1"}, subjects.LEDGER_RUNS,
             {"status": "running", "cleanupStatus": "pending", "limit": 1}),
            (f"/runs/{run}", {}, subjects.LEDGER_CONSOLE, {"runId": run}),
            (f"/runs/{run}", {"limit": "1", "after": "0"}, subjects.LEDGER_CONSOLE,
             {"runId": run, "limit": 1, "after": 0}),
            (f"/runs/{run}/log", {}, subjects.LEDGER_LOG, {"runId": run}),
            (f"/runs/{run}/log", {"limit": "2"}, subjects.LEDGER_LOG, {"runId": run, "limit": 2}),
            ("/live", {"module": "events"}, subjects.LEDGER_LIVE, {"module": "events"}),
        ]
        for path, params, subject, body in reads:
            got = await http.get(path, params=params)
            assert got.status_code == 200, (path, got.text)
            assert got.json() == await _nats(ledger, subject, body), path
        console = (await http.get(f"/runs/{run}")).json()
        assert [r["ref"] for r in console["resources"]] == ["b1", "b2", "b3"] and console["unresolved"] == 2
        log = (await http.get(f"/runs/{run}/log", params={"limit": 2})).json()
        assert [e["kind"] for e in log["entries"]] == ["run.created", "run.status"] and log["next"] is not None
        assert [r["ref"] for r in (await http.get("/live", params={"module": "events"})).json()["resources"]] == \
            ["b1", "b3"]


async def test_a_module_reports_its_own_expiries_and_reconciles(door, ledger, unique):  # noqa: F811
    run = f"r{unique}"
    async with door.client() as http, door.client(EVENTS) as events, door.client(OPERATOR_TOKEN) as operator:
        await _run_with_rows(http, run)
        await http.post("/resources/record", json={"runId": run, "module": "events", "kind": "banner", "ref": "b2",
                                                   "idempotencyKey": f"{run}:b2"})
        expired = await events.post("/modules/events/expired", json={"kind": "banner", "ref": "b1"})
        assert (expired.status_code, expired.json()) == (200, {"status": 200, "expired": 1})
        reconciled = await events.post("/modules/events/reconcile", json={"runId": run, "present": []})
        assert (reconciled.status_code, reconciled.json()) == (200, {"status": 200, "orphaned": 1})
        # The operator may act for any module.
        by_operator = await operator.post("/modules/quests/expired", json={"kind": "banner", "ref": "b1"})
        assert (by_operator.status_code, by_operator.json()) == (200, {"status": 200, "expired": 1})
        statuses = {(r["module"], r["ref"]): r["status"] for r in (await http.get(f"/runs/{run}")).json()["resources"]}
    assert statuses == {("events", "b1"): "expired", ("events", "b2"): "orphaned", ("quests", "b1"): "expired"}


async def test_the_owner_is_the_tokens_module_never_the_body(door, ledger, db, unique):  # noqa: F811
    run = f"r{unique}"
    async with door.client() as http, door.client(EVENTS) as events:
        await _run_with_rows(http, run)
        before = await _tables(db)
        # Another module's path: refused before anything is asked.
        for path, body in (("/modules/quests/expired", {"kind": "banner", "ref": "b1"}),
                           ("/modules/quests/reconcile", {"runId": run, "present": []})):
            refused = await events.post(path, json=body)
            assert refused.status_code == 403 and "'events'" in refused.json()["error"], refused.text
        assert await _tables(db) == before
        # Its own path, with a body naming another owner: only its own rows are touched.
        hijack = {"kind": "banner", "ref": "b1", "module": "quests", "owner": "quests", "ownerModule": "quests"}
        assert (await events.post("/modules/events/expired", json=hijack)).json() == {"status": 200, "expired": 1}
        assert (await events.post("/modules/events/reconcile",
                                  json={"runId": run, "present": [], "module": "quests"})).json()["orphaned"] == 0
        statuses = {r["module"]: r["status"] for r in (await http.get(f"/runs/{run}")).json()["resources"]}
    assert statuses == {"events": "expired", "quests": "confirmed"}


# --- the ledger's errors, relayed ------------------------------------------------------

async def test_the_ledgers_refusals_come_back_with_their_status_and_sentence(door, ledger, db, unique):  # noqa: F811
    run, scheduled = f"r{unique}", f"s{unique}"
    async with door.client() as http:
        await _run_with_rows(http, run)
        await http.post("/runs", json={"runId": scheduled, "shard": "uo1", "event": "invasion"})
        cases: list[tuple[str, str, dict[str, Any], int, str]] = [
            # method, path, body or query, status, a word of the error
            ("post", "/runs", {}, 400, "shard"),
            ("post", "/runs", {"runId": "a.b", "shard": "uo1", "event": "e"}, 400, "runId"),
            ("post", "/runs", {"runId": run, "shard": "uo2", "event": "e"}, 409, "already exists"),
            ("post", f"/runs/nope{unique}/status", {"status": "running"}, 404, f"nope{unique}"),
            ("post", f"/runs/{scheduled}/status", {"status": "completed"}, 409, "scheduled"),
            ("post", f"/runs/{run}/status", {"status": "exploded"}, 400, "status"),
            ("post", "/runs/a.b/status", {"status": "running"}, 400, "runId"),
            ("get", f"/runs/nope{unique}", {}, 404, f"nope{unique}"),
            ("get", f"/runs/nope{unique}/log", {}, 404, f"nope{unique}"),
            ("get", f"/runs/{run}", {"limit": "0"}, 400, "limit"),
            ("get", f"/runs/{run}/log", {"after": "-1"}, 400, "after"),
            ("get", "/runs", {"status": "exploded"}, 400, "status"),
            ("get", "/runs", {"limit": "100000"}, 400, "limit"),
            ("get", "/live", {}, 400, "module"),
            ("get", "/live", {"module": "a.b"}, 400, "module"),
            ("post", "/resources/reserve", {"runId": run, "module": "events", "kind": "banner", "ref": "b1",
                                            "idempotencyKey": "other"}, 409, "b1"),
            ("post", "/resources/reserve", {"runId": run, "module": "events", "kind": "banner", "ref": "b9",
                                            "idempotencyKey": "big", "revert": {"x": "y" * 9000}}, 400, "revert"),
            ("post", "/resources/record", {"runId": run}, 400, "module"),
            ("post", "/resources/confirm", {"resourceId": 2**62}, 404, str(2**62)),
            ("post", "/resources/confirm", {"resourceId": "5"}, 400, "resourceId"),
            ("post", "/resources/fail", {"resourceId": 1}, 400, "error"),
        ]
        before = await _tables(db)
        for method, path, payload, status, word in cases:
            if method == "get":
                got = await http.get(path, params=payload)
            else:
                got = await http.post(path, json=payload)
            body = got.json()
            assert (got.status_code, body.get("status")) == (status, status), (path, payload, got.text)
            assert word in body["error"], (path, payload, body)
        assert await _tables(db) == before
        # Verbatim: the body is what NATS answers the same request.
        got = await http.post(f"/runs/nope{unique}/status", json={"status": "running"})
        assert got.json() == await _nats(ledger, subjects.LEDGER_RUN_STATUS, {"runId": f"nope{unique}",
                                                                              "status": "running"})


async def test_query_values_the_door_cannot_read_are_a_400(door, ledger, unique):  # noqa: F811
    async with door.client() as http:
        for path, params in (("/runs", {"limit": "ten"}), (f"/runs/r{unique}", {"after": "1.5"}),
                             (f"/runs/r{unique}/log", {"limit": "1e3"}), ("/live", {"module": "x", "after": "x"})):
            got = await http.get(path, params=params)
            assert got.status_code == 400 and "invalid request" in got.json()["error"], (path, got.text)


# --- who may call what -----------------------------------------------------------------

WEBSITE_ROUTES = [("post", "/runs"), ("get", "/runs"), ("get", "/runs/r1"), ("get", "/runs/r1/log"),
                  ("post", "/runs/r1/status"), ("post", "/resources/reserve"), ("post", "/resources/record"),
                  ("post", "/resources/confirm"), ("post", "/resources/fail"), ("get", "/live"),
                  ("post", "/cleanup/retry")]
MODULE_ROUTES = [("post", "/modules/events/expired"), ("post", "/modules/events/reconcile")]
OPERATOR_ROUTES = [("post", "/cleanup/sweep"), ("post", "/cleanup/reconcile")]
ALL_ROUTES = WEBSITE_ROUTES + MODULE_ROUTES + OPERATOR_ROUTES


def _refusals() -> list[tuple[str, str, str | None, int]]:
    cases = []
    for method, path in ALL_ROUTES:
        cases += [(method, path, None, 401), (method, path, "not-a-token-of-this-door", 401)]
    cases += [(m, p, EVENTS, 403) for m, p in WEBSITE_ROUTES + OPERATOR_ROUTES]
    cases += [(m, p, WEBSITE_TOKEN, 403) for m, p in MODULE_ROUTES + OPERATOR_ROUTES]
    cases += [(m, p.replace("events", "quests"), EVENTS, 403) for m, p in MODULE_ROUTES]
    return cases


async def test_every_route_refuses_callers_it_is_not_for(door, ledger, db):  # noqa: F811
    before = await _tables(db)
    async with door.client(None) as http:
        for method, path, token, status in _refusals():
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            got = await http.request(method.upper(), path, headers=headers,
                                     **({"json": {"kind": "k", "ref": "r"}} if method == "post" else {}))
            assert got.status_code == status, (method, path, token, got.text)
            assert set(got.json()) == {"error"}
            if status == 401:
                assert got.headers["www-authenticate"] == "Bearer"
    assert await _tables(db) == before


# --- nobody there, nobody answering ----------------------------------------------------

async def test_with_no_ledger_running_each_route_says_so_with_a_503(door):
    async with door.client(OPERATOR_TOKEN) as http:
        for method, path in ALL_ROUTES:
            got = await http.request(method.upper(), path,
                                     **({"json": {}} if method == "post" else {}))
            assert got.status_code == 503, (path, got.text)
            service = "cleanup service" if path.startswith("/cleanup") else "ledger"
            assert got.json()["error"].startswith(f"the {service} is not running (no replica answers ")
    async with door.client() as http:
        got = await http.post("/runs", json={"shard": "uo1", "event": "e"})
    assert got.json() == {"error": "the ledger is not running (no replica answers ledger.run.create)"}


async def test_a_ledger_that_does_not_answer_in_time_is_a_504(start_door, nc):
    door = await start_door(web_request_timeout_s=0.3)
    silent = await nc.subscribe(subjects.LEDGER_RUN_CREATE, queue=subjects.LEDGER_QUEUE)  # hears, never answers
    await nc.flush()
    try:
        async with door.client() as http:
            got = await http.post("/runs", json={"shard": "uo1", "event": "e"})
    finally:
        await silent.unsubscribe()
    assert got.status_code == 504
    assert got.json() == {"error": "the ledger did not answer ledger.run.create within 0.3 s"}


async def test_a_reply_that_is_not_an_envelope_is_a_502(door, nc):
    async def garbage(msg: Any) -> None:
        await msg.respond(b"[1, 2]" if b"a" in msg.data else b'{"status": "200"}')

    sub = await nc.subscribe(subjects.LEDGER_RUNS, cb=garbage)
    await nc.flush()
    try:
        async with door.client() as http:
            not_object = await http.get("/runs", params={"status": "a"})
            no_status = await http.get("/runs")
    finally:
        await sub.unsubscribe()
    assert not_object.status_code == 502 and "not a JSON object" in not_object.json()["error"]
    assert no_status.status_code == 502 and "without a valid status" in no_status.json()["error"]


# --- hostile input ---------------------------------------------------------------------

HOSTILE_BODIES: list[tuple[bytes, str]] = [
    (b"[]", "body must be a JSON object"),
    (b'"runs"', "body must be a JSON object"),
    (b"42", "body must be a JSON object"),
    (b"null", "body must be a JSON object"),
    (b"not json", "body is not valid JSON"),
    (b'{"shard": "uo1",', "body is not valid JSON"),
    (b"\xff\xfe\x00garbage", "body is not valid JSON"),
    (b"[" * 200_000, "body is"),
    (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "body is"),
    (b'{"shard": "uo1", "event": "e", "n": ' + b"9" * 5000 + b"}", "more than 4300 digits"),
    (b'{"shard": "uo1", "event": "e", "n": NaN}', "NaN is not JSON"),
    (b'{"shard": "uo1", "event": "e", "n": -Infinity}', "Infinity is not JSON"),
    (b'{"shard": "uo1", "event": "\\ud800"}', "lone surrogate"),
]


@pytest.mark.parametrize(("payload", "why"), HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
async def test_a_hostile_body_is_a_400_and_changes_nothing(door, ledger, db, payload, why):  # noqa: F811
    before = await _tables(db)
    async with door.client(OPERATOR_TOKEN) as http:
        for path in ("/runs", "/runs/r1/status", "/resources/record", "/modules/events/expired",
                     "/cleanup/sweep"):
            got = await http.post(path, content=payload, headers={"Content-Type": "application/json"})
            assert got.status_code == 400, (path, got.text)
            assert why in got.json()["error"], (path, got.json())
    assert await _tables(db) == before


async def test_a_body_over_the_cap_is_a_413_even_without_a_length(door, ledger, db):  # noqa: F811
    before = await _tables(db)
    big = b'{"shard": "uo1", "event": "' + b"x" * (door.settings.web_max_body_bytes + 10) + b'"}'

    async def chunks():
        for start in range(0, len(big), 65536):
            yield big[start:start + 65536]

    async with door.client() as http:
        announced = await http.post("/runs", content=big)
        streamed = await http.post("/runs", content=chunks())  # chunked: no Content-Length
    assert announced.status_code == 413 and streamed.status_code == 413, (announced.text, streamed.text)
    assert "over" in streamed.json()["error"]
    assert await _tables(db) == before


BAD_MODULES = ["a.b", "a*", ">", "events%0A", "events%20", "x" * 65, "%C3%A9", "a%00b", "events.x"]


@pytest.mark.parametrize("module", BAD_MODULES)
async def test_a_module_path_that_is_no_subject_token_is_a_400(door, ledger, db, module):  # noqa: F811
    before = await _tables(db)
    async with door.client(OPERATOR_TOKEN) as http, door.client(EVENTS) as events:
        for client in (http, events):
            for action in ("expired", "reconcile"):
                got = await client.post(f"/modules/{module}/{action}", json={"kind": "k", "ref": "r"})
                assert got.status_code == 400 and "module must match" in got.json()["error"], got.text
    assert await _tables(db) == before


async def test_an_empty_body_is_an_empty_object(door, ledger):  # noqa: F811
    async with door.client() as http:
        got = await http.post("/runs")
    assert got.status_code == 400 and "shard" in got.json()["error"]  # the ledger's 400, not the door's


# --- cleanup ---------------------------------------------------------------------------

async def test_cleanup_sweep_retry_and_reconcile_over_http(door, ledger, services, nc, unique):  # noqa: F811
    answers = {"result": "refused"}

    async def module_revert(msg: Any) -> None:  # the game module giving back its own banners
        await msg.respond(json.dumps({"status": 200, "result": answers["result"], "reason": "not now"}).encode())

    sub = await nc.subscribe(subjects.module_revert("events"), cb=module_revert)
    await nc.flush()
    await start_cleanup(services, max_attempts="1")
    run = f"r{unique}"
    try:
        async with door.client() as http, door.client(OPERATOR_TOKEN) as operator:
            await http.post("/runs", json={"runId": run, "shard": "uo1", "event": "invasion"})
            await http.post(f"/runs/{run}/status", json={"status": "running"})
            await http.post("/resources/record", json={"runId": run, "module": "events", "kind": "banner",
                                                       "ref": "b1", "idempotencyKey": f"{run}:b1"})
            await http.post(f"/runs/{run}/status", json={"status": "completed"})

            assert (await http.post("/cleanup/sweep", json={"runId": run})).status_code == 403
            swept = await operator.post("/cleanup/sweep", json={"runId": run})
            assert swept.status_code == 200, swept.text
            assert swept.json()["run"]["failed"] == 1 and swept.json()["run"]["cleanupStatus"] == "incomplete"

            answers["result"] = "removed"
            retried = await http.post("/cleanup/retry", json={"runId": run})
            assert retried.status_code == 200, retried.text
            assert retried.json()["run"]["reverted"] == 1 and retried.json()["run"]["cleanupStatus"] == "complete"
            again = await http.post("/cleanup/retry", json={"runId": run})
            assert (again.status_code, again.json()["status"]) == (409, 409)
            unknown = await http.post("/cleanup/retry", json={"runId": f"nope{unique}"})
            assert unknown.status_code == 404
            bad = await http.post("/cleanup/retry", json={"runId": "a.b"})
            assert bad.status_code == 400 and "runId" in bad.json()["error"]

            whole = await operator.post("/cleanup/sweep")
            assert whole.status_code == 200 and {"settled", "runs", "durationS"} <= set(whole.json())
            reconciled = await operator.post("/cleanup/reconcile", json={"modules": ["events"]})
            assert reconciled.status_code == 200 and reconciled.json()["modules"] == 1, reconciled.text
            bad_modules = await operator.post("/cleanup/reconcile", json={"modules": ["a.b"]})
            assert bad_modules.status_code == 400
    finally:
        await sub.unsubscribe()


async def test_concurrent_requests_each_get_their_own_reply(door, ledger, unique):  # noqa: F811
    async with door.client() as http:
        replies = await asyncio.gather(*(http.post("/runs", json={"runId": f"r{unique}-{n}", "shard": "uo1",
                                                                   "event": "invasion"}) for n in range(40)))
    assert sorted(r.json()["run"]["runId"] for r in replies) == sorted(f"r{unique}-{n}" for n in range(40))
