"""Benchmark: the web door's live feed to 100 WebSocket clients, beside 100 plain nats-py
subscribers on the same subjects, in the same run.

Frames are published to the frames stream (JetStream, acknowledged in a window, as the gateway
does) as fast as one publisher can; the clock runs from the first publish until every client
holds every frame. Two phases, one after the other:

1. feed: ``clients`` WebSocket clients of ``GET /ws?types=frame&shards=<shard>`` on a real
   ``shardbus run web`` process (its feed stream sources the frames stream), each counting
   its frames (client 0 also checks their order, once each);
2. raw: ``clients`` nats-py connections, each subscribed to ``shard.<shard>.frame.>``.

Since the feed's fan-out, the 100 clients share one consumer (services/web/feed/fanout.py).

The two phases alternate for ``rounds`` rounds (at least 3); the figures are the medians:
frames/s delivered in total and per client for each, and ``feed_ratio``, the median of the
rounds' feed / raw (``feed_ratios_each_round`` lists them).
The clients run in this process (both phases alike), so on two cores they compete with the
door and nats-server: the ratio compares like with like, the absolute rates are the machine's.

Run alone: ``python bench/web_feed.py [--clients N] [--frames N]`` (starts its own nats-server
and door); writes ``bench/results/web_feed.json``. bench/web.py calls :func:`feed_throughput`
with its own servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError
from websockets.asyncio.client import connect

from shardbus import embedded
from shared import subjects

TOKEN = "bench-feed-token-0000"
"""The website token of the door this benchmark starts."""

PAD = "x" * 60
"""Filler so a frame is about 120 bytes, like a small game event (as bench/gateway.py)."""

WINDOW = 256
"""JetStream acknowledgements in flight while publishing."""

TIMEOUT_S = 300.0
"""Longest a phase may take."""


def frame_line(i: int) -> bytes:
    return b'{"t":%d,"kind":"bench.feed","i":%d,"pad":"%s"}' % (int(time.time() * 1000), i, PAD.encode())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_door(workdir: Path, nats_url: str, port: int, token: str) -> subprocess.Popen:
    """A real door process (``shardbus run web``); returns once ``GET /health`` answers."""
    log_path = workdir / "web-feed.log"
    env = {**os.environ, "SHARDBUS_NATS_URL": nats_url, "SHARDBUS_WEB_TOKEN": token,
           "SHARDBUS_WEB_PORT": str(port), "SHARDBUS_LOG_LEVEL": "WARNING"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "shardbus", "run", "web"], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    embedded.stop_process(proc)
    raise RuntimeError(f"web did not start:\n{log_path.read_text()[-2000:]}")


async def publish(nc: nats.NATS, subject: str, frames: int) -> None:
    """Every frame to JetStream, acknowledged in a window (the gateway's way)."""
    js = nc.jetstream(publish_async_max_pending=WINDOW)
    for i in range(frames):
        await js.publish_async(subject, frame_line(i))
    await js.publish_async_completed()


async def feed_phase(nats_url: str, web_port: int, token: str, clients: int, frames: int) -> float:
    """Seconds from the first publish until every WebSocket client holds every frame."""
    shard = f"feed{uuid.uuid4().hex[:8]}"
    url = f"ws://127.0.0.1:{web_port}/ws?" + urlencode({"token": token, "types": "frame", "shards": shard})
    sockets = []
    for _ in range(clients):  # one at a time, as browsers arrive
        ws = await connect(url, open_timeout=30, max_size=None)
        hello = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert hello["type"] == "hello", hello
        sockets.append(ws)

    async def take(index: int, ws: Any) -> None:
        got = 0
        while got < frames:
            text = await ws.recv()
            if index == 0:  # one client checks the order and that nothing is missing or repeated
                event = json.loads(text)
                assert event["data"]["i"] == got, (event["data"]["i"], got)
            got += 1

    nc = await nats.connect(nats_url)
    try:
        started = time.perf_counter()
        takers = [asyncio.create_task(take(i, ws)) for i, ws in enumerate(sockets)]
        await publish(nc, subjects.frame(shard, "bench.feed"), frames)
        await asyncio.wait_for(asyncio.gather(*takers), TIMEOUT_S)
        return time.perf_counter() - started
    finally:
        await nc.close()
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)


