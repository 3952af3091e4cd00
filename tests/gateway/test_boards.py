"""Boards in JetStream key-value buckets: the guild board with two writers, removal, board
reads in board order, the market, houses and champions, and news replayed after each hello —
every frame in the sidecar seed's shape (docs/gateway.md, "Frames"; the rules: docs/gateway.md, "Boards")."""

from __future__ import annotations

import asyncio
import json

from shared import subjects
from tests.gateway.conftest import collect, wait_until


async def read_board(nc, shard: str, board: str) -> dict:
    msg = await nc.request(subjects.board(shard, board), b"{}", timeout=5)
    return json.loads(msg.data)


async def settled(gateway, shard: str) -> None:
    """Until the gateway has read and written everything the shard sent so far."""
    await asyncio.sleep(0.05)
    await wait_until(lambda: gateway.gateway.boards.pending(shard) == 0)
    await asyncio.sleep(0.05)


def shown(items: list[dict]) -> list[dict]:
    """Board items without the shard's clock (``t``), which every frame carries."""
    return [{k: v for k, v in item.items() if k != "t"} for item in items]


async def test_guild_update_and_roster_never_overwrite_each_other_in_either_order(gateway, shard_sims, nc, unique):
    # A roster must not clobber the snapshot, and either may come first (docs/gateway.md, "Boards").
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send("guild.update", id=7, name="The Cartographers", abbr="MAP", members=2, online=1)
    await sim.send("guild.roster", id=7, members=[{"serial": "0x1", "name": "Ada"}, {"serial": "0x2", "name": "Bo"}])
    await sim.send("guild.roster", id=9, members=[{"serial": "0x3", "name": "Cy"}])
    await sim.send("guild.update", id=9, name="Late Arrivals", abbr="LTE")
    await sim.send("guild.update", id=7, name="The Cartographers", abbr="MAP", members=2, online=2)  # roster stays
    await settled(gateway, sim.shard)
    reply = await read_board(nc, sim.shard, "guilds")
    assert reply["status"] == 200
    assert shown(reply["items"]) == [
        {"kind": "guild.update", "id": 9, "name": "Late Arrivals", "abbr": "LTE",
         "roster": [{"serial": "0x3", "name": "Cy"}]},
        {"kind": "guild.update", "id": 7, "name": "The Cartographers", "abbr": "MAP", "members": 2, "online": 2,
         "roster": [{"serial": "0x1", "name": "Ada"}, {"serial": "0x2", "name": "Bo"}]},
    ]


async def test_a_roster_before_any_update_is_a_row_of_its_own(gateway, shard_sims, nc, unique):
    # The seed: "a roster can arrive before the first guild.update for a guild, and the row
    # it creates then carries '{}' until that update fills it in" (docs/gateway.md, "Boards").
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send("guild.roster", id=9, seq=0, more=False, members=[{"serial": "0x3", "name": "Cy"}])
    await settled(gateway, sim.shard)
    assert (await read_board(nc, sim.shard, "guilds"))["items"] == [
        {"id": 9, "roster": [{"serial": "0x3", "name": "Cy"}]}]


async def test_a_guild_with_no_roster_yet_has_no_roster_key(gateway, shard_sims, nc, unique):
    # Unknown is not empty (docs/gateway.md, "Boards").
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send("guild.update", id=11, name="Unswept")
    await sim.send("guild.update", id=4, name="Delta")
    await sim.send("guild.roster", id=4, seq=0, more=False, members=[])
    await settled(gateway, sim.shard)
    items = shown((await read_board(nc, sim.shard, "guilds"))["items"])
    assert items == [{"kind": "guild.update", "id": 4, "name": "Delta", "roster": []},
                     {"kind": "guild.update", "id": 11, "name": "Unswept"}]


async def test_a_roster_without_members_is_a_complete_empty_roster(gateway, shard_sims, nc, unique):
    # Members that are missing or not an array are empty, as the seed reads them (docs/gateway.md, "Boards").
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send_guild(1, "Was Full", [{"serial": "0x1", "name": "Ada"}])
    await sim.send_guild(2, "Also Full", [{"serial": "0x2", "name": "Bo"}])
    await sim.send("guild.roster", id=1)
    await sim.send("guild.roster", id=2, members="nobody")
    await settled(gateway, sim.shard)
    items = (await read_board(nc, sim.shard, "guilds"))["items"]
    assert [(i["id"], i["roster"]) for i in items] == [(2, []), (1, [])]


