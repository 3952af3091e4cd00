"""Background traffic for the fault scenarios (issue 29, item 2): many simulated shards, each
sending numbered frames at a steady rate through a gateway of their own, for as long as a
scenario runs; afterwards every shard's numbers are read back from ``SHARD_FRAMES``: none may be
missing and none there twice, whatever the scenario killed or restarted meanwhile.

The shards are :class:`~simulator.shard.ShardSimulator` (the seed's hello, pings, frames),
``sequenced`` (the optional acknowledgement, docs/gateway.md, "Frames": a frame is kept until the gateway's
``frame.ack`` and resent after a reconnect), in a process of their own
(``python -m tests.faults.shard_traffic``) so that they cost the scenario's event loop nothing.
That process prints ``connected N`` once every shard said hello, sends until its standard input
closes, waits for every frame to be acknowledged, and prints one JSON line: what each shard
sent, what stayed unacknowledged, and how often a shard dialled again."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import nats

from shardbus import embedded
from simulator.shard import ShardSimulator
from tests.faults.harness import TOKEN, follow
from tests.processes import ServiceProcess, ServiceProcesses

SHARDS, RATE = 200, 20.0
"""The issue's load: 200 shards at 20 frames a second each (4,000 frames a second)."""

CONNECT_WITHIN_S = 60.0
ACK_WITHIN_S = 60.0
"""Longest wait for every shard's hello, and for every frame's acknowledgement once sending stops."""

CATCH_UP_S = 1.0
"""A sender held up longer than this (back-pressure) skips ahead rather than bursting."""


# --- the traffic process --------------------------------------------------------------------


async def _send(sim: ShardSimulator, kind: str, rate: float, offset: float, stop: asyncio.Event,
                sent: Counter[str]) -> None:
    await asyncio.sleep(offset)  # shards spread over the period, not all at once
    start, n = time.monotonic(), 0
    while not stop.is_set():
        try:
            await sim.send(kind, i=n)
        except ConnectionError:  # lost mid-write: kept unacknowledged, resent after the next hello
            pass
        n += 1
        sent[sim.shard] = n
        pause = start + n / rate - time.monotonic()
        if pause < -CATCH_UP_S:
            start = time.monotonic() - n / rate
        elif pause > 0:
            await asyncio.sleep(pause)