async def raw_phase(nats_url: str, clients: int, frames: int) -> float:
    """Seconds from the first publish until every nats-py subscriber holds every frame."""
    shard = f"raw{uuid.uuid4().hex[:8]}"
    counts = [0] * clients
    done = asyncio.Event()
    finished = [0]
    conns = []
    for index in range(clients):
        sub_nc = await nats.connect(nats_url)

        async def on_msg(_msg: Any, index: int = index) -> None:
            counts[index] += 1
            if counts[index] == frames:
                finished[0] += 1
                if finished[0] == clients:
                    done.set()

        await sub_nc.subscribe(subjects.frame(shard, ">"), cb=on_msg)
        await sub_nc.flush()
        conns.append(sub_nc)
    await asyncio.sleep(0.1)  # interest seen by the server (tests/gateway/conftest.py)
    nc = await nats.connect(nats_url)
    try:
        started = time.perf_counter()
        await publish(nc, subjects.frame(shard, "bench.feed"), frames)
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
        return time.perf_counter() - started
    finally:
        await nc.close()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


async def feed_throughput(clients: int = 100, frames: int = 2000, nats_url: str | None = None,
                          web_port: int | None = None, token: str = TOKEN, rounds: int = 3) -> dict[str, Any]:
    """The feed's throughput to ``clients`` WebSocket clients beside as many nats-py
    subscribers. Without ``nats_url`` / ``web_port`` it starts its own nats-server and door."""
    with tempfile.TemporaryDirectory(prefix="bench-web-feed-") as tmp:
        workdir = Path(tmp)
        server = embedded.start_nats(workdir / "nats") if nats_url is None else None
        url = nats_url or server.url
        door = None
        try:
            nc = await nats.connect(url)
            try:  # the gateway's frames stream (the door's feed sources it)
                await nc.jetstream().add_stream(StreamConfig(name="SHARD_FRAMES", subjects=[subjects.FRAMES_WILDCARD]))
            except BadRequestError:
                pass  # it exists (a gateway made it)
            finally:
                await nc.close()
            if web_port is None:
                web_port = free_port()
                door = start_door(workdir, url, web_port, token)
            feed_runs: list[float] = []
            raw_runs: list[float] = []
            for _round in range(rounds):  # interleaved, so a noisy moment hits both
                feed_runs.append(await feed_phase(url, web_port, token, clients, frames))
                raw_runs.append(await raw_phase(url, clients, frames))
        finally:
            if door is not None:
                embedded.stop_process(door)
            if server is not None:
                server.stop()
    ratios = [r / f for f, r in zip(feed_runs, raw_runs, strict=True)]
    feed_s, raw_s = statistics.median(feed_runs), statistics.median(raw_runs)
    feed_rate, raw_rate = frames / feed_s, frames / raw_s
    return {"rounds": rounds, "feed_ratios_each_round": [round(r, 3) for r in ratios], "clients": clients,
            "frames": frames, "frame_bytes": len(frame_line(0)),
            "feed_frames_per_s_total": round(feed_rate * clients, 1),
            "feed_frames_per_s_per_client": round(feed_rate, 1),
            "raw_frames_per_s_total": round(raw_rate * clients, 1),
            "raw_frames_per_s_per_client": round(raw_rate, 1),
            "feed_ratio": round(statistics.median(ratios), 3),
            "feed_seconds": round(feed_s, 3), "raw_seconds": round(raw_s, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=100, help="WebSocket clients (and raw subscribers)")
    parser.add_argument("--frames", type=int, default=2000, help="frames published per phase")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, at least 3 (the median is kept)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3")
    results = asyncio.run(feed_throughput(args.clients, args.frames, rounds=args.rounds))
    print(f"feed: {results['feed_frames_per_s_total']:10.0f} frames/s delivered "
          f"({results['feed_frames_per_s_per_client']:.0f} per client)")
    print(f"raw:  {results['raw_frames_per_s_total']:10.0f} frames/s delivered "
          f"({results['raw_frames_per_s_per_client']:.0f} per client)  feed/raw {results['feed_ratio']:.2f}")
    out = ROOT / "bench" / "results" / "web_feed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
