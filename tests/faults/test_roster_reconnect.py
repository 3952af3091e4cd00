"""Fault: a shard drops its connection in the middle of sending a guild roster in chunks,
reconnects (a new hello, which clears that shard's partial rosters), sends the tail chunks
of another member set (a continuation with no start: ignored), then the whole roster again.
Meanwhile two readers read the guild board without pause: every read is answered and shows
no roster yet or one complete roster, never a torn one, never an older one than a read before."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import nats
import pytest

from shardbus import embedded
from shared import subjects
from simulator.shard import ShardSimulator
from tests.faults.harness import TOKEN, wait_commands_answered
from tests.faults.shard_traffic import ShardTraffic
from tests.processes import ServiceProcesses

pytestmark = pytest.mark.faults

ROUNDS = 20
"""Rosters sent, each after a dropped attempt."""

MEMBERS, CHUNK, CHUNK_EVERY_S = 300, 50, 0.01
"""Members of each roster, members per guild.roster frame (6 chunks), and the pause between
chunks (so that board reads fall between them)."""

READERS = 2
"""Tasks reading the board at once, without pause."""

GUILD = 7
"""The guild whose roster changes."""

SETTLE_S = 10.0
"""Longest wait for the board to show what the shard sent."""

UNANSWERED = -2
"""What the reader notes for a board read not answered 200 within 5 s (-1: no roster yet)."""


def members(tag: str) -> list[str]:
    """A roster whose every member names its set, so a torn roster shows two tags or a gap."""
    return [f"{tag}-{i}" for i in range(MEMBERS)]


async def send_chunks(sim: ShardSimulator, roster: list[str], seqs: range) -> None:
    """The guild.roster frames ``seqs`` of ``roster`` (``more`` on all but the last chunk)."""
    last = (len(roster) - 1) // CHUNK
    for seq in seqs:
        await sim.send("guild.roster", id=GUILD, seq=seq, more=seq < last,
                       members=roster[seq * CHUNK:(seq + 1) * CHUNK])
        await asyncio.sleep(CHUNK_EVERY_S)


async def read_guild(nc: nats.NATS, shard: str) -> dict | None:
    """The guild as the board shows it now ({} before its first snapshot; None: no answer)."""
    try:
        reply = json.loads((await nc.request(subjects.board(shard, "guilds"), b"", timeout=5)).data)
    except nats.errors.TimeoutError:
        return None
    return next((g for g in reply["items"] if g["id"] == GUILD), {}) if reply["status"] == 200 else None


def round_of(guild: dict | None) -> int | None:
    """The round whose complete roster the board shows (-1: no roster yet); None if torn."""
    if guild is None:
        return UNANSWERED
    roster = guild.get("roster")
    if roster is None:
        return -1
    tag = str(roster[0]).split("-")[0] if roster else ""
    return int(tag[1:]) if tag.startswith("r") and tag[1:].isdigit() and roster == members(tag) else None


async def keep_reading(nc: nats.NATS, shard: str, seen: list[int | None], stop: asyncio.Event) -> None:
    """Read the board until ``stop``; note the round each read shows, in order."""
    while not stop.is_set():
        seen.append(round_of(await read_guild(nc, shard)))


async def wait_for(nc: nats.NATS, shard: str, check) -> dict:
    """Read the board until ``check(guild)`` holds; the guild then."""
    async with asyncio.timeout(SETTLE_S):
        while (guild := await read_guild(nc, shard)) is None or not check(guild):
            await asyncio.sleep(0.01)
    return guild


@pytest.mark.timeout(150)
@pytest.mark.parametrize("drop_after", [2, 0], ids=["drop-mid-roster", "drop-after-chunk-0"])
async def test_a_roster_torn_by_a_reconnect_never_reaches_the_board(nats_url, tmp_path, unique, drop_after):
    shard_port = embedded.free_port()
    procs = ServiceProcesses(tmp_path, nats_url)
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    sim = ShardSimulator("127.0.0.1", shard_port, f"rr{unique}", TOKEN)
    seen: list[list[int | None]] = [[] for _ in range(READERS)]
    stop, readers, traffic = asyncio.Event(), [], None
    started = time.monotonic()
    try:
        traffic = await ShardTraffic.start(procs)
        procs.start("gateway", shard_token=TOKEN, shard_port=str(shard_port), silence_timeout_s="60")
        await sim.connect()
        await wait_commands_answered(nc, sim.shard)
        await sim.send("guild.update", id=GUILD, name="g-start")
        await wait_for(nc, sim.shard, lambda g: g.get("name") == "g-start")
        readers = [asyncio.create_task(keep_reading(nc, sim.shard, mine, stop)) for mine in seen]
        last = (MEMBERS - 1) // CHUNK
        for r in range(ROUNDS):
            reads_before = [len(mine) for mine in seen]
            await send_chunks(sim, members(f"r{r}"), range(drop_after + 1))
            await sim.drop()  # mid-roster: the gateway must forget the partial
            await sim.connect()
            # The tail of another set, as if the dropped roster went on: with no start on this
            # connection it is ignored; carried over, it would complete a torn roster.
            await send_chunks(sim, members(f"x{r}"), range(drop_after + 1, last + 1))
            # A snapshot after the tail: board writes are in order, so once the board shows it,
            # whatever the tail did is on the board too — and the roster must be the previous one.
            await sim.send("guild.update", id=GUILD, name=f"g-{r}")
            guild = await wait_for(nc, sim.shard, lambda g, r=r: g.get("name") == f"g-{r}")
            assert round_of(guild) == r - 1, f"round {r}: after the drop the board shows {guild.get('roster')}"
            await send_chunks(sim, members(f"r{r}"), range(last + 1))
            await wait_for(nc, sim.shard, lambda g, r=r: round_of(g) == r)
            # Every reader made a whole read within the round (its second since the round began;
            # waited for, bounded): the reads span the drops rather than being found to afterwards.
            try:
                async with asyncio.timeout(SETTLE_S):
                    while any(len(mine) < before + 2 for mine, before in zip(seen, reads_before, strict=True)):
                        await asyncio.sleep(0.01)
            except TimeoutError:
                raise AssertionError(f"round {r}: reads by each reader within it "
                                     f"{[len(mine) - before for mine, before in zip(seen, reads_before, strict=True)]}"
                                     f" after {SETTLE_S} s") from None
        stop.set()
        await asyncio.wait_for(asyncio.gather(*readers), 10)
        final = round_of(await read_guild(nc, sim.shard))
        await traffic.finish(nc)
    finally:
        stop.set()
        await asyncio.gather(*readers, return_exceptions=True)
        await sim.close()
        await nc.close()
        if traffic:
            traffic.stop()
        procs.stop_all()

    reads = [r for mine in seen for r in mine]
    torn, unanswered = sum(r is None for r in reads), sum(r == UNANSWERED for r in reads)
    answered = [[r for r in mine if r is not None and r != UNANSWERED] for mine in seen]
    stale = sum(b < a for mine in answered for a, b in itertools.pairwise(mine))  # e.g. the roster gone again
    print(f"\nroster reconnect, drop after chunk {drop_after}: rounds {ROUNDS}, board reads {len(reads)}, "
          f"torn reads {torn}, stale reads (older than the one before) {stale}, unanswered {unanswered}, "
          f"rounds seen {len(set(reads) - {None, -1, UNANSWERED})}, final roster correct {final == ROUNDS - 1}, "
          f"{time.monotonic() - started:.1f} s; {traffic.line()}")
    assert torn == 0 and stale == 0 and unanswered == 0
    assert final == ROUNDS - 1
    traffic.check()
