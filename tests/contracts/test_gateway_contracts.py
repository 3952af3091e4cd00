"""The gateway's contract (shared/contracts/gateway.py) against both sides of every subject: a
real gateway, dialled by the seed-speaking shard simulator, answers each subject with exactly
what the reply model names (nothing missing, nothing unnamed), and the gateway's clients — the
web door's sidecar routes and ``shardbus status`` — read those very replies. Real NATS."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import ValidationError

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.web.sidecar.reply import NO_REPLY, board_answer, command_answer
from shardbus.status import _shards
from shared import subjects
from shared.contracts import gateway as g
from simulator.shard import ShardSimulator
from tests.contracts.fields import unnamed_fields
from tests.gateway.conftest import TOKEN
from tests.gateway.test_boards import settled

BY_SUBJECT = {contract.subject: contract for contract in g.CONTRACTS}


def test_every_gateway_request_subject_has_exactly_one_contract():
    assert set(BY_SUBJECT) == {subjects.command("{shard}", "{verb}"), subjects.board("{shard}", "{name}"),
                               subjects.news_add("{shard}"), subjects.GATEWAY_STATUS}
    assert len(BY_SUBJECT) == len(g.CONTRACTS)


async def test_the_gateway_subscribes_board_reads_and_news_in_the_contracts_queue_groups(gateway):
    served = {sub.subject: sub.queue for sub in gateway.gateway.boards.subscriptions}
    assert served == {subjects.BOARD_WILDCARD: BY_SUBJECT[subjects.board("{shard}", "{name}")].queue,
                      subjects.NEWS_ADD_WILDCARD: BY_SUBJECT[subjects.news_add("{shard}")].queue}


@dataclass(frozen=True)
class Case:
    """One way to get an answer from the gateway: the subject asked, the body, what the shard
    simulator does first, and the status and fields the reply must carry."""

    contract: str
    subject: Callable[[str], str]
    body: bytes
    status: int
    fields: frozenset[str]
    prepare: Callable[[Any], Awaitable[None]] | None = None


async def _two_guilds(sim: Any) -> None:
    # The seed's guild frames: an update, then its roster in one part (docs/gateway.md, "Frames").
    await sim.send("guild.update", id=7, name="The Cartographers", abbr="MAP", members=2, online=1)
    await sim.send("guild.roster", id=7, seq=0, more=False, members=[{"serial": "0x1", "name": "Ada"}])


async def _slow_save(sim: Any) -> None:
    sim.answer_delay_s["world.save"] = 2.0


CMD, BOARD, NEWS = (subjects.command("{shard}", "{verb}"), subjects.board("{shard}", "{name}"),
                    subjects.news_add("{shard}"))
BODY, ERROR, ITEMS, ITEM = (frozenset({"status", f}) for f in ("body", "error", "items", "item"))

CASES = {
    "command answered": Case(CMD, lambda s: subjects.command(s, "world.spawn"),
                             b'{"runId": "r1", "what": "creature"}', 200, BODY),
    "command refused by the shard": Case(CMD, lambda s: subjects.command(s, "lease.apply"),
                                         b'{"key": "No.Such.Key", "value": "1", "runId": "r1"}', 404, BODY),
    "command refused by the gateway": Case(CMD, lambda s: subjects.command(s, "world.save"), b"[1]", 400, ERROR),
    "command not answered in time": Case(CMD, lambda s: subjects.command(s, "world.save"), b"{}", 504, ERROR,
                                         _slow_save),
    "board read": Case(BOARD, lambda s: subjects.board(s, "guilds"), b"{}", 200, ITEMS, _two_guilds),
    "board that does not exist": Case(BOARD, lambda s: subjects.board(s, "ruleset"), b"", 404, ERROR),
    "board of a token that is no shard id": Case(BOARD, lambda s: subjects.board("Not-A-Shard", "guilds"),
                                                 b"", 400, ERROR),
    "news added": Case(NEWS, subjects.news_add, b'{"id": "n17", "title": "Restart at 04:00"}', 200, ITEM),
    "news without an id": Case(NEWS, subjects.news_add, b'{"title": "no id"}', 400, ERROR),
}


def test_every_gateway_contract_is_asked_here():
    assert {case.contract for case in CASES.values()} | {subjects.GATEWAY_STATUS} == set(BY_SUBJECT)


@pytest.mark.parametrize("name", CASES)
async def test_the_gateway_answers_each_subject_as_its_contract_says(name, start_gateway, shard_sims, nc, unique):
    case = CASES[name]
    running = await start_gateway(command_timeout_s=0.5)
    sim = await shard_sims(running, f"ct{unique}")
    if case.prepare:
        await case.prepare(sim)
        await settled(running, sim.shard)
    raw = json.loads((await nc.request(case.subject(sim.shard), case.body, timeout=5)).data)
    parsed = BY_SUBJECT[case.contract].reply.model_validate(raw)
    assert parsed.status == case.status, raw  # type: ignore[attr-defined]
    # The shard's answer (body) and the website's item are theirs, passed on verbatim (the
    # forwarder property): only the gateway's own fields must all be named.
    own = [f for f in unnamed_fields(parsed) if not f.startswith(("reply.body.", "reply.item."))]
    assert own == [], f"the gateway sends fields the contract does not name: {raw}"
    assert parsed.model_fields_set == case.fields, raw

    # The web door reads the same reply as the seed's sidecar answers it.
    if case.contract == CMD:
        status, body = command_answer(raw)
        assert status == case.status
        assert body == (raw["body"] if "body" in case.fields else NO_REPLY if case.status == 504
                        else {"error": raw["error"]})
    elif case.contract == BOARD:
        status, body = board_answer(raw)
        assert status == case.status
        assert body == (raw["items"] if case.status == 200 else {"error": raw["error"]})
        if case.status == 200:
            assert [item["name"] for item in body] == ["The Cartographers"]


async def _status_naming(nc: Any, shard: str) -> dict[str, Any]:
    """The first ``gateway.status`` reply that lists ``shard`` (the hello is being taken)."""
    async with asyncio.timeout(5):
        while True:
            raw = json.loads((await nc.request(subjects.GATEWAY_STATUS, b"{}", timeout=2)).data)
            if any(link.get("shard") == shard for link in raw.get("shards") or []):
                return raw
            await asyncio.sleep(0.02)


async def test_gateway_status_answers_its_contract_and_shardbus_status_reads_it(nats_url, nc, unique):
    # gateway.status is the service's (app.py), so the whole app runs here, in this loop.
    settings = GatewaySettings(nats_url=nats_url, shard_token=TOKEN, shard_host="127.0.0.1", shard_port=0)
    async with create_app(settings):
        health = json.loads((await nc.request(subjects.health("gateway"), b"", timeout=5)).data)
        host, port = health["shard_addr"].rsplit(":", 1)
        sim = ShardSimulator(host, int(port), f"ct{unique}", TOKEN)
        await sim.connect()
        try:
            raw = await _status_naming(nc, sim.shard)
        finally:
            await sim.close()
    parsed = g.StatusReply.model_validate(raw)
    assert unnamed_fields(parsed) == [], raw
    assert parsed.shards is not None
    mine = [link for link in parsed.shards if link.shard == sim.shard]
    assert len(mine) == 1 and mine[0].protocol == 7
    # Every field the contract names came from the gateway, none from a default.
    assert set(g.ShardLinkStatus.model_fields) == mine[0].model_fields_set
    assert [s["shard"] for s in _shards([raw]) if s["shard"] == sim.shard] == [sim.shard]


@pytest.mark.parametrize(("model", "broken", "field"), [
    (g.CommandReply, {"status": 200, "body": {"kind": "world.spawn.ok"}}, "reqId"),
    (g.CommandReply, {"status": "two hundred", "body": {"kind": "x", "reqId": "1"}}, "status"),
    (g.BoardReply, {"status": 200, "items": "guilds"}, "items"),
    (g.NewsReply, {"status": 200, "item": {"title": "no id"}}, "id"),
    (g.StatusReply, {"status": 200, "shards": [{"shard": "uo1", "protocol": 7}]}, "connectedAt"),
], ids=["answer-without-reqId", "status-not-a-number", "items-not-a-list", "item-without-id", "link-half-told"])
def test_a_reply_that_breaks_the_gateways_contract_fails_it(model, broken, field):
    with pytest.raises(ValidationError, match=field):
        model.model_validate(broken)


@pytest.mark.parametrize(("read", "broken"), [
    (command_answer, {"status": 200, "body": {"kind": "world.spawn.ok"}}),
    (command_answer, {"status": 200, "error": ["not", "a", "sentence"]}),
    (board_answer, {"status": 200, "items": {"not": "a list"}}),
], ids=["command-body-without-reqId", "command-error-not-text", "board-items-not-a-list"])
def test_the_web_door_answers_502_to_a_reply_outside_the_contract(read, broken):
    status, body = read(broken)
    assert status == 502 and "outside its contract" in body["error"]
