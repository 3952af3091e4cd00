"""Many shards at once, for ``bench/gateway.py``'s many-shards phase: N shard connections (split
over one or more gateway ports) each saying the hello (``server.hello`` with ``shard``,
``protocol`` 7 and ``token``: docs/gateway.md, "Wire"), then sending frames at R per second each for S seconds,
from this process alone, so the load costs the gateway's process nothing.

Frames are spread evenly in time: one clock ticks every millisecond and writes the frames due
in that millisecond, each shard at its own phase (a thousand timers would cost more than the
frames). Every ``--sample-every``-th frame of a shard is ``bench.sample`` carrying
``ns`` (CLOCK_MONOTONIC, shared by every process of this machine), which the bench subscribes
to for the latency; the others are ``bench.many``. Whatever the gateway writes back (pings,
acks) is read and dropped.

Prints ``connected N`` once every hello is out, then, after the load, one JSON line:
``{"sent": …, "samples": …, "late_ticks": …, "closed": …, "cpu_s": …}`` (``closed``:
connections the gateway closed meanwhile; ``cpu_s``: this process's CPU while sending).
``--seq`` numbers each shard's frames with the seed's ``seq`` (so the gateway acknowledges each
and de-duplicates by it); ``--move K`` makes K shards of the first port reconnect to the second
port halfway (``"moved": {shard: [sent before the move, sent in all]}`` in the JSON line).
Bounded: it stops after ``--seconds`` and dials only the ports given on 127.0.0.1."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

PAD = b"x" * 60
"""Filler: a frame is about 120 bytes, like a small game event."""


async def _drain(reader: asyncio.StreamReader, closed: list[int]) -> None:
    try:
        while await reader.read(65536):
            pass
    except (ConnectionError, OSError):
        pass
    closed[0] += 1


async def _dial(port: int, shard: str, token: str, drains: list, closed: list[int]) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    hello = {"t": int(time.time() * 1000), "kind": "server.hello", "shard": shard, "protocol": 7, "token": token}
    writer.write(json.dumps(hello).encode() + b"\n")
    drains.append(asyncio.create_task(_drain(reader, closed)))
    return writer


async def run(ports: list[int], shards: int, rate: float, seconds: float, sample_every: int,
              prefix: str, token: str, seq: bool = False, move: int = 0) -> dict:
    writers: list[asyncio.StreamWriter] = []
    closed = [0]
    drains = []
    for i in range(shards):
        writers.append(await _dial(ports[i % len(ports)], f"{prefix}{i}", token, drains, closed))
        if i % 50 == 49:
            await asyncio.sleep(0.02)  # a ramp: the gateway takes each hello in turn
    print(f"connected {shards}", flush=True)
    await asyncio.sleep(1.0)

    period_ns = int(1e9 / rate)
    # Shard i sends at phase (i * period / shards): the frames of all shards are spread evenly.
    phase = [i * period_ns // shards for i in range(shards)]
    counts = [0] * shards
    sent = samples = late = 0
    cpu_start = time.process_time()
    start = time.monotonic_ns()
    end = start + int(seconds * 1e9)
    tick = 1_000_000
    next_tick = start
    due_index = 0  # shards sorted by phase: sending in order within each period
    period_no = 0
    # --move: halfway, the first K shards of the first port close and say hello to the second
    # port's gateway (a shard reconnecting elsewhere), then go on sending.
    moved: dict[str, int] = {}
    moving = [i for i in range(shards) if i % len(ports) == 0][:move] if len(ports) > 1 else []
    move_at = start + int(seconds * 1e9) // 2
    tail = b',"seq":%d}\n' if seq else b"}\n"
    while True:
        now = time.monotonic_ns()
        if now >= end:
            break
        if moving and now >= move_at:
            for i in moving:
                writers[i].close()
                writers[i] = await _dial(ports[1], f"{prefix}{i}", token, drains, closed)
            moved = {f"{prefix}{i}": counts[i] for i in moving}
            moving = []
        horizon = now - start
        # Every shard whose next send time has come.
        while start + period_no * period_ns + phase[due_index] <= now:
            i = due_index
            counts[i] += 1
            n = counts[i]
            if n % sample_every == 0:
                line = b'{"t":%d,"kind":"bench.sample","ns":%d,"i":%d,"pad":"%s"' % (
                    horizon // 1_000_000, time.monotonic_ns(), n, PAD)
                samples += 1
            else:
                line = b'{"t":%d,"kind":"bench.many","i":%d,"pad":"%s"' % (horizon // 1_000_000, n, PAD)
            line += tail % n if seq else tail
            writer = writers[i]
            if not writer.is_closing():
                writer.write(line)
                sent += 1
            due_index += 1
            if due_index == shards:
                due_index, period_no = 0, period_no + 1
        next_tick += tick
        delay = next_tick - time.monotonic_ns()
        if delay > 0:
            await asyncio.sleep(delay / 1e9)
        else:
            late += 1
            next_tick = time.monotonic_ns()
            await asyncio.sleep(0)
    cpu_s = round(time.process_time() - cpu_start, 2)
    await asyncio.sleep(0.5)
    for writer in writers:
        writer.close()
    for task in drains:
        task.cancel()
    result = {"sent": sent, "samples": samples, "late_ticks": late, "closed": closed[0], "cpu_s": cpu_s}
    if move and len(ports) > 1:
        # Each moved shard: frames sent before the move, and in all (numbered 1..n: "i", and "seq").
        result["moved"] = {name: [before, counts[int(name[len(prefix):])]] for name, before in moved.items()}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ports", required=True, help="gateway shard ports on 127.0.0.1, comma-separated")
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0, help="frames per second per shard")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--prefix", default="many")
    parser.add_argument("--token", required=True)
    parser.add_argument("--seq", action="store_true", help="frames carry the seed's seq (acknowledged)")
    parser.add_argument("--move", type=int, default=0,
                        help="halfway, this many shards of the first port reconnect to the second")
    args = parser.parse_args()
    if not 1 <= args.shards <= 5000 or not 0 < args.rate <= 1000 or not 0 < args.seconds <= 600:
        parser.error("--shards 1..5000, --rate up to 1000, --seconds up to 600")
    ports = [int(p) for p in args.ports.split(",")]
    result = asyncio.run(run(ports, args.shards, args.rate, args.seconds, args.sample_every, args.prefix,
                             args.token, args.seq, args.move))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
