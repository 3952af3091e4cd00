"""Conformance, the frame plane: every frame kind the sidecar seed names is published verbatim
to ``shard.<shard>.frame.<kind>``, and every test of the seed's guild board — its store tests
and its roster reassembly tests, whose rules docs/gateway.md, "Boards", states — is restated against shardbus
through a real TCP connection, the real gateway and the real NATS key-value board."""

from __future__ import annotations

import asyncio
import json

import pytest

from shared import subjects
from simulator.seed_wire import (
    FORWARDED_KINDS,
    GUILD_UPDATE,
    GUILD_UPDATE_LATE,
    GUILD_UPDATE_UNSWEPT,
    ROSTER_MEMBERS,
    ROSTER_MEMBERS_LATE,
)
from tests.gateway.conftest import collect
from tests.gateway.test_boards import read_board, settled


def line(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def members(*names: str) -> list[dict]:
    return [{"name": name} for name in names]


def roster(guild: int, seq: int, more: bool, who: list[dict]) -> bytes:
    return line({"kind": "guild.roster", "id": guild, "seq": seq, "more": more, "members": who})


async def guilds(gateway, nc, shard: str) -> list[dict]:
    await settled(gateway, shard)
    return (await read_board(nc, shard, "guilds"))["items"]


def names(items: list) -> list[str]:
    return [item["name"] for item in items]


SEED_FRAMES = [GUILD_UPDATE.value, GUILD_UPDATE_LATE.value,
               {"kind": "guild.roster", "id": 7, "seq": 0, "more": False, "members": ROSTER_MEMBERS.value},
               {"kind": "guild.remove", "id": 9}, {"kind": "guild.leave", "id": 7, "serial": "0x2"},
               {"kind": "house.decay", "serial": "0x4000AB12", "ownerName": "Ada", "nextStage": "IDOC",
                "decayPeriodSec": 86400, "dynamicDecay": True, "estimatedCollapse": 1733600000000},
               {"kind": "vendor.listing", "serial": "0x4000CC01", "ownerAcct": "ada", "price": 1200,
                "fees": {"charge": 30, "funds": 900, "payIntervalSec": 86400, "dismissalAt": 1733600000000}},
               {"kind": "vendor.listing.remove", "serial": "0x4000CC01"},
               {"kind": "account.login.attempt", "account": "ada"},
               {"kind": "account.login.result", "account": "ada", "ok": True},
               {"kind": "champ.update", "serial": "0x4000DD01", "bossUp": True},
               {"kind": "champ.boss.killed", "serial": "0x4000DD01", "damage": [{"name": "Ada", "dealt": 9000}]},
               {"kind": "mob.killed", "serial": "0x4000EE01"},
               {"kind": "world.save.before"}, {"kind": "world.save.after"}]


def test_the_fixture_covers_every_frame_kind_the_seed_names():
    assert {frame["kind"] for frame in SEED_FRAMES} == {
        "guild.update", "guild.roster", "guild.remove", *FORWARDED_KINDS}


async def test_every_seed_frame_is_published_verbatim_under_its_kind(scripted, nc):
    sent = [line({"t": 1733000000000 + i, **frame}) for i, frame in enumerate(SEED_FRAMES)]

    async def send_all() -> None:
        for data in sent:
            await scripted.write(data)

    got = await collect(nc, subjects.frame(scripted.shard, ">"), len(sent), start=send_all)
    assert [m.subject for m in got] == [subjects.frame(scripted.shard, f["kind"]) for f in SEED_FRAMES]
    assert [m.data for m in got] == [data.rstrip(b"\n") for data in sent]


# --- the seed's store tests (docs/gateway.md, "Boards") ----------------------------------------------

async def test_a_roster_does_not_clobber_the_guild_update_snapshot(gateway, scripted, nc):
    # The seed's own test, with the seed's own lines.
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(roster(7, 0, False, ROSTER_MEMBERS.value))
    (guild,) = await guilds(gateway, nc, scripted.shard)
    assert (guild["name"], guild["abbr"], guild["online"]) == ("The Cartographers", "MAP", 1)
    assert guild["roster"] == ROSTER_MEMBERS.value and guild["roster"][0]["name"] == "Ada"


async def test_the_two_writers_are_order_independent(gateway, scripted, nc):
    # A roster before the first guild.update, then the update; one row, not two.
    await scripted.write(roster(9, 0, False, ROSTER_MEMBERS_LATE.value))
    await scripted.write(line(GUILD_UPDATE_LATE.value))
    items = await guilds(gateway, nc, scripted.shard)
    assert len(items) == 1 and items[0]["name"] == "Late Arrivals" and len(items[0]["roster"]) == 1


async def test_a_guild_with_no_roster_yet_has_no_roster_key(gateway, scripted, nc):
    # Unknown is not empty.
    await scripted.write(line(GUILD_UPDATE_UNSWEPT.value))
    (guild,) = await guilds(gateway, nc, scripted.shard)
    assert "roster" not in guild and guild["name"] == "Unswept"


async def test_guild_remove_deletes_the_row(gateway, scripted, nc):
    # guild.remove deletes both parts.
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(line(GUILD_UPDATE_LATE.value))
    await scripted.write(line({"kind": "guild.remove", "id": 9}))
    assert names(await guilds(gateway, nc, scripted.shard)) == ["The Cartographers"]


# --- the seed's reassembly tests (docs/gateway.md, "Boards", "Roster reassembly"), each through the wire ---

async def test_a_single_frame_roster_is_written_at_once(gateway, scripted, nc):
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(roster(7, 0, False, members("Ada", "Bo")))
    assert names((await guilds(gateway, nc, scripted.shard))[0]["roster"]) == ["Ada", "Bo"]


async def test_a_chunked_roster_reassembles_in_order(gateway, scripted, nc):
    # "without this, only the final frame survived and a 155-member guild appeared with 3 members"
    await scripted.write(line(GUILD_UPDATE.value))
    for data in (roster(7, 0, True, members("Ada")), roster(7, 1, True, members("Bo"))):
        await scripted.write(data)
    await asyncio.sleep(0.1)
    assert "roster" not in (await guilds(gateway, nc, scripted.shard))[0]  # never a torn roster
    await scripted.write(roster(7, 2, False, members("Cy")))
    assert names((await guilds(gateway, nc, scripted.shard))[0]["roster"]) == ["Ada", "Bo", "Cy"]


async def test_a_restarted_roster_supersedes_a_partial_one(gateway, scripted, nc):
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(roster(7, 0, True, members("Stale")))
    await scripted.write(roster(7, 0, False, members("Fresh")))
    assert names((await guilds(gateway, nc, scripted.shard))[0]["roster"]) == ["Fresh"]


async def test_an_out_of_order_frame_discards_the_partial_roster(gateway, scripted, nc):
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(roster(7, 0, False, members("Before")))
    await scripted.write(roster(7, 0, True, members("Ada")))
    await scripted.write(roster(7, 2, False, members("Skipped")))
    await scripted.write(roster(7, 1, False, members("Late")))  # nothing left to continue
    assert names((await guilds(gateway, nc, scripted.shard))[0]["roster"]) == ["Before"]


async def test_a_continuation_with_no_start_is_ignored(gateway, scripted, nc):
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(roster(7, 3, False, members("Orphan")))
    assert "roster" not in (await guilds(gateway, nc, scripted.shard))[0]


async def test_two_guilds_reassemble_independently(gateway, scripted, nc):
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(line(GUILD_UPDATE_LATE.value))
    for data in (roster(7, 0, True, members("A1")), roster(9, 0, True, members("B1")),
                 roster(9, 1, False, members("B2")), roster(7, 1, False, members("A2"))):
        await scripted.write(data)
    by_id = {g["id"]: names(g["roster"]) for g in await guilds(gateway, nc, scripted.shard)}
    assert by_id == {7: ["A1", "A2"], 9: ["B1", "B2"]}


async def test_an_empty_roster_is_a_complete_roster(gateway, scripted, nc):
    # "Treating that as nothing to store would leave the board showing the roster it had before."
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(roster(7, 0, False, members("Ada")))
    await scripted.write(roster(7, 0, False, []))
    assert (await guilds(gateway, nc, scripted.shard))[0]["roster"] == []


@pytest.mark.parametrize("frame", [{"kind": "guild.roster", "id": 7},
                                   {"kind": "guild.roster", "id": 7, "members": None},
                                   {"kind": "guild.roster", "id": 7, "members": {"name": "Ada"}}],
                         ids=["members missing", "members null", "members not an array"])
async def test_members_missing_or_not_an_array_is_a_complete_empty_roster(gateway, scripted, nc, frame):
    # The seed's `.and_then(|m| m.as_array()).cloned().unwrap_or_default()`: empty.
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(roster(7, 0, False, members("Ada")))
    await scripted.write(line(frame))
    assert (await guilds(gateway, nc, scripted.shard))[0]["roster"] == []


async def test_a_new_hello_clears_every_partial_roster(gateway, scripted, nc):
    # A reconnected shard restarts every roster from seq 0 (docs/gateway.md, "Boards").
    await scripted.write(line(GUILD_UPDATE.value))
    await scripted.write(roster(7, 0, True, members("Half")))
    await settled(gateway, scripted.shard)
    await scripted.close()
    await scripted.connect(gateway.port)
    await scripted.write(roster(7, 1, False, members("Rest")))
    assert "roster" not in (await guilds(gateway, nc, scripted.shard))[0]
