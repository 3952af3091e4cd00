"""What the fault scenarios share: a simulated shard sending numbered frames at a steady rate
while a caller keeps sending it commands, and the tally of what was sent, acknowledged,
stored and answered — checked against what JetStream holds afterwards."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import nats
import nats.js.errors

from shared import subjects
from simulator.shard import ShardSimulator

TOKEN = "fault-token-0123456789abcdef"
"""The shard token of the gateways the fault tests start."""

KIND = "fault.tick"
"""The kind of every frame the shard sends (hello and answers are other kinds)."""


@dataclass
class Tally:
    """What a scenario did and saw."""

    sent: int = 0
    acknowledged: int = 0
    stored: int = 0
    lost: int = 0
    duplicated: int = 0
    commands_ok: int = 0
    commands_failed: int = 0
    ok_times: list[float] = field(default_factory=list)

    def longest_gap_after(self, moment: float) -> float:
        """Longest wait between answered commands from ``moment`` on (until the last one)."""
        times = [moment] + [t for t in self.ok_times if t >= moment]
        return max((b - a for a, b in itertools.pairwise(times)), default=float("inf"))

    def resumed_after(self, moment: float) -> float:
        """Seconds from ``moment`` to the first answered command after it."""
        return min((t - moment for t in self.ok_times if t >= moment), default=float("inf"))

    def line(self, scenario: str) -> str:
        return (f"{scenario}: sent {self.sent}, acknowledged {self.acknowledged}, stored {self.stored}, "
                f"lost {self.lost}, duplicated {self.duplicated}; commands answered {self.commands_ok}, "
                f"failed {self.commands_failed}")


async def send_frames(sim: ShardSimulator, tally: Tally, count: int, per_s: float) -> None:
    """Send ``count`` frames numbered ``i`` at ``per_s``; while the shard is between
    connections the frames are kept (unacknowledged) and resent when it says hello again —
    which a shard does only when ``sequenced`` (the optional acknowledgement, docs/gateway.md, "Frames")."""
    assert sim.sequenced, "only a sequenced shard keeps and resends what was not acknowledged"
    started = time.monotonic()
    for i in range(count):
        try:
            await sim.send(KIND, i=i)
        except ConnectionError:  # lost mid-write: the frame stays unacknowledged, resent later
            pass
        tally.sent += 1
        pause = started + (i + 1) / per_s - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)


async def follow(sim: ShardSimulator, ports: list[int], stop: asyncio.Event,
                 dials: Counter[str] | None = None) -> None:
    """The shard's reconnect loop until ``stop``: on a lost connection, dial the next port in
    ``ports`` (again, 0.1 s later, if nothing answers); each dial that connects is counted."""
    turn = ports.index(sim.port) if sim.port in ports else 0
    while not stop.is_set():
        await sim.disconnected.wait()
        if stop.is_set():
            return
        turn += 1
        sim.port = ports[turn % len(ports)]
        try:
            await sim.connect()
            if dials is not None:
                dials["again"] += 1
        except (OSError, TimeoutError):
            await asyncio.sleep(0.1)


async def keep_commanding(nc: nats.NATS, shard: str, tally: Tally, stop: asyncio.Event,
                          every_s: float = 0.05) -> None:
    """Send ``item.catalog`` to the shard until ``stop``; count answers and failures."""
    subject = subjects.command(shard, "item.catalog")
    while not stop.is_set():
        try:
            reply = json.loads((await nc.request(subject, b"{}", timeout=1.0)).data)
            if reply.get("status") == 200:
                tally.commands_ok += 1
                tally.ok_times.append(time.monotonic())
            else:
                tally.commands_failed += 1
        except Exception:  # timeout, no responders, reconnecting: the outage being measured
            tally.commands_failed += 1
        await asyncio.sleep(every_s)


async def wait_commands_answered(nc: nats.NATS, shard: str, timeout: float = 10.0) -> None:
    """Until a command to ``shard`` is answered (its gateway's subscription is in place)."""
    subject = subjects.command(shard, "item.catalog")
    async with asyncio.timeout(timeout):
        while True:
            try:
                if json.loads((await nc.request(subject, b"{}", timeout=1.0)).data).get("status") == 200:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.05)


async def count_stored(nc: nats.NATS, shard: str, tally: Tally, expect: int, timeout: float = 30.0,
                       stream: str = "SHARD_FRAMES") -> None:
    """Read back every ``KIND`` frame JetStream holds for ``shard``; fill stored/lost/duplicated."""
    async with asyncio.timeout(timeout):
        while True:  # right after a node is lost, JetStream may still be electing leaders
            try:
                sub = await nc.jetstream().subscribe(subjects.frame(shard, KIND), stream=stream,
                                                     ordered_consumer=True)
                break
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError,
                    nats.js.errors.APIError):
                await asyncio.sleep(0.2)
    numbers: list[int] = []
    try:
        async with asyncio.timeout(timeout):
            while len(numbers) < expect:
                numbers.append(json.loads((await sub.next_msg(timeout=timeout)).data)["i"])
        while True:  # anything beyond what was sent would be a duplicate
            try:
                numbers.append(json.loads((await sub.next_msg(timeout=0.5)).data)["i"])
            except Exception:
                break
    except TimeoutError:
        pass  # fewer than expected: counted as lost below
    finally:
        await sub.unsubscribe()
    tally.stored = len(set(numbers))
    tally.duplicated = len(numbers) - len(set(numbers))
    tally.lost = len(set(range(expect)) - set(numbers))


async def finish_and_count(nc: nats.NATS, sim: ShardSimulator, tally: Tally, sender: asyncio.Task,
                           commander: asyncio.Task, stop: asyncio.Event, expect: int,
                           ack_timeout: float = 30.0) -> None:
    """End a scenario the same way every time: let the shard finish sending and see every frame
    acknowledged, give the commands a last second, then count what the stream holds."""
    await asyncio.wait_for(sender, 60)
    await sim.wait_acked(timeout=ack_timeout)
    await asyncio.sleep(1.0)  # a last second of commands after the frames
    stop.set()
    await asyncio.wait_for(commander, 10)
    tally.acknowledged = tally.sent - len(sim.unacked)
    await count_stored(nc, sim.shard, tally, expect)
