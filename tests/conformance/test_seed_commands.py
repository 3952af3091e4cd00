"""Conformance, the command plane: every command body the sidecar seed quotes reaches the shard
as the seed's sidecar would send it, and every shard answer the seed pins comes back to the
website with the seed's status — NATS request in, shard line out, the seed's answer back in,
status out, through the real gateway. The shard here is scripted (tests/conformance/conftest.py):
it answers with the seed's own words, verbatim, not the simulator's."""

from __future__ import annotations

import json

import pytest
from nats.errors import NoRespondersError

from shared import subjects
from simulator.seed_wire import COMMAND_BODIES, STATUS_ROWS
from tests.gateway.test_command_plane import ask


@pytest.mark.parametrize("verb", sorted(COMMAND_BODIES), ids=lambda v: f"{v} (S004:{COMMAND_BODIES[v].line})")
async def test_every_seed_command_reaches_the_shard_verbatim_with_kind_and_a_fresh_req_id(scripted, nc, verb):
    body = dict(COMMAND_BODIES[verb].value)
    if verb.startswith("admin."):
        # The seed requires it up front (docs/contracts.md, "Gateway command plane", "Staff plane").
        assert body["actor"]
    scripted.answer = lambda line: {"kind": "admin.ok"}
    await ask(nc, scripted.shard, verb, body)
    await ask(nc, scripted.shard, verb, body)
    first, second = [line for line in scripted.lines if line.get("kind") == verb]
    # The body's fields pass through untouched — idempotencyKey above all (docs/gateway.md, "Commands").
    assert {k: v for k, v in first.items() if k not in ("kind", "reqId")} == body
    # reqId is regenerated on every call: a retry carries the same key under a new id.
    assert isinstance(first["reqId"], str) and first["reqId"] != second["reqId"]


@pytest.mark.parametrize(("verb", "answer", "status", "line"), STATUS_ROWS,
                         ids=[f"S004:{row[3]} {row[0]} {row[1]['kind']}" for row in STATUS_ROWS])
async def test_every_answer_the_seed_pins_comes_back_with_its_status_and_verbatim(scripted, nc, verb, answer,
                                                                                   status, line):
    scripted.answer = lambda sent: answer
    body = {"actor": "gm-ada"} if verb.startswith("admin.") else {}
    reply = await ask(nc, scripted.shard, verb, body)
    assert reply["status"] == status
    envelope = ("t", "reqId")  # the shard's clock, and the id of this call (never the seed's example)
    assert {k: v for k, v in reply["body"].items() if k not in envelope} == {
        k: v for k, v in answer.items() if k not in envelope}


async def test_no_shard_connected_is_no_responders_at_once(nc, gateway, unique):
    # The sidecar's 503 {"error":"shard not connected"} (docs/gateway.md, "Statuses"): over NATS, nobody holds
    # the subject, and the caller is told so at once rather than waiting for a timeout.
    with pytest.raises(NoRespondersError):
        await nc.request(subjects.command(f"absent{unique}", "lease.list"), b"{}", timeout=5)


async def test_a_shard_that_does_not_reply_in_time_is_504(start_gateway, nc, unique):
    # The 504 of docs/gateway.md, "Statuses".
    from tests.conformance.conftest import ScriptedShard
    from tests.gateway.conftest import wait_until

    running = await start_gateway(command_timeout_s=0.3)
    silent = ScriptedShard(f"q{unique}")
    await silent.connect(running.port)
    try:
        await wait_until(lambda: silent.shard in running.gateway.links)
        reply = await ask(nc, silent.shard, "world.owned", {"runId": "42"})
        assert reply["status"] == 504
    finally:
        await silent.close()


@pytest.mark.parametrize("raw", [b"[1,2]", b'"text"', b"42", b"{not json"])
async def test_a_body_that_is_not_a_json_object_is_400_in_the_seeds_words(scripted, nc, raw):
    # {"error": "body must be a JSON object"}; nothing reaches the shard (docs/gateway.md, "Statuses").
    reply = await ask(nc, scripted.shard, "lease.apply", raw=raw)
    assert reply["status"] == 400 and reply["error"].startswith("body must be a JSON object")
    assert [line for line in scripted.lines if line.get("kind") == "lease.apply"] == []


@pytest.mark.parametrize("raw", [b"", b"null"])
async def test_an_empty_or_null_body_is_an_empty_object(scripted, nc, raw):
    # The seed reads a null body as an empty map (docs/gateway.md, "Commands").
    scripted.answer = lambda line: {"kind": "lease.list.ok", "leases": [], "holds": []}
    reply = await ask(nc, scripted.shard, "lease.list", raw=raw)
    assert reply["status"] == 200
    sent = [line for line in scripted.lines if line.get("kind") == "lease.list"]
    assert [set(line) for line in sent] == [{"kind", "reqId"}]


async def test_the_protocol_gate_is_409_and_never_reaches_the_shard(scripted, nc):
    # 409 is the version gate's, never busy's (docs/gateway.md, "Statuses").
    reply = await ask(nc, scripted.shard, "lease.list", headers={"Shard-Protocol": "6"})
    assert reply["status"] == 409
    assert [line for line in scripted.lines if line.get("kind") == "lease.list"] == []


async def test_news_reaches_the_shard_as_news_add_and_is_replayed_with_announce_false(gateway, scripted, nc):
    # docs/gateway.md, "News".
    item = {"id": "n7", "title": "The Yew Invasion", "body": "Saturday at dusk"}
    reply = json.loads((await nc.request(subjects.news_add(scripted.shard), json.dumps(item).encode(),
                                         timeout=5)).data)
    assert reply["status"] == 200
    from tests.gateway.conftest import wait_until

    await wait_until(lambda: any(line.get("kind") == "news.add" for line in scripted.lines))
    announced = next(line for line in scripted.lines if line.get("kind") == "news.add")
    assert announced == {**item, "kind": "news.add", "announce": True}
    await scripted.close()
    await scripted.connect(gateway.port)
    await wait_until(lambda: sum(line.get("kind") == "news.add" for line in scripted.lines) == 2)
    replayed = [line for line in scripted.lines if line.get("kind") == "news.add"][1]
    assert replayed == {**item, "kind": "news.add", "announce": False}
