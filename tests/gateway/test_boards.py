"""Boards in JetStream key-value buckets: the guild board with two writers, removal, board
reads in board order, vendor listings and houses, and news replayed after each hello."""

from __future__ import annotations

import asyncio
import json

from shared import subjects
from tests.gateway.conftest import wait_until


async def read_board(nc, shard: str, board: str) -> dict:
    msg = await nc.request(subjects.board(shard, board), b"{}", timeout=5)
    return json.loads(msg.data)


async def settled(gateway, shard: str) -> None:
    """Until the gateway has read and written everything the shard sent so far."""
    await asyncio.sleep(0.05)
    await wait_until(lambda: gateway.gateway.boards.pending(shard) == 0)
    await asyncio.sleep(0.05)


async def test_guild_update_and_roster_never_overwrite_each_other_in_either_order(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send("guild.update", guild={"id": 1, "name": "Alpha", "abbr": "A"})
    await sim.send("guild.roster", guild=1, seq=0, more=False, members=[{"id": 10, "name": "ann"}])
    await sim.send("guild.roster", guild=2, seq=0, more=False, members=[{"id": 20, "name": "bo"}])
    await sim.send("guild.update", guild={"id": 2, "name": "Beta"})
    await sim.send("guild.update", guild={"id": 1, "name": "Alpha", "abbr": "AA"})  # roster stays
    await settled(gateway, sim.shard)
    reply = await read_board(nc, sim.shard, "guilds")
    assert reply["status"] == 200
    assert reply["items"] == [
        {"id": 1, "name": "Alpha", "abbr": "AA", "roster": [{"id": 10, "name": "ann"}]},
        {"id": 2, "name": "Beta", "roster": [{"id": 20, "name": "bo"}]},
    ]


async def test_a_guild_with_no_roster_yet_has_no_roster_key(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send("guild.update", guild={"id": 3, "name": "Gamma"})
    await sim.send("guild.update", guild={"id": 4, "name": "Delta"})
    await sim.send("guild.roster", guild=4, seq=0, more=False, members=[])
    await settled(gateway, sim.shard)
    items = (await read_board(nc, sim.shard, "guilds"))["items"]
    assert items == [{"id": 4, "name": "Delta", "roster": []}, {"id": 3, "name": "Gamma"}]


async def test_the_guild_board_is_ordered_by_name_then_id(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    for gid, name in [(9, "Same"), (2, "Zed"), (5, "Same"), (7, "Able")]:
        await sim.send("guild.update", guild={"id": gid, "name": name})
    await settled(gateway, sim.shard)
    items = (await read_board(nc, sim.shard, "guilds"))["items"]
    assert [(i["name"], i["id"]) for i in items] == [("Able", 7), ("Same", 5), ("Same", 9), ("Zed", 2)]


async def test_guild_remove_deletes_the_guild_and_guild_leave_only_forwards(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send_guild(1, "Keep", [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
    await sim.send_guild(2, "Gone", [{"id": 3, "name": "c"}])
    await sim.send("guild.leave", guild=1, member=2)
    await sim.send("guild.remove", guild=2)
    await settled(gateway, sim.shard)
    items = (await read_board(nc, sim.shard, "guilds"))["items"]
    assert items == [{"id": 1, "name": "Keep", "roster": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}]


async def test_a_chunked_roster_is_written_whole(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    members = [{"id": i, "name": f"m{i:04d}"} for i in range(1234)]
    await sim.send_guild(5, "Big", members, chunk=100)
    await settled(gateway, sim.shard)
    items = (await read_board(nc, sim.shard, "guilds"))["items"]
    assert items[0]["roster"] == members


async def test_boards_of_two_shards_are_separate(gateway, shard_sims, nc, unique):
    a = await shard_sims(gateway, f"a{unique}")
    b = await shard_sims(gateway, f"b{unique}")
    await a.send("guild.update", guild={"id": 1, "name": "OnA"})
    await b.send("guild.update", guild={"id": 1, "name": "OnB"})
    await settled(gateway, a.shard)
    await settled(gateway, b.shard)
    assert [i["name"] for i in (await read_board(nc, a.shard, "guilds"))["items"]] == ["OnA"]
    assert [i["name"] for i in (await read_board(nc, b.shard, "guilds"))["items"]] == ["OnB"]


async def test_vendor_listings_are_keyed_by_serial_and_removed(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send("vendor.listing", serial=100, name="Katana", price=50)
    await sim.send("vendor.listing", serial=101, name="Bow", price=20)
    await sim.send("vendor.listing", serial=100, name="Katana", price=45)
    await sim.send("vendor.listing.remove", serial=101)
    await settled(gateway, sim.shard)
    items = (await read_board(nc, sim.shard, "vendors"))["items"]
    assert items == [{"serial": 100, "name": "Katana", "price": 45, "id": 100}]


async def test_houses_are_upserted_and_removed(gateway, shard_sims, nc, unique):
    sim = await shard_sims(gateway, f"s{unique}")
    await sim.send("house.update", house={"serial": 7, "name": "Keep", "owner": "ann"})
    await sim.send("house.update", house={"serial": 8, "name": "Hut", "owner": "bo"})
    await sim.send("house.remove", serial=8)
    await settled(gateway, sim.shard)
    assert (await read_board(nc, sim.shard, "houses"))["items"] == [
        {"serial": 7, "name": "Keep", "owner": "ann", "id": 7}]


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
    assert sim.news[0]["announce"] is True and sim.news[0]["title"] == "Festival"
    await sim.drop()
    await sim.connect()
    await wait_until(lambda: len(sim.news) == 2)
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
