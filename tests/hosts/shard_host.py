"""A shard host (run inside its own namespace by tests/hosts): careful shards that number their
frames (``seq``), keep each until the gateway's ``frame.ack`` and resend what was not
acknowledged after every reconnect (the simulator's ``sequenced=True``, docs/gateway.md, "What a
shard may rely on"). Each sends ``--rate`` frames a second for ``--seconds``, then waits until all
are acknowledged (at most ``--drain-seconds``), and writes its history as JSON to ``--out``:
per shard every ``seq`` sent, every ``frame.ack`` received (in order) and what is still
unacknowledged. ``--progress`` is rewritten twice a second with the acknowledgements so far, so
the test can wait for frames to flow before it cuts a link; each shard's ``done`` turns true once
its drain is over. With ``--linger-until`` the shards then stay connected (answering commands)
until that file exists, at most ``--linger-seconds``. ``--gateway`` may list several gateways:
shard ``i`` dials the ``i``-th (round the list), and a shard whose dial fails, or that has heard
nothing from its gateway (no ping, no ack) for ``--silence-seconds``, drops the link and dials the
next, as docs/gateway.md ("What a shard may rely on") tells a shard to. With ``--tls-ca`` every shard dials
TLS, verifying the gateway's certificate (and its address) against that CA (docs/gateway.md, "TLS").

    python -m tests.hosts.shard_host --gateway 10.231.7.14:2593 --token T --shards 3 --out h.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from shared.tls import client_context_or_none
from simulator.shard import ShardSimulator

KIND = "hosts.tick"
"""The kind of every frame the shard host sends (a frame with no board: only the stream)."""


class RecordingShard(ShardSimulator):
    """The simulator, recording every ``frame.ack`` it receives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[int] = []
        self.acks: list[int] = []
        self.reconnects = 0
        self.done = False
        self.addresses: list[tuple[str, int]] = [(self.host, self.port)]
        self.silence_s = 0.0
        """Heard nothing for this long (0: never judged): the link is dropped, the next gateway dialled."""
        self.last_heard = 0.0
        self.moves: list[str] = []
        """Each move to another gateway: ``"<address> after <why>"``."""

    def _dispatch(self, message: dict[str, Any]) -> None:
        self.last_heard = time.monotonic()
        if message.get("kind") == "frame.ack" and isinstance(message.get("seq"), int):
            self.acks.append(message["seq"])
        super()._dispatch(message)


def move_on(sim: RecordingShard, why: str) -> None:
    """Dial the next gateway of the list from now on (the same one when there is only one)."""
    if len(sim.addresses) > 1:
        k = sim.addresses.index((sim.host, sim.port))
        sim.host, sim.port = sim.addresses[(k + 1) % len(sim.addresses)]
        sim.moves.append(f"{sim.host}:{sim.port} after {why}")


async def ensure_connected(sim: RecordingShard, first: bool = False) -> None:
    """Dial until connected (the simulator resends every unacknowledged frame on connect); a link
    silent for ``sim.silence_s`` is dropped first, and a failed dial moves to the next gateway."""
    if sim.silence_s and sim.connected and time.monotonic() - sim.last_heard > sim.silence_s:
        await sim.drop()  # the frames not acknowledged are kept, and resent on the next link
        move_on(sim, f"{sim.silence_s} s of silence")
    while not sim.connected or sim.disconnected.is_set():
        if sim.disconnected.is_set():
            await sim.drop()  # the gateway ended the link: the frames not acknowledged are kept
        try:
            await sim.connect(timeout=2.0)
            sim.last_heard = time.monotonic()
            if not first:
                sim.reconnects += 1
        except (OSError, TimeoutError):
            move_on(sim, "a failed dial")
            await asyncio.sleep(0.3)


async def run_shard(sim: RecordingShard, rate: float, seconds: float, drain_s: float, linger_until: Path | None,
                    linger_s: float) -> None:
    await ensure_connected(sim, first=True)
    loop = asyncio.get_running_loop()
    start = loop.time()
    n = 0
    while loop.time() - start < seconds:
        await ensure_connected(sim)
        seq = sim.next_seq
        try:
            await sim.send(KIND, n=n)
        except (ConnectionError, OSError):
            pass  # kept as unacknowledged: resent after the reconnect
        sim.sent.append(seq)
        n += 1
        # Paced against the clock: a shard held back (back-pressure) sends what it owes later.
        await asyncio.sleep(max(0.0, start + n / rate - loop.time()))
    deadline = loop.time() + drain_s
    while sim.unacked and loop.time() < deadline:
        await ensure_connected(sim)
        await asyncio.sleep(0.1)
    sim.done = True
    deadline = loop.time() + linger_s
    while linger_until is not None and not linger_until.exists() and loop.time() < deadline:
        await ensure_connected(sim)  # still answering the website's commands
        await asyncio.sleep(0.1)


async def write_progress(path: Path, sims: list[RecordingShard]) -> None:
    while True:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({s.shard: {"sent": len(s.sent), "acked": len(s.acks), "unacked": len(s.unacked),
                                             "done": s.done} for s in sims}))
        os.replace(tmp, path)
        await asyncio.sleep(0.5)


async def main(args: argparse.Namespace) -> None:
    addresses = [(host, int(port)) for host, port in (a.rsplit(":", 1) for a in args.gateway.split(","))]
    tls = client_context_or_none(args.tls_ca)
    sims = [RecordingShard(*addresses[i % len(addresses)], f"{args.prefix}{i}", args.token, sequenced=True, tls=tls)
            for i in range(args.shards)]
    for sim in sims:
        sim.addresses, sim.silence_s = addresses, args.silence_seconds
    progress = asyncio.create_task(write_progress(Path(args.progress), sims)) if args.progress else None
    started = time.time()
    try:
        linger = Path(args.linger_until) if args.linger_until else None
        await asyncio.gather(*(run_shard(s, args.rate, args.seconds, args.drain_seconds, linger, args.linger_seconds)
                               for s in sims))
    finally:
        if progress is not None:
            progress.cancel()
        history = {s.shard: {"sent": s.sent, "acks": s.acks, "unacked": sorted(s.unacked),
                             "reconnects": s.reconnects, "moves": s.moves} for s in sims}
        Path(args.out).write_text(json.dumps({"started": started, "ended": time.time(), "shards": history}))
        await asyncio.gather(*(s.close() for s in sims), return_exceptions=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", required=True,
                        help="host:port of the gateway's shard listener (comma-separated: several gateways)")
    parser.add_argument("--silence-seconds", type=float, default=0.0,
                        help="drop a link that said nothing for this long and dial the next gateway (0: never)")
    parser.add_argument("--token", required=True)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--prefix", default="h")
    parser.add_argument("--rate", type=float, default=50.0, help="frames a second per shard")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--drain-seconds", type=float, default=120.0)
    parser.add_argument("--linger-until", default="", help="once drained, stay connected until this file exists")
    parser.add_argument("--linger-seconds", type=float, default=120.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--progress", default="")
    parser.add_argument("--tls-ca", default="", help="dial TLS, verifying the gateway with this CA file (PEM)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