async def test_the_guild_board_is_ordered_by_name_then_id(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    for gid, name in [(9, "Same"), (2, "Zed"), (5, "Same"), (7, "Able")]:
        await sim.send("guild.update", id=gid, name=name)
    await settled(gateway, sim.shard)
    items = (await read_board(nc, sim.shard, "guilds"))["items"]
    assert [(i["name"], i["id"]) for i in items] == [("Able", 7), ("Same", 5), ("Same", 9), ("Zed", 2)]


async def test_guild_remove_deletes_the_guild_and_guild_leave_only_forwards(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send_guild(1, "Keep", [{"serial": "0x1", "name": "a"}, {"serial": "0x2", "name": "b"}])
    await sim.send_guild(2, "Gone", [{"serial": "0x3", "name": "c"}])
    await sim.send("guild.leave", id=1, serial="0x2")
    await sim.send("guild.remove", id=2)
    await settled(gateway, sim.shard)
    items = shown((await read_board(nc, sim.shard, "guilds"))["items"])
    assert items == [{"kind": "guild.update", "id": 1, "name": "Keep",
                      "roster": [{"serial": "0x1", "name": "a"}, {"serial": "0x2", "name": "b"}]}]


async def test_a_guild_frame_without_an_integer_id_is_dead_lettered_with_the_reason(gateway, shard_sims, nc,
                                                                                    unique):
    # The old dialect (a nested `guild` object) names no top-level id: the board cannot use it,
    # and says so, rather than dropping it silently. The frame itself is still forwarded.
    sim = await shard_sims(gateway, f"s{unique}")
    letters = await collect(nc, subjects.deadletter(sim.shard), 2, start=lambda: _send_unusable(sim))
    reasons = [m.headers["Shardbus-Reason"] for m in letters]
    assert reasons == ["board guilds cannot use this guild.update: its id must be an integer",
                       "board guilds cannot use this guild.roster: its id must be an integer"]
    await settled(gateway, sim.shard)
    assert (await read_board(nc, sim.shard, "guilds"))["items"] == []


async def _send_unusable(sim) -> None:
    await sim.send("guild.update", guild={"id": 1, "name": "Nested"})
    await sim.send("guild.roster", id="7", members=[])


async def test_a_chunked_roster_is_written_whole(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    members = [{"serial": f"0x{i:x}", "name": f"m{i:04d}"} for i in range(1234)]
    await sim.send_guild(5, "Big", members, chunk=100)
    await settled(gateway, sim.shard)
    items = (await read_board(nc, sim.shard, "guilds"))["items"]
    assert items[0]["roster"] == members


async def test_boards_of_two_shards_are_separate(gateway, shard_sims, nc, unique):
    a = await shard_sims(gateway, f"a{unique}")
    b = await shard_sims(gateway, f"b{unique}")
    await a.send("guild.update", id=1, name="OnA")
    await b.send("guild.update", id=1, name="OnB")
    await settled(gateway, a.shard)
    await settled(gateway, b.shard)
    assert [i["name"] for i in (await read_board(nc, a.shard, "guilds"))["items"]] == ["OnA"]
    assert [i["name"] for i in (await read_board(nc, b.shard, "guilds"))["items"]] == ["OnB"]


async def test_the_market_board_keys_vendor_listings_by_serial_and_removes_them(gateway, shard_sims, nc, unique):
    # vendor.listing (with ownerAcct and fees) and vendor.listing.remove; the seed's /market
    # (docs/gateway.md, "Frames").
    sim = await shard_sims(gateway, f"s{unique}")
    fees = {"charge": 30, "funds": 900, "payIntervalSec": 86400, "dismissalAt": 1733600000000}
    await sim.send("vendor.listing", serial="0x100", name="Katana", price=50, ownerAcct="ann", fees=fees)
    await sim.send("vendor.listing", serial="0x101", name="Bow", price=20, ownerAcct="bo", fees=fees)
    await sim.send("vendor.listing", serial="0x100", name="Katana", price=45, ownerAcct="ann", fees=fees)
    await sim.send("vendor.listing.remove", serial="0x101")
    await settled(gateway, sim.shard)
    items = shown((await read_board(nc, sim.shard, "market"))["items"])
    assert items == [{"kind": "vendor.listing", "serial": "0x100", "name": "Katana", "price": 45,
                      "ownerAcct": "ann", "fees": fees, "id": "0x100"}]


async def test_houses_and_champions_keep_the_latest_frame_of_each(gateway, shard_sims, nc, unique):
    # house.decay (with its schedule) and champ.update (with bossUp) (docs/gateway.md, "Frames").
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send("house.decay", serial="0x7", ownerName="ann", nextStage="GreatlyWorn", decayPeriodSec=86400,
                   dynamicDecay=False)
    await sim.send("house.decay", serial="0x7", ownerName="ann", nextStage="InDangerOfCollapsing",
                   decayPeriodSec=86400, dynamicDecay=True, estimatedCollapse=1733600000000)
    await sim.send("champ.update", serial="0x55", name="Despise", bossUp=True)
    await sim.send("champ.boss.killed", serial="0x55", damage=[{"name": "Ada", "dealt": 9000}])
    await sim.send("champ.update", serial="0x55", name="Despise", bossUp=False)
    await settled(gateway, sim.shard)
    houses = shown((await read_board(nc, sim.shard, "houses"))["items"])
    assert [(h["serial"], h["nextStage"], h.get("estimatedCollapse")) for h in houses] == [
        ("0x7", "InDangerOfCollapsing", 1733600000000)]
    champions = shown((await read_board(nc, sim.shard, "champions"))["items"])
    assert champions == [{"kind": "champ.update", "serial": "0x55", "name": "Despise", "bossUp": False, "id": "0x55"}]


async def test_an_unknown_board_is_404(gateway, nc, unique):
    reply = await read_board(nc, f"s{unique}", "dragons")
    assert reply["status"] == 404 and "guilds" in reply["error"]


async def test_news_is_stored_announced_and_replayed_after_each_hello_without_announcing(
        gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    reply = json.loads((await nc.request(subjects.news_add(sim.shard),
                                         json.dumps({"id": "n1", "title": "Festival"}).encode(), timeout=5)).data)
    assert reply["status"] == 200
    await wait_until(lambda: len(sim.news) == 1)
    # The shard understands news.add, idempotent by id (docs/gateway.md, "News").
    assert sim.news[0]["kind"] == "news.add"
    assert sim.news[0]["announce"] is True and sim.news[0]["title"] == "Festival"
    await sim.drop()
    await sim.connect()
    await wait_until(lambda: len(sim.news) == 2)
    assert sim.news[1]["kind"] == "news.add"
    assert sim.news[1]["announce"] is False and sim.news[1]["id"] == "n1"


async def test_news_without_an_id_is_400(gateway, nc, unique):
    reply = json.loads((await nc.request(subjects.news_add(f"s{unique}"), b'{"title": "x"}', timeout=5)).data)
    assert reply["status"] == 400 and "id" in reply["error"]


async def test_a_board_read_right_after_a_write_always_sees_it(gateway, nc, unique):
    # Reads once came back empty now and then (a KV watcher's end marker raced the entry).
    for n in range(100):
        shard = f"s{unique}n{n}"
        added = json.loads((await nc.request(subjects.news_add(shard), json.dumps({"id": f"n{n}"}).encode(),
                                             timeout=5)).data)
        assert added["status"] == 200
        assert [item["id"] for item in (await read_board(nc, shard, "news"))["items"]] == [f"n{n}"]


async def test_a_board_read_while_its_keys_change_shows_every_key_and_never_goes_back(gateway, unique):
    # On NATS 2.9 a read once chased the writes, or missed a key: that server delivers one
    # message twice while keys change, and keeps counting new writes as pending.
    boards, shard = gateway.gateway.boards, f"s{unique}"
    bucket = boards.buckets["guilds"]
    stop = asyncio.Event()

    async def rewrite() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            await bucket.put(f"{shard}.7.roster", json.dumps(n).encode())
            await bucket.put(f"{shard}.7.item", json.dumps(n).encode())
            await asyncio.sleep(0.002)

    writer = asyncio.create_task(rewrite())
    try:
        await asyncio.sleep(0.05)
        newest = 0
        for _ in range(200):
            entries = await asyncio.wait_for(boards.latest("guilds", shard), 10)
            assert set(entries) == {"7.item", "7.roster"}, entries
            assert entries["7.roster"] >= newest
            newest = entries["7.roster"]
    finally:
        stop.set()
        await writer


async def test_unfinished_rosters_of_many_guilds_are_bounded_by_their_lines_bytes(gateway, shard_sims, nc, unique):
    """A shard that starts roster after roster and finishes none (chunks as in docs/gateway.md, "Boards", every one
    with ``more``): what the gateway holds for them is bounded by their lines' bytes, the oldest
    discarded first; a roster finished afterwards is still written whole."""
    from services.gateway.boards.rules import RosterAssembler

    sim = await shard_sims(gateway, f"r{unique}")
    link = gateway.gateway.links[sim.shard]
    link.rosters = RosterAssembler(max_bytes=4_000)  # the cap (16 MiB by default), lowered here
    members = [{"serial": f"0x{n:x}", "name": f"Member {n}"} for n in range(20)]  # a line of ~600 bytes
    for guild in range(1, 31):
        await sim.send("guild.roster", id=guild, seq=0, more=True, members=members)
    await wait_until(lambda: link.frames >= 30)
    assert 0 < link.rosters.held_bytes <= 4_000
    assert link.rosters.evicted >= 20 and "30" in link.rosters.partials
    await sim.send("guild.roster", id=30, seq=1, more=False, members=[{"serial": "0xff", "name": "Last"}])
    await settled(gateway, sim.shard)
    [row] = [item for item in (await read_board(nc, sim.shard, "guilds"))["items"] if item.get("id") == 30]
    assert len(row["roster"]) == 21