async def _run(ports: list[int], shards: int, rate: float, prefix: str, kind: str, token: str) -> dict:
    sims = [ShardSimulator("127.0.0.1", ports[i % len(ports)], f"{prefix}{i}", token, sequenced=True)
            for i in range(shards)]
    for i, sim in enumerate(sims):
        await sim.connect()
        if i % 50 == 49:
            await asyncio.sleep(0.02)  # a ramp: the gateway takes each hello in turn
    print(f"connected {shards}", flush=True)
    loop, stop, done = asyncio.get_running_loop(), asyncio.Event(), asyncio.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()
    sent: Counter[str] = Counter()
    dials: Counter[str] = Counter()
    followers = [asyncio.create_task(follow(sim, ports, done, dials)) for sim in sims]
    began = time.monotonic()
    senders = [asyncio.create_task(_send(sim, kind, rate, i / shards / rate, stop, sent))
               for i, sim in enumerate(sims)]
    await asyncio.gather(*senders)
    seconds = time.monotonic() - began
    deadline = time.monotonic() + ACK_WITHIN_S
    for sim in sims:
        try:
            await sim.wait_acked(timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            pass
    done.set()
    for sim in sims:
        sim.disconnected.set()
    await asyncio.gather(*followers, return_exceptions=True)
    report = {"sent": dict(sent), "seconds": round(seconds, 2), "unacked": sum(len(sim.unacked) for sim in sims),
              "dialled_again": dials["again"]}
    await asyncio.gather(*(sim.close() for sim in sims), return_exceptions=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ports", required=True, help="gateway ports on 127.0.0.1, comma-separated")
    parser.add_argument("--shards", type=int, default=SHARDS)
    parser.add_argument("--rate", type=float, default=RATE)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--token", default=TOKEN)
    args = parser.parse_args()
    ports = [int(p) for p in args.ports.split(",")]
    report = asyncio.run(_run(ports, args.shards, args.rate, args.prefix, args.kind, args.token))
    print(json.dumps(report), flush=True)


# --- the scenario's handle ------------------------------------------------------------------


@dataclass
class ShardTraffic:
    """The traffic of one scenario: its gateway, its process, and afterwards what was counted."""

    gateway: ServiceProcess
    proc: subprocess.Popen[str]
    prefix: str
    kind: str
    report: dict = field(default_factory=dict)
    stored: int = 0
    lost: int = 0
    duplicated: int = 0

    @classmethod
    async def start(cls, procs: ServiceProcesses, shards: int = SHARDS, rate: float = RATE,
                    **gateway_settings: str) -> ShardTraffic:
        """A gateway of the traffic's own on ``procs``' NATS (stopped with ``procs``), then the
        shards dialling it; returns once every shard said hello."""
        tag = uuid.uuid4().hex[:8]
        port = embedded.free_port()
        gateway = procs.start("gateway", shard_token=TOKEN, shard_port=str(port), publish_ack_timeout_s="1",
                              silence_timeout_s="60", **gateway_settings)
        proc = subprocess.Popen([sys.executable, "-m", "tests.faults.shard_traffic", "--ports", str(port),
                                 "--shards", str(shards), "--rate", str(rate), "--prefix", f"bg{tag}-",
                                 "--kind", f"fault.load.{tag}"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        traffic = cls(gateway, proc, f"bg{tag}-", f"fault.load.{tag}")
        assert proc.stdout is not None
        try:  # the caller holds no handle until this returns: a failed start stops its own process
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), CONNECT_WITHIN_S)
            if line.strip() != f"connected {shards}":
                raise AssertionError(f"the background shards did not connect: {line!r}")
        except BaseException:
            traffic.stop()
            raise
        return traffic

    async def finish(self, nc: nats.NATS) -> None:
        """Stop sending, wait for the acknowledgements, then count what ``SHARD_FRAMES`` holds."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), ACK_WITHIN_S + 30)
        self.report = json.loads(line)
        self.proc.wait(10)
        await self._count(nc)

    async def _count(self, nc: nats.NATS) -> None:
        expect = sum(self.report["sent"].values())
        sub = await nc.jetstream().subscribe(f"shard.*.frame.{self.kind}", stream="SHARD_FRAMES",
                                             ordered_consumer=True)
        seen: Counter[tuple[str, int]] = Counter()
        read = 0
        try:
            async with asyncio.timeout(120):
                while read < expect:
                    msg = await sub.next_msg(timeout=10)
                    seen[(msg.subject.split(".")[1], json.loads(msg.data)["i"])] += 1
                    read += 1
            while True:  # anything beyond what was sent would be a duplicate
                msg = await sub.next_msg(timeout=0.5)
                seen[(msg.subject.split(".")[1], json.loads(msg.data)["i"])] += 1
        except (TimeoutError, nats.errors.TimeoutError):
            pass
        finally:
            await sub.unsubscribe()
        wanted = {(shard, i) for shard, count in self.report["sent"].items() for i in range(count)}
        self.stored = len(seen)
        self.duplicated = sum(n - 1 for n in seen.values())
        self.lost = len(wanted - set(seen))

    def line(self) -> str:
        sent = sum(self.report.get("sent", {}).values())
        rate = sent / self.report["seconds"] if self.report.get("seconds") else 0.0
        return (f"background: {len(self.report.get('sent', {}))} shards sent {sent} frames in "
                f"{self.report.get('seconds')} s ({rate:.0f}/s), stored {self.stored}, "
                f"lost {self.lost}, duplicated {self.duplicated}, unacknowledged {self.report.get('unacked')}, "
                f"dialled again {self.report.get('dialled_again')}")

    def check(self, shards: int = SHARDS) -> None:
        assert len(self.report["sent"]) == shards, self.line()
        assert self.report["unacked"] == 0, self.line()
        assert self.lost == 0 and self.duplicated == 0, self.line()
        assert self.stored == sum(self.report["sent"].values()), self.line()

    def stop(self) -> None:
        """Stop the shards' process (the gateway goes with the scenario's ``procs``)."""
        embedded.stop_process(self.proc, timeout=10.0)


if __name__ == "__main__":
    main()
