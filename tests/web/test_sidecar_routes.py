"""The sidecar's HTTP API through the door, drop-in: each route of the seed's router reaches the
shard as the seed's handlers send it (docs/web.md, "Routes and verbs", "Body rules"), and each
answer comes back with the seed's status and the shard's line as the body — real HTTP in, the
real gateway, a scripted shard answering in the seed's own words (tests/conformance/conftest.py).

The table below is written from docs/web.md's table of the seed's routes, not from services/web's
route table, so the two can disagree."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from simulator.seed_wire import STATUS_ROWS
from tests.conformance.conftest import ScriptedShard, scripted  # noqa: F401 — fixture
from tests.gateway.conftest import wait_until
from tests.web.conftest import MODULE_TOKENS, OPERATOR_TOKEN

# (method, path, the HTTP body, the line's fields the shard must receive (kind and reqId aside), the verb)
SEED_ROUTES: list[tuple[str, str, Any, dict[str, Any], str]] = [
    ("POST", "/admin/ban", {"actor": "gm-ada", "account": "alice", "durationSec": 3600, "reason": "spam"},
     {"actor": "gm-ada", "account": "alice", "durationSec": 3600, "reason": "spam"}, "admin.ban"),
    ("POST", "/admin/unban", {"actor": "gm-ada", "account": "alice"},
     {"actor": "gm-ada", "account": "alice"}, "admin.unban"),
    ("POST", "/admin/broadcast", {"actor": "gm-ada", "text": "Server restart in 5 minutes", "hue": 33},
     {"actor": "gm-ada", "text": "Server restart in 5 minutes", "hue": 33}, "admin.broadcast"),
    ("GET", "/lease", None, {}, "lease.list"),
    ("GET", "/lease?key=Spawner.MaxCount&target=0x4001", None, {"key": "Spawner.MaxCount", "target": "0x4001"},
     "lease.list"),
    ("POST", "/lease", {"key": "PlayerCaps.SkillCap", "value": "1300", "holdMs": 600000, "untilMs": 1733000600000,
                        "runId": "42", "idempotencyKey": "run42:step3"},
     {"key": "PlayerCaps.SkillCap", "value": "1300", "holdMs": 600000, "untilMs": 1733000600000,
      "runId": "42", "idempotencyKey": "run42:step3"}, "lease.apply"),
    ("POST", "/lease/release", {"key": "PlayerCaps.SkillCap", "expected": "1300", "baseline": "1200",
                                "idempotencyKey": "run42:teardown:lease"},
     {"key": "PlayerCaps.SkillCap", "expected": "1300", "baseline": "1200",
      "idempotencyKey": "run42:teardown:lease"}, "lease.release"),
    ("POST", "/participation", {"runId": "42", "map": "Felucca", "x": 1400, "y": 1600, "radius": 30},
     {"runId": "42", "map": "Felucca", "x": 1400, "y": 1600, "radius": 30}, "participation.open"),
    ("POST", "/participation/42/snapshot", {"idempotencyKey": "run42:snapshot"},
     {"idempotencyKey": "run42:snapshot", "runId": "42"}, "participation.snapshot"),
    ("POST", "/participation/42/close", {"idempotencyKey": "run42:close"},
     {"idempotencyKey": "run42:close", "runId": "42"}, "participation.close"),
    ("POST", "/world", {"runId": "42", "what": "creature", "map": "Felucca", "x": 1400, "y": 1600},
     {"runId": "42", "what": "creature", "map": "Felucca", "x": 1400, "y": 1600}, "world.spawn"),
    ("GET", "/world/42", None, {"runId": "42"}, "world.owned"),
    ("POST", "/world/42/despawn", {"serials": ["0x40000001"]}, {"serials": ["0x40000001"], "runId": "42"},
     "world.despawn"),
    ("POST", "/world/42/despawn", {}, {"runId": "42"}, "world.despawn"),  # no serials: everything
    ("GET", "/items", None, {}, "item.catalog"),
    ("POST", "/items/grant", {"runId": "42", "item": "gold", "amount": 500, "idempotencyKey": "run42:grant"},
     {"runId": "42", "item": "gold", "amount": 500, "idempotencyKey": "run42:grant"}, "item.grant"),
    ("POST", "/world/save", {"idempotencyKey": "run42:save"}, {"idempotencyKey": "run42:save"}, "world.save"),
    ("GET", "/pages", None, {}, "pages.list"),
    ("POST", "/pages/p1/respond", {"text": "freed you"}, {"text": "freed you", "id": "p1"}, "pages.respond"),
]

ROUTE_OF_VERB = {verb: (method, path, body) for method, path, body, _f, verb in SEED_ROUTES}
ROUTE_OF_VERB.update({  # the account plane: shardbus's paths (the seed names only its verbs, docs/web.md,
    # "Routes and verbs")
    "account.create": ("POST", "/account/create", {"account": "carol"}),
    "account.link": ("POST", "/account/link", {"account": "carol", "userId": "u-17"}),
    "account.unlink": ("POST", "/account/unlink", {"account": "carol"}),
})


@pytest.fixture
async def door_to(scripted, start_door):  # noqa: F811
    """A door whose default shard is the scripted one."""
    return await start_door(web_default_shard=scripted.shard)


async def _send(client, method: str, path: str, body: Any = None, **kwargs: Any):
    if method == "GET":
        return await client.get(path, **kwargs)
    return await client.request(method, path, json=body, **kwargs)


def _lines(shard: ScriptedShard, verb: str) -> list[dict[str, Any]]:
    return [line for line in shard.lines if line.get("kind") == verb]


@pytest.mark.parametrize("scoped", [False, True], ids=["bare path", "/shards/{shard}"])
@pytest.mark.parametrize(("method", "path", "body", "fields", "verb"), SEED_ROUTES,
                         ids=[f"{r[0]} {r[1]}" for r in SEED_ROUTES])
async def test_every_seed_route_sends_its_verb_and_body_and_answers_the_shards_line(
        scripted, door_to, scoped, method, path, body, fields, verb):  # noqa: F811
    answer = {"kind": f"{verb}.ok", "said": "verbatim"}
    scripted.answer = lambda sent: answer
    url = f"/shards/{scripted.shard}{path}" if scoped else path
    async with door_to.client() as client:
        first = await _send(client, method, url, body)
        second = await _send(client, method, url, body)
    assert first.status_code == 200, first.text
    sent = _lines(scripted, verb)
    assert len(sent) == 2
    assert {k: v for k, v in sent[0].items() if k not in ("kind", "reqId")} == fields
    # reqId is fresh on every call, a retry included; idempotencyKey is one of the body's fields.
    assert sent[0]["reqId"] != sent[1]["reqId"]
    # The body is the shard's line itself, t and reqId included (docs/web.md, "Routes and verbs").
    assert first.json() == {"t": 1733000000001, **answer, "reqId": sent[0]["reqId"]}
    assert second.json()["reqId"] == sent[1]["reqId"]


@pytest.mark.parametrize(("verb", "answer", "status", "line"), STATUS_ROWS,
                         ids=[f"{row[0]} {row[1]['kind']} {row[2]}" for row in STATUS_ROWS])
async def test_every_answer_the_seed_pins_has_its_status_over_http(scripted, door_to, verb, answer,  # noqa: F811
                                                                    status, line):
    scripted.answer = lambda sent: answer
    method, path, body = ROUTE_OF_VERB[verb]
    async with door_to.client() as client:
        response = await _send(client, method, path, body)
    assert response.status_code == status
    envelope = ("t", "reqId")  # the shard's clock, and the id of this call (never the seed's example)
    assert {k: v for k, v in response.json().items() if k not in envelope} == {
        k: v for k, v in answer.items() if k not in envelope}


async def test_no_shard_connected_is_503_in_the_seeds_words(door, unique):
    # docs/web.md, "Statuses and the door's own answers".
    async with door.client() as client:
        response = await client.post(f"/shards/absent{unique}/lease", json={"key": "PlayerCaps.SkillCap"})
    assert response.status_code == 503
    assert response.json() == {"error": "shard not connected"}


async def test_a_shard_that_does_not_reply_in_time_is_504_in_the_seeds_words(start_gateway, start_door, unique):
    # The gateway's own timeout, passed on (docs/web.md, "Statuses and the door's own answers").
    running = await start_gateway(command_timeout_s=0.3)
    silent = ScriptedShard(f"q{unique}")
    await silent.connect(running.port)
    try:
        await wait_until(lambda: silent.shard in running.gateway.links)
        await asyncio.sleep(0.05)
        door = await start_door()
        async with door.client() as client:
            response = await client.get(f"/shards/{silent.shard}/world/42")
        assert response.status_code == 504
        assert response.json() == {"error": "shard did not reply in time"}
    finally:
        await silent.close()


@pytest.mark.parametrize("raw", [b"[1,2]", b'"text"', b"42", b"true"])
async def test_a_body_that_is_not_an_object_is_400_and_reaches_no_shard(scripted, door_to, raw):  # noqa: F811
    # docs/web.md, "Body rules".
    async with door_to.client() as client:
        response = await client.post("/lease", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json() == {"error": "body must be a JSON object"}
    await asyncio.sleep(0.1)
    assert _lines(scripted, "lease.apply") == []


@pytest.mark.parametrize(("raw", "words"), [
    (b"{not json", "body is not valid JSON"),
    (b'{"value": NaN}', "NaN is not JSON"),                      # a shard's parser would choke on it
    (b'{"amount": 1' + b"0" * 5000 + b"}", "more than 4300 digits"),
    (b'{"text": "\\ud800"}', "lone surrogate"),                   # cannot even be sent as UTF-8
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
async def test_a_body_that_cannot_be_passed_on_is_400_naming_why_and_reaches_no_shard(
        scripted, door_to, raw, words):  # noqa: F811
    async with door_to.client() as client:
        response = await client.post("/lease", content=raw, headers={"Content-Type": "application/json"})
        later = await client.get("/health")
    assert response.status_code == 400 and words in response.json()["error"]
    assert later.status_code == 200  # the door carries on
    assert _lines(scripted, "lease.apply") == []


@pytest.mark.parametrize("raw", [b"", b"null"])
async def test_an_empty_or_null_body_is_an_empty_object(scripted, door_to, raw):  # noqa: F811
    # docs/web.md, "Body rules": an empty or null body is {}.
    scripted.answer = lambda sent: {"kind": "world.save.ok", "started": True}
    async with door_to.client() as client:
        response = await client.post("/world/save", content=raw)
    assert response.status_code == 200
    (line,) = _lines(scripted, "world.save")
    assert set(line) == {"kind", "reqId"}


@pytest.mark.parametrize("raw", [b"[1,2]", b'"text"', b"7", b""])
async def test_a_path_route_reads_a_body_that_is_not_an_object_as_empty(scripted, door_to, raw):  # noqa: F811
    # docs/web.md, "Body rules": a path route reads anything but an object as {}, then runId from the path.
    scripted.answer = lambda sent: {"kind": "world.despawn.ok"}
    async with door_to.client() as client:
        response = await client.post("/world/42/despawn", content=raw)
    assert response.status_code == 200
    (line,) = _lines(scripted, "world.despawn")
    assert {k: v for k, v in line.items() if k not in ("kind", "reqId")} == {"runId": "42"}


async def test_the_run_id_of_the_path_wins_over_the_body(scripted, door_to):  # noqa: F811
    scripted.answer = lambda sent: {"kind": "participation.ok"}
    async with door_to.client() as client:
        response = await client.post("/participation/42/close", json={"runId": "999", "idempotencyKey": "k"})
    assert response.status_code == 200
    (line,) = _lines(scripted, "participation.close")
    assert line["runId"] == "42" and line["idempotencyKey"] == "k"


async def test_a_caller_expecting_another_protocol_gets_409(scripted, door_to):  # noqa: F811
    # The version gate is 409 and nothing else's (docs/web.md, "Statuses and the door's own answers").
    scripted.answer = lambda sent: {"kind": "lease.list.ok"}
    async with door_to.client() as client:
        response = await client.get("/lease", headers={"Shard-Protocol": "6"})
        matching = await client.get("/lease", headers={"Shard-Protocol": "7"})
    assert response.status_code == 409 and "protocol 7" in response.json()["error"]
    assert matching.status_code == 200
    assert len(_lines(scripted, "lease.list")) == 1


async def test_a_staff_verb_without_actor_is_400_and_reaches_no_shard(scripted, door_to):  # noqa: F811
    async with door_to.client() as client:
        response = await client.post("/admin/ban", json={"account": "alice"})
    assert response.status_code == 400 and "actor" in response.json()["error"]
    assert _lines(scripted, "admin.ban") == []


@pytest.mark.parametrize("shard", ["UO1", "a.b", "x" * 33, "uo1%0A", "%2A"])
async def test_a_shard_id_that_is_not_one_is_400(door, shard):
    async with door.client() as client:
        response = await client.get(f"/shards/{shard}/lease")
    assert response.status_code == 400
    assert response.json() == {"error": "shard must match [a-z0-9_-]{1,32}"}


async def test_bare_paths_without_a_default_shard_say_how_to_name_one(door):
    async with door.client() as client:
        response = await client.get("/lease")
    assert response.status_code == 404 and "SHARDBUS_WEB_DEFAULT_SHARD" in response.json()["error"]


@pytest.mark.parametrize(("token", "status", "words"), [
    (None, 401, "missing bearer token"),
    ("not-a-token", 401, "not valid"),
    (MODULE_TOKENS["events"], 403, "module 'events'"),
])
async def test_a_caller_without_the_website_token_is_refused_and_nothing_reaches_the_shard(
        scripted, door_to, token, status, words):  # noqa: F811
    async with door_to.client(token) as client:
        response = await client.post("/admin/broadcast", json={"actor": "gm-ada", "text": "hi"})
    assert response.status_code == status and words in response.json()["error"]
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"
    assert _lines(scripted, "admin.broadcast") == []


async def test_the_operator_token_may_do_what_the_website_may(scripted, door_to):  # noqa: F811
    scripted.answer = lambda sent: {"kind": "admin.ok"}
    async with door_to.client(OPERATOR_TOKEN) as client:
        response = await client.post("/admin/broadcast", json={"actor": "gm-ada", "text": "hi"})
    assert response.status_code == 200


async def test_the_guild_board_is_the_sidecars_array_with_rosters(gateway, shard_sims, start_door, unique):
    # GET /guilds (docs/web.md, "Boards"): every guild's snapshot, the roster folded in as `roster`; a
    # guild without a roster has no `roster` key.
    sim = await shard_sims(gateway, f"g{unique}")
    await sim.send("guild.update", id=7, name="The Cartographers", abbr="MAP", members=2, online=1)
    await sim.send("guild.roster", id=7, seq=0, more=False,
                   members=[{"serial": "0x1", "name": "Ada"}, {"serial": "0x2", "name": "Bo"}])
    await sim.send("guild.update", id=11, name="Unswept")
    door = await start_door(web_default_shard=sim.shard)
    async with door.client() as client:
        async with asyncio.timeout(10):
            while True:
                response = await client.get("/guilds")
                guilds = response.json()
                if response.status_code == 200 and len(guilds) == 2 and any("roster" in g for g in guilds):
                    break
                await asyncio.sleep(0.05)
        scoped = await client.get(f"/shards/{sim.shard}/guilds")
    by_id = {g["id"]: g for g in guilds}
    assert by_id[7]["name"] == "The Cartographers"
    assert by_id[7]["roster"] == [{"serial": "0x1", "name": "Ada"}, {"serial": "0x2", "name": "Bo"}]
    assert "roster" not in by_id[11]
    assert scoped.json() == guilds


async def test_a_board_no_frame_kind_writes_is_404_saying_so(gateway, start_door, unique):
    door = await start_door()
    async with door.client() as client:
        response = await client.get(f"/shards/s{unique}/ruleset")
    assert response.status_code == 404 and "ruleset" in response.json()["error"]


async def test_boards_with_no_gateway_running_are_503(door, unique):
    async with door.client() as client:
        response = await client.get(f"/shards/s{unique}/guilds")
    assert response.status_code == 503 and "gateway" in response.json()["error"]


async def test_a_body_that_nats_cannot_carry_with_its_header_is_413_and_the_door_stays_connected(door, unique):
    # The body cap (1 MiB) equals NATS's max_payload, but the server counts a message's headers too
    # (Shard-Protocol here) and closes a connection that publishes over it: one such request would
    # have cut the door off NATS for every caller.
    body = b'{"pad":"' + b"x" * (door.nc.max_payload - 10) + b'"}'
    assert len(body) <= door.settings.web_max_body_bytes
    async with door.client() as client:
        response = await client.post(f"/shards/s{unique}/lease", content=body, headers={"Shard-Protocol": "7"})
        assert response.status_code == 413 and "NATS" in response.json()["error"]
        await asyncio.sleep(0.2)
        after = await client.get(f"/shards/s{unique}/items")
    assert door.nc.is_connected
    assert after.status_code == 503 and after.json() == {"error": "shard not connected"}
