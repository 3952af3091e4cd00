"""Statuses are ``http.HTTPStatus`` members in the gateway's code and plain integers on the
wire: every reply starts ``{"status": <number>,`` (``json.dumps`` and ``%d`` write an IntEnum
as its number). ``gateway.status``, encoded by FastStream, is checked in test_replicas.py."""

from __future__ import annotations

import asyncio
import json
import re

from shared import subjects
from tests.gateway.conftest import INTEREST_SETTLE_S, wait_until

STATUS = re.compile(rb'\{"status": ?([0-9]{3}),')


def status_on_the_wire(data: bytes) -> int:
    """The status number a reply's bytes begin with (an AssertionError when they do not)."""
    match = STATUS.match(data)
    assert match is not None, f"no integer status at the start of {data[:80]!r}"
    return int(match.group(1))


async def test_command_replies_carry_integer_statuses(start_gateway, shard_sims, nc, unique):
    running = await start_gateway(command_timeout_s=0.3)
    sim = await shard_sims(running, f"s{unique}")

    async def raw(verb: str, payload: bytes = b"{}", headers: dict[str, str] | None = None) -> bytes:
        return (await nc.request(subjects.command(sim.shard, verb), payload, timeout=5, headers=headers)).data

    assert status_on_the_wire(await raw("item.catalog")) == 200  # the shard's answer, mapped
    assert status_on_the_wire(await raw("world.save", b"{not json")) == 400  # the gateway's own answers
    assert status_on_the_wire(await raw("item.catalog", headers={"Shard-Protocol": "8"})) == 409
    assert status_on_the_wire(await raw("guild.rename", b'{"id":7}')) == 504


async def test_a_command_cut_off_by_a_disconnect_carries_an_integer_503(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    sim.answer_delay_s["world.save"] = 5.0
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.flush()
    await asyncio.sleep(INTEREST_SETTLE_S)
    await nc.publish(subjects.command(sim.shard, "world.save"), b"{}", reply=inbox)
    await nc.flush()
    link = gateway.gateway.links[sim.shard]
    await wait_until(lambda: bool(link.pending))
    await sim.drop()
    reply = await sub.next_msg(timeout=5)
    await sub.unsubscribe()
    assert status_on_the_wire(reply.data) == 503 and "disconnected" in json.loads(reply.data)["error"]


async def test_board_and_news_replies_carry_integer_statuses(gateway, nc, unique):
    shard = f"s{unique}"

    async def raw(subject: str, payload: bytes = b"{}") -> bytes:
        return (await nc.request(subject, payload, timeout=5)).data

    assert status_on_the_wire(await raw(subjects.board(shard, "guilds"))) == 200
    assert status_on_the_wire(await raw(subjects.board(shard, "ruleset"))) == 404
    assert status_on_the_wire(await raw(subjects.news_add(shard), b'{"title":"no id"}')) == 400
    assert status_on_the_wire(await raw(subjects.news_add(shard), b'{"id":"n1","title":"t"}')) == 200
